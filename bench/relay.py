"""Log relay: how fast each side copies a trainer's log to its own stdout, and whether byte for byte.

One TrainJob's trainer pod prints one line and keeps running; the bench then appends ``n`` more
lines (training-log text with metrics, non-ASCII letters and tabs) to the container's log file
in the CRI format. Each reader then follows that running container's log (``follow=true``, as
while a job trains) and is stopped once the last line is out; in turn, ``rounds`` times:

* ``raw``: one streaming GET of the log (``follow=true&timestamps=true``, as ours reads it)
  that only counts newlines, a chunk at a time -- a bare reader of that request, the pace this
  API server and its kubelet keep for it (a reader that handles many chunks at once can pass
  it); ``raw_untimed``: the same without ``timestamps=true``, as the peer reads it (31 bytes
  fewer per line for the kubelet and the API server to send);
* ours: ``kfp-trainer launch`` of the same task with ``--logs 0`` (it adopts the running job
  and follows its log);
* the peer: ``get_job_logs(name, follow=True)``, each line printed.

A side's rate is its lines divided by the time between the arrival of its first and its last
relayed line on its stdout, and its CPU per line the CPU time its process spent between those
two arrivals (:meth:`bench.procs.Proc.cpu_at`) divided by the lines; exact means its stdout
holds the log's lines unchanged, in order. The sides take turns in a different order each
round, so that none is always the first after the log was written or the last of a round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.env import drop_namespace, make_namespace
from bench.launches import Runner, pod_script
from bench.procs import Proc, python_env

NAMESPACE = "bench-relay"
FIRST = "relay: start"


def log_lines(n: int) -> list[str]:
    """``n`` training-log lines, all different, some with metrics, tabs and non-ASCII letters.

    Example:
        >>> log_lines(2)
        ['epoch=0 step=0 loss=1.000000 lr=3.0e-04 tokens/s=0', 'note 1:\\tÜbung — données ✓ 7919']
    """
    out = []
    for i in range(n):
        if i % 2:
            out.append(f"note {i}:\tÜbung — données ✓ {i * 7919 % 100003}")
        else:
            out.append(f"epoch={i // 5000} step={i} loss={1.0 / (1 + i):.6f} lr=3.0e-04 tokens/s={i * 7919 % 100003}")
    return out


def cri(lines: list[str], start: float) -> bytes:
    """``lines`` in the CRI log format, one microsecond apart from ``start``."""
    base = int(start)
    micros = int((start - base) * 1e6)
    out = []
    for i, text in enumerate(lines):
        total = micros + i
        second, micro = base + total // 1_000_000, total % 1_000_000
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{micro:06d}000Z"
        out.append(f"{stamp} stdout F {text}\n")
    return "".join(out).encode()


def _wait_pod(api: Any, namespace: str, timeout: float = 300) -> dict[str, Any]:
    """The relay job's trainer pod once it has printed its scripted line."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(namespace).items:
            if (pod.metadata.annotations or {}).get("script.kfp-trainer.test/log-done") == "0":
                job = (pod.metadata.labels or {}).get("jobset.sigs.k8s.io/jobset-name", "")
                return {"name": pod.metadata.name, "uid": pod.metadata.uid, "job": job}
        time.sleep(0.2)
    raise RuntimeError(f"no trainer pod in {namespace} printed its line within {timeout:.0f}s")


def _raw(api: Any, pod: str, n: int, *, timestamps: bool) -> dict[str, Any]:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/log"
    query = [("container", "node"), ("follow", "true")] + ([("timestamps", "true")] if timestamps else [])
    start = time.time()
    response = api.call_api(path, "GET", query_params=query, auth_settings=["BearerToken"], _preload_content=False,
                            _return_http_data_only=True, _request_timeout=(10, 300))  # fmt: skip
    count, first, last, reads = 0, 0.0, 0.0, 0
    for chunk in response.stream(None):
        reads += 1
        now = time.time()
        first = first or now
        last = now
        count += chunk.count(b"\n")
        if count >= n:
            break
    response.close()
    return {"lines": count, "lines_per_s": (count - 1) / max(last - first, 1e-9), "seconds": last - start, "reads": reads}


