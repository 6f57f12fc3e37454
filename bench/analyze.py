"""Figures from launches and the audit log: requests, spawn -> created, completion -> return.

Every time compares the bench's wall clock with the API server's audit timestamps (the same
host, the same clock): a TrainJob is *created* when the API server answered its create, and
*complete* when it answered the status write that set ``Complete``.

Example:
    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 95)
    (2.5, 3.85)
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from bench.audit import AuditLog, kinds
from bench.launches import Launch


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation between closest ranks); None without values."""
    data = sorted(values)
    if not data:
        return None
    k = (len(data) - 1) * q / 100
    low = int(k)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (k - low)


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Median, p95, min, max and count of the values that are not None."""
    data = [v for v in values if v is not None]
    if not data:
        return {"n": 0, "median": None, "p95": None, "min": None, "max": None}
    return {"n": len(data), "median": statistics.median(data), "p95": percentile(data, 95), "min": min(data), "max": max(data)}


def launch_figures(launch: Launch, log: AuditLog) -> dict[str, Any]:
    """What one launch cost and how fast it was."""
    requests = log.of(launch.identity)
    created = log.created(launch.identity)
    job = launch.job or (created.name if created else "")
    done = log.completed.get((launch.namespace, job))
    return {
        "identity": launch.identity,
        "job": job,
        "error": launch.error,
        "state": done[1] if done else None,
        "requests": len(requests),
        "kinds": kinds(requests),
        "spawn_to_created_s": created.completed - launch.spawned if created else None,
        "completion_to_return_s": launch.returned - done[0] if done and launch.returned else None,
        "job_s": done[0] - created.completed if done and created else None,
        "launcher_cpu_s": launch.extra.get("cpu_s"),
    }


def group_figures(launches: list[Launch], log: AuditLog) -> dict[str, Any]:
    """Per-launch figures of a group of launches (same side and logs) and their spread."""
    each = [launch_figures(x, log) for x in launches]
    requests = [e["requests"] for e in each if not e["error"]]
    typical = sorted((e for e in each if not e["error"]), key=lambda e: e["requests"])
    return {
        "launches": len(each),
        "failed": sum(1 for e in each if e["error"] or e["state"] != "Complete"),
        "errors": sorted({e["error"] for e in each if e["error"]})[:5],
        "requests_per_job": spread(requests),
        "typical_kinds": typical[len(typical) // 2]["kinds"] if typical else {},
        "spawn_to_created_s": spread(e["spawn_to_created_s"] for e in each),
        "completion_to_return_s": spread(e["completion_to_return_s"] for e in each),
        "job_s": spread(e["job_s"] for e in each),
        "launcher_cpu_s": spread(e["launcher_cpu_s"] for e in each),
        "each": each,
    }


def waiting_rate(launch: Launch, log: AuditLog, *, settle: float) -> dict[str, Any]:
    """Requests of a long job's launcher per job-minute: over the whole wait, and after start-up.

    The whole wait runs from the create to the completion; "after start" leaves out the first
    ``settle`` seconds after the create (scheduling, the pod starting, the first log read).
    """
    fig = launch_figures(launch, log)
    created = log.created(launch.identity)
    done = log.completed.get((launch.namespace, fig["job"]))
    if created is None or done is None:
        return {**fig, "per_minute": None, "per_minute_after_start": None}
    begin, end = created.completed, done[0]
    requests = log.of(launch.identity)
    during = [r for r in requests if begin <= r.received <= end]
    after = [r for r in during if r.received >= begin + settle]
    window = max(end - begin - settle, 1e-9)
    return {
        **fig,
        "wait_s": end - begin,
        "after_start_window_s": window,
        "requests_while_waiting": len(during),
        "requests_after_start": len(after),
        "kinds_after_start": kinds(after),
        "per_minute": len(during) / max(end - begin, 1e-9) * 60,
        "per_minute_after_start": len(after) / window * 60,
    }
