"""Bad input is said as bad input (exit 2) before the command line opens any connection to the cluster.

The cluster here is dead on purpose: its kubeconfig points at a real TCP listener that counts
the connections it accepts and closes each at once (so a command that does connect fails fast,
with exit 3 and "cannot reach the API server"). Every hostile input a command can refuse from
the inputs alone must end with exit 2, the bad field named, and no connection counted. Only the
checks that need the cluster's facts -- the runtime's host-access policy (and, with
``--api-version auto``, the Trainer version) -- may come after the connection.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hostile_cases import BASE, CANARIES, CASES, CLI_CASES, HF, Case

from kfp_trainer import cli
from kfp_trainer.errors import EXIT_INFRA, EXIT_USER

REPO = Path(__file__).resolve().parents[2]

# Refused by the runtime's host-access policy (an annotation on the runtime): a fact of the cluster.
NEEDS_THE_RUNTIME = {
    "volume-host-path", "mount-bidirectional", "security-context-se-linux-spc", "security-context-unsafe-sysctl",
    "security-context-unconfined", "container-privileged", "container-capabilities", "container-escalation",
    "init-privileged", "patch-host-path", "patch-privileged", "patch-privilege-escalation", "patch-capabilities",
    "patch-host-network", "patch-host-pid", "patch-host-ipc", "patch-host-port", "patch-unmasked-proc",
    "patch-seccomp-unconfined", "patch-init-container-privileged",
}  # fmt: skip
INPUT_ONLY = [c for c in CASES if not c.accepted and "cli" in c.layers and c.id not in NEEDS_THE_RUNTIME]


class DeadServer:
    """A listener on 127.0.0.1 that counts the connections made to it and closes each at once."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.01)  # how soon connections() sees the thread stop
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def connections(self) -> int:
        """Connections made so far: the ones accepted, and any still waiting in the backlog."""
        self._stop.set()
        self._thread.join()
        self.sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                self.sock.accept()[0].close()
                self.accepted += 1
        return self.accepted

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def dead(tmp_path, monkeypatch) -> Iterator[tuple[DeadServer, Path]]:
    """A dead API server and a kubeconfig naming it (also as $KUBECONFIG, the only cluster configured)."""
    server = DeadServer()
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{server.port}", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield server, config
    server.close()


@dataclass
class Ran:
    code: int | None
    out: str
    err: str