def _follow(proc: Proc, last_line: bytes, expected: bytes, n: int, timeout: float) -> dict[str, Any]:
    """Let a reader run until ``last_line`` is out (or ``timeout``), kill it, measure what it printed."""
    seen = proc.watch_for(last_line).wait(timeout)
    proc.kill()  # SIGKILL: our launcher must not take it for a cancel and delete the job
    proc.wait(30)
    out = proc.output
    at = out.find(expected)
    if not seen or at < 0:
        return {"exact": False, "complete": seen, "lines": out.count(b"\n"), "lines_per_s": None}
    first, last = proc.time_at(at), proc.time_at(at + len(expected) - 1)
    cpu_first, cpu_last = proc.cpu_at(at), proc.cpu_at(at + len(expected) - 1)
    cpu = None if cpu_first is None or cpu_last is None else (cpu_last - cpu_first) / (n - 1) * 1e6
    return {"exact": True, "complete": True, "lines": n, "lines_per_s": (n - 1) / max(last - first, 1e-9),
            "cpu_us_per_line": cpu, "seconds": last - proc.spawned}  # fmt: skip


def run(runner: Runner, api: Any, logs_dir: Path, *, n: int, rounds: int, timeout: float) -> dict[str, Any]:
    """Set the log up, then relay it ``rounds`` times with each side (see the module docstring)."""
    make_namespace(api, NAMESPACE)
    annotations = pod_script([FIRST], 0.05, exit_delay=float("inf"))
    setup, proc = runner.start("ours", "none", "relay-setup", NAMESPACE, annotations, run_id="bench-relay")
    pod = _wait_pod(api, NAMESPACE)
    lines = log_lines(n)
    path = logs_dir / f"{NAMESPACE}_{pod['name']}_{pod['uid']}" / "current.log"
    with open(path, "ab") as f:
        f.write(cri(lines, time.time()))
    proc.kill()  # it created the job; the job runs on
    setup = runner.finish(setup, proc, timeout)
    job = pod["job"]
    expected = ("\n".join([FIRST, *lines]) + "\n").encode()
    last_line = ("\n" + lines[-1] + "\n").encode()
    results: dict[str, list[dict[str, Any]]] = {"raw": [], "raw_untimed": [], "ours": [], "sdk": []}

    def ours(r: int) -> dict[str, Any]:
        launch, proc = runner.start("ours", "0", f"relay-ours-{r}", NAMESPACE, annotations, run_id="bench-relay")
        return {**_follow(proc, last_line, expected, n + 1, timeout), "identity": launch.identity}

    def sdk(r: int) -> dict[str, Any]:
        kubeconfig = runner.identities.make(f"relay-sdk-{r}")
        cmd = [str(runner.peer_python), str(Path(__file__).parent / "peer_driver.py"), "relay", str(kubeconfig), NAMESPACE, job]
        proc = Proc(cmd, env=python_env(), stderr=runner.logs_dir / f"relay-sdk-{r}.stderr")
        return {**_follow(proc, last_line, expected, n + 1, timeout), "identity": f"relay-sdk-{r}"}

    sides: list[tuple[str, Callable[[int], dict[str, Any]]]] = [
        ("raw", lambda r: _raw(api, pod["name"], n + 1, timestamps=True)),
        ("ours", ours),
        ("raw_untimed", lambda r: _raw(api, pod["name"], n + 1, timestamps=False)),
        ("sdk", sdk),
    ]
    for r in range(rounds):
        for side, read in sides[r % len(sides) :] + sides[: r % len(sides)]:
            results[side].append(read(r))
    drop_namespace(api, NAMESPACE)
    summary: dict[str, Any] = {"lines": n + 1, "bytes": len(expected), "rounds": rounds, "job": job, "runs": results}
    for side, runs in results.items():
        rates = [x["lines_per_s"] for x in runs if x.get("lines_per_s")]
        cpus = [x["cpu_us_per_line"] for x in runs if x.get("cpu_us_per_line") is not None]
        summary[side] = {
            "lines_per_s": statistics.median(rates) if rates else None,
            "cpu_us_per_line": statistics.median(cpus) if cpus else None,
            "exact": all(x.get("exact", True) for x in runs),
        }
    return summary
