"""The bench's pure figures: audit log parsing, request kinds, percentiles and the report's wording."""

from __future__ import annotations

import json
import time

from bench.analyze import percentile, spread
from bench.audit import USER_PREFIX, AuditLog, kinds
from bench.procs import cpu_seconds
from bench.report import compare, rows


def event(audit_id: str, stage: str, *, user: str, verb: str, uri: str, ref: dict, t: str, code: int = 0, obj: dict | None = None) -> str:
    e = {"auditID": audit_id, "stage": stage, "user": {"username": user}, "verb": verb, "requestURI": uri, "objectRef": ref,
         "requestReceivedTimestamp": "2026-01-01T00:00:00.000000Z", "stageTimestamp": t}  # fmt: skip
    if code:
        e["responseStatus"] = {"code": code}
    if obj is not None:
        e["responseObject"] = obj
    return json.dumps(e)


def test_requests_are_counted_per_identity_with_creates_follows_and_completions_told_apart():
    ours = USER_PREFIX + "ours-1"
    t0, t1 = "2026-01-01T00:00:00.1Z", "2026-01-01T00:00:00.2Z"
    job = {"resource": "trainjobs", "namespace": "ns", "name": "j"}
    pods_log = {"resource": "pods", "subresource": "log", "namespace": "ns", "name": "p"}
    done = {"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Complete", "status": "True"}]}}
    lines = [
        event("a", "RequestReceived", user=ours, verb="create", uri="/apis/x/trainjobs?dryRun=All", ref=job, t=t0),
        event("a", "ResponseComplete", user=ours, verb="create", uri="/apis/x/trainjobs?dryRun=All", ref=job, t=t1, code=201),
        event("b", "ResponseComplete", user=ours, verb="create", uri="/apis/x/trainjobs", ref=job, t="2026-01-01T00:00:01.5Z", code=201),
        event("c", "ResponseComplete", user=ours, verb="get", uri="/api/v1/ns/p/log?follow=true",
              ref=pods_log, t="2026-01-01T00:00:09Z", code=200),
        '{"cut by a stop',  # a line the API server's stop cut short is skipped
        event("d", "ResponseComplete", user="system:serviceaccount:kubeflow-system:trainer", verb="update",
              uri="/apis/x/trainjobs/j/status", ref={**job, "subresource": "status"}, t="2026-01-01T00:01:00Z", code=200, obj=done),
        event("e", "ResponseComplete", user="someone-else", verb="list", uri="/api/v1/pods", ref={"resource": "pods"}, t=t1),
    ]  # fmt: skip
    log = AuditLog.parse(lines)
    assert [r.identity for r in log.requests] == ["ours-1"] * 3  # the controller's and other users' requests are not counted
    assert kinds(log.requests) == {"create (dry run) trainjobs": 1, "create trainjobs": 1, "follow pods/log": 1}
    created = log.created("ours-1")
    assert created is not None and created.uri == "/apis/x/trainjobs" and abs(created.completed - (1767225601.5)) < 1e-6
    assert log.completed == {("ns", "j"): (1767225660.0, "Complete")}


def test_percentiles_and_spreads():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == 3.85
    assert spread([None, 2.0, 1.0]) == {"n": 2, "median": 1.5, "p95": 1.95, "min": 1.0, "max": 2.0}
    assert spread([None])["median"] is None


def test_the_report_says_which_side_is_ahead():
    assert compare(10.0, 130.0, lower=True) == "13.0× fewer"
    assert compare(2.0, 1.0, lower=True) == "2.0× more (worse)"
    assert compare(200_000.0, 40_000.0, lower=False) == "5.0× more"
    assert compare(10_000.0, 20_000.0, lower=False) == "2.0× less (worse)"
    assert compare(None, 1.0, lower=True) == "n/a"


def test_the_relay_rows_hold_ours_to_its_requests_ceiling_and_its_cpu_to_the_sdks():
    def relay(ours: float, ceiling: float, ours_cpu: float) -> list[dict]:
        side = {"exact": True}
        r = {"relay": {"lines": 200001, "rounds": 5, "raw": {"lines_per_s": ceiling}, "raw_untimed": {"lines_per_s": 55_000.0},
                       "ours": {**side, "lines_per_s": ours, "cpu_us_per_line": ours_cpu},
                       "sdk": {**side, "lines_per_s": 48_000.0, "cpu_us_per_line": 3.0}}}  # fmt: skip
        return [row for row in rows(r) if row["figure"].startswith("log relay")]

    rate, cpu = relay(49_000.0, 48_000.0, 2.5)
    assert "48.0k with timestamps" in rate["figure"] and "55.0k without" in rate["figure"]
    assert rate["met"] and cpu["met"] and cpu["vs"] == "1.2× fewer"
    rate, cpu = relay(40_000.0, 48_000.0, 3.5)
    assert not rate["met"] and not cpu["met"] and rate["vs"] == "1.2× less (worse)"
    assert not relay(47_000.0, 48_000.0, 2.5)[0]["met"]  # below the SDK's 48k


def test_spawn_to_created_is_told_in_a_pod_against_its_goal_and_with_a_kubeconfig_against_the_sdk():
    def spawn(pod: float, kubeconfig: float, sdk: float) -> list[dict]:
        figures = {"ours-pod": spread([pod] * 3), "ours": spread([kubeconfig] * 6), "sdk": spread([sdk] * 6)}
        return [row for row in rows({"sequential": {"spawn_to_created": figures}}) if row["figure"].startswith("process spawn")]

    in_pod, with_kubeconfig = spawn(0.25, 0.45, 0.95)
    assert "in a pod" in in_pod["figure"] and "of 3" in in_pod["figure"] and in_pod["goal"] == "≤ 0.3 s" and in_pod["met"]
    assert "with a kubeconfig" in with_kubeconfig["figure"] and with_kubeconfig["met"] and with_kubeconfig["vs"] == "2.1× fewer"
    in_pod, with_kubeconfig = spawn(0.35, 1.0, 0.95)
    assert not in_pod["met"] and not with_kubeconfig["met"]


def test_a_childs_cpu_time_is_read_while_it_runs_and_none_once_it_is_gone():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
                              "input()"], stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (spent := cpu_seconds(child.pid)) is not None and spent < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spent is not None and 0.3 <= spent < 5
    finally:
        child.communicate(b"\n", timeout=30)
    assert cpu_seconds(child.pid) is None
