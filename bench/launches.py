"""Our launcher and the peer's, started as their users start them, each under an identity of its own.

* :meth:`Runner.start` spawns one launcher process: ours is ``kfp-trainer launch``, with a
  kubeconfig (a laptop) or, ``logs="pod"``, as in a KFP step: the API server's address in the
  environment and the service account's token and CA in files, no kubeconfig (the token and CA
  are put in a folder of their own here, where a pod has them in
  ``/var/run/secrets/kubernetes.io/serviceaccount``); the peer's is :mod:`bench.peer_driver`
  ``launch`` (TrainerClient.train + wait_for_job_status, with get_job_logs(follow=True) when logs
  are on). Both create a TrainJob on the
  ``torch-distributed`` runtime whose trainer pod runs the given pod script.
* :meth:`Runner.finish` waits for it and notes when it said it returned.
* :meth:`Runner.many` runs ``n`` launchers at once, as threads of a few worker processes
  (:mod:`bench.ours_driver`, :mod:`bench.peer_driver` ``many``).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from bench.env import REPO, Identities
from bench.procs import Proc, python_env

SIDES = ("ours", "sdk")
# ``kfp-trainer launch`` as in a pod: its service account's files read from the folder given first.
IN_POD = (
    "import pathlib, sys\n"
    "import kfp_trainer.backends.kube.credentials as credentials\n"
    "credentials.SA_DIR = pathlib.Path(sys.argv.pop(1))\n"
    "from kfp_trainer.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@dataclass
class Launch:
    """One launcher run: when it was spawned, when it said it returned, which job it ran."""

    side: str
    logs: str
    identity: str
    namespace: str
    spawned: float
    returned: float | None = None
    exited: float = 0.0
    code: int | None = None
    job: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def pod_script(lines: list[str], line_delay: float, exit_delay: float | None = None) -> dict[str, str]:
    """The annotations that make a trainer pod print ``lines`` and exit 0."""
    sys.path.insert(0, str(REPO / "hack" / "k8s"))
    from testcluster import PodScript

    return PodScript(lines=lines, line_delay=line_delay, exit_delay=exit_delay).annotations()


class Runner:
    """Starts launchers of either side under fresh identities."""

    def __init__(self, identities: Identities, workdir: Path, peer_python: Path) -> None:
        self.identities = identities
        self.workdir = workdir
        self.peer_python = peer_python
        self.logs_dir = workdir / "launcher-logs"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        ours = Path(sys.executable).parent / "kfp-trainer"
        self.ours = [str(ours)] if ours.exists() else [sys.executable, "-m", "kfp_trainer.cli"]

    def ours_cmd(self, kubeconfig: Path, namespace: str, run_id: str, annotations: dict[str, str], logs: str) -> list[str]:
        return [
            *self.ours, "launch", "--kubeconfig", str(kubeconfig), "--namespace", namespace, "--runtime", "torch-distributed",
            "--image", "python:3.11", "--run-id", run_id, "--task-name", "train", "--pod-annotations", json.dumps(annotations),
            "--logs", logs,
        ]  # fmt: skip

    def sdk_cmd(self, kubeconfig: Path, namespace: str, annotations: dict[str, str], logs: str) -> list[str]:
        driver = str(REPO / "bench" / "peer_driver.py")
        return [str(self.peer_python), driver, "launch", str(kubeconfig), namespace, logs, json.dumps(annotations)]

    def in_pod(self, kubeconfig: Path, namespace: str) -> tuple[Path, dict[str, str]]:
        """The service account files a pod of the identity would have (token, CA, namespace) and the environment it gets."""
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        folder = self.workdir / "serviceaccounts" / kubeconfig.stem
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(user["token"])
        if cluster.get("certificate-authority-data"):
            (folder / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            (folder / "ca.crt").write_bytes((kubeconfig.parent / cluster["certificate-authority"]).read_bytes())
        (folder / "namespace").write_text(namespace)
        server = urlparse(cluster["server"])
        return folder, {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port or 443)}

    def start(
        self, side: str, logs: str, identity: str, namespace: str, annotations: dict[str, str], run_id: str = ""
    ) -> tuple[Launch, Proc]:
        """Spawn one launcher (a new identity named ``identity``); ``logs="pod"``: ours as in a pod, following node 0's log."""
        kubeconfig = self.identities.make(identity)
        extra: dict[str, str] = {}
        if side == "ours" and logs == "pod":
            folder, extra = self.in_pod(kubeconfig, namespace)
            cmd = self.ours_cmd(kubeconfig, namespace, run_id or f"bench-{identity}", annotations, "0")
            cmd = [sys.executable, "-c", IN_POD, str(folder), *cmd[len(self.ours) :]]
            del cmd[cmd.index("--kubeconfig") : cmd.index("--kubeconfig") + 2]
        elif side == "ours":
            cmd = self.ours_cmd(kubeconfig, namespace, run_id or f"bench-{identity}", annotations, logs)
        else:
            cmd = self.sdk_cmd(kubeconfig, namespace, annotations, logs)
        proc = Proc(cmd, env=python_env(extra), stderr=self.logs_dir / f"{identity}.stderr", cwd=REPO)
        return Launch(side, logs, identity, namespace, proc.spawned), proc

    def finish(self, launch: Launch, proc: Proc, timeout: float) -> Launch:
        """Wait for the launcher; note when it returned and its job's name."""
        try:
            launch.code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            launch.error = f"did not return within {timeout:.0f}s"
            launch.code = None
        launch.exited = proc.ended or time.time()
        launch.extra["cpu_s"] = proc.cpu_s
        (self.logs_dir / f"{launch.identity}.stdout").write_bytes(proc.output[-200_000:])
        if launch.side == "ours":
            launch.returned = proc.line_time(b'{"trainjob"')
            for line in reversed(proc.lines()):
                if line.startswith('{"trainjob"'):
                    launch.job = json.loads(line)["trainjob"].split("/", 1)[1]
                    break
        else:
            launch.returned = proc.line_time(b"BENCH done ")
            for line in proc.lines():
                if line.startswith(("BENCH created ", "BENCH done ")):
                    launch.job = line.split()[2]
        if launch.code != 0 and not launch.error:
            tail = (self.logs_dir / f"{launch.identity}.stderr").read_text(errors="replace")[-400:]
            launch.error = f"exit code {launch.code}: {tail.strip()}"
        return launch

    def run(self, side: str, logs: str, identity: str, namespace: str, annotations: dict[str, str], timeout: float) -> Launch:
        """:meth:`start`, then :meth:`finish`."""
        launch, proc = self.start(side, logs, identity, namespace, annotations)
        return self.finish(launch, proc, timeout)

    def many(self, side: str, logs: str, n: int, prefix: str, namespace: str, annotations: dict[str, str], *, workers: int,
             timeout: float) -> tuple[list[Launch], float, float]:  # fmt: skip
        """``n`` launchers at once (threads of ``workers`` processes). Returns them, the start and the end time."""
        names = [f"{prefix}-{i}" for i in range(n)]
        kubeconfigs = {name: str(path) for name, path in self.identities.many(names).items()}
        groups = [names[i::workers] for i in range(min(workers, n))]
        procs = []
        started = time.time()
        for k, group in enumerate(groups):
            spec = self.workdir / f"{prefix}-worker-{k}.json"
            spec.write_text(json.dumps({"namespace": namespace, "logs": logs, "annotations": annotations,
                                        "kubeconfigs": {g: kubeconfigs[g] for g in group}}))  # fmt: skip
            if side == "ours":
                cmd = [sys.executable, "-m", "bench.ours_driver", str(spec)]
            else:
                cmd = [str(self.peer_python), str(REPO / "bench" / "peer_driver.py"), "many", str(spec)]
            procs.append(Proc(cmd, env=python_env(), stderr=self.logs_dir / f"{prefix}-worker-{k}.stderr", cwd=REPO))
        launches = {name: Launch(side, logs, name, namespace, started) for name in names}
        deadline = time.monotonic() + timeout
        for k, proc in enumerate(procs):
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for name in groups[k]:
                    launches[name].error = launches[name].error or f"worker did not finish within {timeout:.0f}s"
            for line in proc.lines():
                parts = line.split(" ", 5)
                if line.startswith("BENCH done ") and len(parts) >= 5 and parts[2] in launches:
                    launch = launches[parts[2]]
                    launch.job, launch.returned, launch.code = parts[3], float(parts[4]), 0
                elif line.startswith("BENCH failed ") and len(parts) >= 3 and parts[2] in launches:
                    launches[parts[2]].error = line.split(" ", 3)[-1]
        ended = time.time()
        for launch in launches.values():
            launch.exited = ended
            if launch.returned is None and not launch.error:
                launch.error = "no result (worker crashed?)"
        return list(launches.values()), started, ended
