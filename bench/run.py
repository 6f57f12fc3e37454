"""``make bench``: kfp-trainer against the kubeflow SDK on every figure, side by side, in one run.

    .venv/bin/python -m bench.run [--smoke] [--out DIR] [--skip local,imports,...]

Phases, in this order (``--skip`` leaves some out):

* ``imports``: import time of the entry points (:mod:`bench.imports`);
* ``local``: the local backend against plain torchrun (:mod:`bench.local_overhead`);
* then, on a control plane of its own (the real Trainer and JobSet controllers, the API
  server's audit log on; stopped at the end):
  ``long`` -- four long jobs, one per side and log setting, run alongside what follows
  (requests per job-minute while waiting); ``sequential`` -- short jobs one at a time, the
  sides interleaved (requests per job, spawn -> created, completion -> return); ``relay`` --
  one big log relayed byte for byte (:mod:`bench.relay`); ``concurrency`` -- 1, 100 and 200
  launchers at once, each side in turn (requests per job, API server CPU).

Writes ``results.json`` and ``results.md`` (:mod:`bench.report`) into ``--out`` (default:
``bench/``). Exits 1 when the harness itself fails (the cluster does not start, a launcher of
either side cannot run); a missed goal is a result, not an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from bench import analyze, env, imports, relay, report
from bench.audit import AuditLog
from bench.launches import Runner, pod_script

FULL = {"import_reps": 5, "local_rounds": 5, "local_steps": 300, "sequential": 10, "long_s": 300, "relay_lines": 200_000,
        "relay_rounds": 5, "levels": [1, 100, 200], "workers": 4, "settle_s": 30}  # fmt: skip
SMOKE = {"import_reps": 1, "local_rounds": 1, "local_steps": 10, "sequential": 1, "long_s": 10, "relay_lines": 2000,
         "relay_rounds": 1, "levels": [1, 3], "workers": 2, "settle_s": 5}  # fmt: skip
PHASES = ("imports", "local", "long", "sequential", "relay", "concurrency")
VARIANTS = (("ours", "none"), ("sdk", "none"), ("ours", "logs"), ("sdk", "logs"))
SEQUENTIAL = (*VARIANTS, ("ours", "pod"))  # ours also as in a KFP step: the pod's service account, no kubeconfig
LAUNCH_TIMEOUT = 600.0


def _logs(label: str) -> str:
    return label if label in ("none", "pod") else "0"


class LoadSampler:
    """The 1-minute load average every few seconds while the bench runs."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        s = self.samples or [os.getloadavg()[0]]
        return {"min": round(min(s), 2), "max": round(max(s), 2), "mean": round(sum(s) / len(s), 2), "samples": len(s)}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = 0
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem / 2**20), "python": platform.python_version()}