def kfp_trainer(*argv: str) -> Ran:
    """``kfp-trainer ARGV`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | None = cli.main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())


def refused_before_connecting(ran: Ran, server: DeadServer, *words: str) -> None:
    shown = ran.out + ran.err
    assert ran.code == EXIT_USER, shown
    assert "cannot reach the API server" not in shown and "Traceback" not in shown, shown
    for word in words:
        assert word in ran.err, shown
    assert not [c for c in CANARIES if c in shown], "a secret was shown"
    assert server.connections() == 0, "the command connected before refusing its input"


# ------------------------------------------------------------------ the inputs a user reported


REPORTED = {
    "literal-token-in-env": (("--env", f"HF_TOKEN={HF}"), "env[0].value"),
    "nan-quantity": (("--resources-per-node", '{"limits": {"cpu": "NaN"}}'), "resources_per_node.limits['cpu']"),
    "nan-quantity-yaml": (("--resources-per-node", "{limits: {memory: .nan}}"), "resources_per_node.limits['memory']"),
    "namespace-patch": (("--patch", '{"metadata": {"namespace": "kube-system"}}'), "patch.metadata.namespace"),
    "newline-in-image": (("--image", "trainer:1\n"), "image"),
    "bad-namespace": (("-n", "Team_A"), "namespace"),
    "no-run-id-or-name": (("--run-id", ""), "run_id"),
}


@pytest.mark.parametrize(("flags", "field"), REPORTED.values(), ids=REPORTED.keys())
@pytest.mark.parametrize("command", [("launch",), ("render", "--api-version", "auto")], ids=["launch", "render-auto"])
def test_reported_bad_inputs_are_refused_before_any_connection(dead, command, flags, field):
    server, _ = dead
    refused_before_connecting(kfp_trainer(*command, "--run-id", "r1", *flags), server, field, "invalid input")


def test_as_a_process_too_with_the_kubeconfig_flag(dead):
    server, config = dead
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "kfp_trainer.cli", "launch", "--kubeconfig", str(config), "--run-id", "r1", "--image", "trainer:1\n",
         "--resources-per-node", '{"limits": {"cpu": "NaN"}}'],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    refused_before_connecting(Ran(done.returncode, done.stdout, done.stderr), server, "2 invalid input(s)", "image", "'cpu'")


def test_good_input_does_reach_for_the_cluster(dead):
    """The other side of the line: the same command with good input connects (and finds the server dead)."""
    server, _ = dead
    ran = kfp_trainer("launch", "--run-id", "r1", "--logs", "none")
    assert ran.code == EXIT_INFRA and "cannot reach the API server" in ran.err, ran.err
    assert server.connections() == 1


def test_a_check_that_needs_the_runtime_comes_after_the_connection(dead):
    """hostPath is refused unless the runtime allows host access: only the cluster can say (here it is dead: exit 3)."""
    server, _ = dead
    volume = json.dumps([{"name": "h", "hostPath": {"path": "/tmp"}}])
    assert kfp_trainer("launch", "--run-id", "r1", "--volumes", volume).code == EXIT_INFRA
    assert server.connections() == 1


# ------------------------------------------------------------------ the hostile-input table


def inputs_file(case: Case, folder: Path) -> Path:
    path = folder / "inputs.yaml"
    path.write_text(yaml.safe_dump({**BASE, **case.inputs}, allow_unicode=True))
    return path


@pytest.mark.parametrize("case", INPUT_ONLY, ids=[c.id for c in INPUT_ONLY])
def test_every_input_only_hostile_case_is_refused_by_launch_before_connecting(case, dead, tmp_path):
    """With the Trainer API given (``--api-version``), every rule but the runtime's host-access policy needs no cluster."""
    server, _ = dead
    ran = kfp_trainer("launch", "--inputs-file", str(inputs_file(case, tmp_path)), "--api-version", case.api_version, "--logs", "none")
    refused_before_connecting(ran, server, case.field)


VERSIONLESS = [c for c in INPUT_ONLY if c.api_version == "v2.2" and "v21" not in c.id and "v22" not in c.id]


@pytest.mark.parametrize("case", VERSIONLESS[::8], ids=[c.id for c in VERSIONLESS[::8]])
def test_with_api_version_auto_too(case, dead, tmp_path):
    server, _ = dead
    refused_before_connecting(kfp_trainer("launch", "--inputs-file", str(inputs_file(case, tmp_path))), server, case.field)


FLAG_CASES = [c for c in CLI_CASES if c.argv[0] == "render"]


@pytest.mark.parametrize("command", [("launch",), ("render", "--api-version", "auto")], ids=["launch", "render-auto"])
@pytest.mark.parametrize("case", FLAG_CASES, ids=[c.id for c in FLAG_CASES])
def test_bad_flags_and_files_are_refused_before_connecting(case, command, dead, tmp_path):
    server, _ = dead
    for name, data in case.files:
        (tmp_path / name).write_bytes(data)
    argv = [a.replace("{dir}", str(tmp_path)) for a in case.argv[1:]]
    refused_before_connecting(kfp_trainer(*command, *argv), server, case.expect)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("-n", "Team_A"), ("--namespace", "'Team_A'", "RFC-1123")),
        (("--namespace", "a/../kube-system"), ("--namespace",)),
        (("--older-than", "soon"), ("--older-than", "24h")),
        (("--older-than", "\uff11\uff12h"), ("--older-than",)),
        (("-n", "team", "-A"), ("not allowed with",)),
        (("-o", "table"), ("invalid choice",)),
    ],
    ids=["namespace-underscore", "namespace-traversal", "age-words", "age-fullwidth", "namespace-and-all", "output-unknown"],
)
def test_gc_refuses_its_bad_flags_before_connecting(dead, flags, words):
    server, _ = dead
    refused_before_connecting(kfp_trainer("gc", *flags), server, *words)