class Bench:
    """One run: sizes, the workdir, the cluster and what was measured."""

    def __init__(self, sizes: dict[str, Any], workdir: Path, verbose: bool) -> None:
        self.sizes = sizes
        self.workdir = workdir
        self.verbose = verbose
        self.results: dict[str, Any] = {"sizes": sizes, "phase_s": {}}
        self.launches: dict[str, list[Any]] = {}

    def say(self, text: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ cluster phases
    def on_cluster(self, phases: set[str]) -> None:
        self.say("starting the control plane (audit log on)")
        cluster = env.start_cluster(verbose=self.verbose)
        try:
            self._on_cluster(cluster, phases)
        finally:
            self.say("stopping the control plane")
            cluster.stop()

    def _on_cluster(self, cluster: Any, phases: set[str]) -> None:
        apiserver = cluster.pid("kube-apiserver")
        cpu0, t0 = env.cpu_seconds(apiserver), time.monotonic()
        time.sleep(5)
        idle = (env.cpu_seconds(apiserver) - cpu0) / (time.monotonic() - t0)
        ids = env.Identities(cluster, self.workdir)
        runner = Runner(ids, self.workdir, env.peer_python())
        api = cluster.api_client()
        self.api = api
        long_procs = []
        if "long" in phases:
            long_procs = self.start_long(runner)
        if "sequential" in phases:
            self.timed("sequential", lambda: self.sequential(runner))
        if "relay" in phases:
            self.results["relay"] = self.timed("relay", lambda: relay.run(
                runner, api, cluster.logs_dir, n=self.sizes["relay_lines"], rounds=self.sizes["relay_rounds"], timeout=LAUNCH_TIMEOUT))
        if "concurrency" in phases:
            self.timed("concurrency", lambda: self.concurrency(runner, apiserver))
        if long_procs:
            self.say("waiting for the long jobs")
            self.launches["long"] = [runner.finish(launch, proc, LAUNCH_TIMEOUT + self.sizes["long_s"]) for launch, proc in long_procs]
        self.results["apiserver_cpu"] = {"total_s": env.cpu_seconds(apiserver), "idle_cores": idle}
        self.say("reading the audit log")
        log = AuditLog.read(cluster.audit_log)
        self.results["audit"] = {"requests": len(log.requests), "bytes": cluster.audit_log.stat().st_size}
        self.analyze(log)
        ids.close()
        api.close()

    def timed(self, name: str, fn: Any) -> Any:
        self.say(f"phase {name}")
        t = time.monotonic()
        try:
            return fn()
        finally:
            self.results["phase_s"][name] = round(time.monotonic() - t, 1)

    def namespace(self, name: str) -> str:
        return env.make_namespace(self.api, name)

    def drop_namespace(self, name: str) -> None:
        if not env.drop_namespace(self.api, name):
            self.say(f"namespace {name} still there after waiting; going on")

    def start_long(self, runner: Runner) -> list[Any]:
        seconds = self.sizes["long_s"]
        ns = self.namespace("bench-long")
        lines = [f"tick {k} loss={1 / (k + 1):.4f}" for k in range(max(2, seconds // 5))]
        script = pod_script(lines, line_delay=seconds / len(lines))
        self.say(f"starting 4 long jobs ({seconds} s each), run alongside the other phases")
        return [runner.start(side, _logs(label), f"long-{side}-{label}", ns, script) for side, label in VARIANTS]

    def sequential(self, runner: Runner) -> None:
        ns = self.namespace("bench-seq")
        script = pod_script([f"step {k} loss={1 / (k + 1):.4f}" for k in range(5)], line_delay=0.1)
        runs: dict[str, list[Any]] = {f"{s}-{label}": [] for s, label in SEQUENTIAL}
        for i in range(self.sizes["sequential"]):
            for side, label in SEQUENTIAL:
                launch = runner.run(side, _logs(label), f"seq-{side}-{label}-{i}", ns, script, LAUNCH_TIMEOUT)
                if launch.error:
                    raise RuntimeError(f"{side} launcher ({label}) failed: {launch.error}")
                runs[f"{side}-{label}"].append(launch)
            self.say(f"sequential: round {i + 1} of {self.sizes['sequential']} done")
        self.launches["sequential"] = [x for group in runs.values() for x in group]
        self.launches["sequential_groups"] = list(runs.items())

    def concurrency(self, runner: Runner, apiserver: int | None) -> None:
        script = pod_script([f"step {k}" for k in range(5)], line_delay=1.0)
        rounds = []
        for n in self.sizes["levels"]:
            for side in ("ours", "sdk"):
                ns = self.namespace(f"bench-c{n}-{side}")
                cpu = env.cpu_seconds(apiserver)
                launches, start, end = runner.many(side, "0", n, f"c{n}-{side}", ns, script, workers=min(self.sizes["workers"], n),
                                                   timeout=LAUNCH_TIMEOUT + 3 * n)  # fmt: skip
                used = env.cpu_seconds(apiserver) - cpu
                failed = sum(1 for x in launches if x.error)
                self.say(f"concurrency: {n} x {side}: {end - start:.0f} s, {failed} failed, API server CPU {used:.1f} s")
                if failed == n:
                    raise RuntimeError(f"every {side} launcher of the {n}-launcher round failed: {launches[0].error}")
                rounds.append((n, side, launches, end - start, used))
                self.drop_namespace(ns)
        self.launches["concurrency"] = rounds

    # ------------------------------------------------------------------ figures
    def analyze(self, log: AuditLog) -> None:
        r = self.results
        if "sequential_groups" in self.launches:
            seq: dict[str, Any] = {k: analyze.group_figures(v, log) for k, v in self.launches["sequential_groups"]}
            spawn = {side: [e["spawn_to_created_s"] for k, g in seq.items() if k in (f"{side}-none", f"{side}-logs") for e in g["each"]]
                     for side in ("ours", "sdk")}  # fmt: skip
            spawn["ours-pod"] = [e["spawn_to_created_s"] for e in seq.get("ours-pod", {}).get("each", [])]
            seq["spawn_to_created"] = {side: analyze.spread(v) for side, v in spawn.items()}
            r["sequential"] = seq
        if "long" in self.launches:
            r["long"] = {f"{x.side}-{'none' if x.logs == 'none' else 'logs'}": analyze.waiting_rate(x, log, settle=self.sizes["settle_s"])
                         for x in self.launches["long"]}  # fmt: skip
        if "concurrency" in self.launches:
            conc = {}
            for n, side, launches, wall, cpu in self.launches["concurrency"]:
                g = analyze.group_figures(launches, log)
                g.pop("each")
                conc[f"{n}-{side}"] = {**g, "logs": "logs on", "wall_s": wall, "apiserver_cpu_s": cpu, "apiserver_cpu_s_per_job": cpu / n}
            r["concurrency"] = conc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness, measures nothing worth quoting")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent), help="where results.json and results.md go")
    parser.add_argument("--skip", default="", help=f"comma-separated phases to leave out: {', '.join(PHASES)}")
    parser.add_argument("--set", action="append", default=[], metavar="SIZE=VALUE", help=f"override a size: {', '.join(FULL)}")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    phases = set(PHASES) - {p.strip() for p in args.skip.split(",") if p.strip()}
    sizes = dict(SMOKE if args.smoke else FULL)
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in sizes:
            parser.error(f"--set {item}: no size {key!r}; sizes: {', '.join(sizes)}")
        sizes[key] = json.loads(value) if not value.replace(",", "").isdigit() or "," not in value else [int(v) for v in value.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="kfp-bench-"))
    bench = Bench(sizes, workdir, args.verbose)
    load = LoadSampler()
    started = time.monotonic()
    r = bench.results
    given = " ".join(argv if argv is not None else sys.argv[1:])
    command = "make bench" + (f" BENCH_ARGS='{given}'" if given else "")
    r.update({"date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": machine(), "command": command,
              "peer_version": env.peer_sdk.version(), "phases": sorted(phases)})  # fmt: skip
    try:
        if "imports" in phases:
            r["imports"] = bench.timed("imports", lambda: imports.run(env.peer_python(), reps=sizes["import_reps"]))
        if "local" in phases:
            from bench import local_overhead

            r["local"] = bench.timed("local", lambda: local_overhead.measure(rounds=sizes["local_rounds"], steps=sizes["local_steps"]))
        if phases & {"long", "sequential", "relay", "concurrency"}:
            bench.on_cluster(phases)
    except Exception:
        traceback.print_exc()
        print(f"bench: harness error; launcher logs kept in {workdir}", file=sys.stderr)
        return 1
    r["load"] = load.stop()
    r["duration_s"] = time.monotonic() - started
    r["table"] = report.rows(r)
    (out / "results.json").write_text(json.dumps(r, indent=1, default=str) + "\n")
    (out / "results.md").write_text(report.markdown(r))
    print(report.markdown(r))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
