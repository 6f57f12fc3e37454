"""One trainer node's log: every line once, no re-reads when the stream ended on its own (scripted server)."""

from __future__ import annotations

import logging
import threading

import urllib3

from kfp_trainer.backends.base import LogLine
from kfp_trainer.backends.kube.apierrors import api_error
from kfp_trainer.backends.kube.cache import ObjectCache
from kfp_trainer.backends.kube.client import Stream
from kfp_trainer.backends.kube.logs import NodeLogFollower, _terminated

LABELS = {
    "jobset.sigs.k8s.io/jobset-name": "tj",
    "jobset.sigs.k8s.io/replicatedjob-name": "node",
    "batch.kubernetes.io/job-completion-index": "0",
}


def pod(state: str, restarts: int = 0, phase: str = "Running", uid: str = "p1") -> dict:
    return {
        "metadata": {"name": "tj-node-0-0-abcde", "uid": uid, "labels": LABELS, "creationTimestamp": "2026-05-01T10:00:00Z"},
        "status": {"phase": phase, "containerStatuses": [{"name": "node", "restartCount": restarts, "state": {state: {}}}]},
    }


def stamped(second: int, text: str) -> bytes:
    return f"2026-05-01T10:00:{second:02d}.000000001Z {text}\n".encode()


class Body:
    def __init__(self, lines, *, then=None, hang: bool = False):
        self.lines, self.then, self.hang = list(lines), then, hang
        self.closed = threading.Event()

    def stream(self, amt=None, decode_content=True):
        yield from self.lines
        if self.then is not None:
            raise self.then
        if self.hang:
            self.closed.wait(10)
            raise urllib3.exceptions.ProtocolError("connection shut down")

    def release_conn(self):
        pass

    def close(self):
        pass

    def shutdown(self):
        self.closed.set()


class LogServer:
    """Answers pods/log requests from a script; records their queries."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[dict] = []

    def request(self, method, path, *, query=None, stream=False, **kwargs):
        self.requests.append(dict(query or []))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Stream(answer, f"{method} {path}")


class Pods(ObjectCache):
    """The pod watch, fed by the test."""

    def __init__(self, *pods):
        super().__init__(None, "/pods", [])
        self.set(*pods)

    def start(self):
        return self

    @property
    def running(self):
        return True

    def set(self, *pods):
        self._apply(("LIST", {"items": list(pods)}))


def follower(server, pods, **kw):
    lines: list[str] = []
    stop = threading.Event()
    f = NodeLogFollower(
        server,
        namespace="ns",
        job="tj",
        replicated_job="node",
        index=0,
        sink=lambda line: lines.extend(line.lines),
        stop=stop,
        source="node-0",
        pods=pods,
        settle=5,
        sleep=lambda s: None,
        **kw,
    )
    thread = threading.Thread(target=f.run, daemon=True)
    thread.start()
    return f, thread, stop, lines


def wait_lines(lines, n):
    for _ in range(500):
        if len(lines) >= n:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"only {lines}")


def test_a_stream_that_ended_with_its_container_is_not_read_again():
    server = LogServer([Body([stamped(1, "a"), stamped(2, "b")])])
    pods = Pods(pod("running"))
    _, thread, stop, lines = follower(server, pods)
    wait_lines(lines, 2)
    pods.set(pod("terminated", phase="Succeeded"))
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and lines == ["a", "b"]
    assert len(server.requests) == 1 and server.requests[0]["follow"] == "true"


def test_stopping_mid_stream_reads_the_rest_from_the_cursor_without_repeats():
    hanging = Body([stamped(1, "a"), stamped(1, "b")], hang=True)
    rest = Body([stamped(1, "a"), stamped(1, "b"), stamped(2, "c")])  # sinceTime has second precision: a and b again
    server = LogServer([hanging, rest])
    f, thread, stop, lines = follower(server, Pods(pod("running")))
    wait_lines(lines, 2)
    stop.set()
    f.interrupt()
    thread.join(5)
    assert lines == ["a", "b", "c"]
    assert "follow" not in server.requests[1] and server.requests[1]["sinceTime"] == "2026-05-01T10:00:01Z"


def test_a_quiet_stream_that_times_out_resumes_from_its_cursor():
    timed_out = Body([stamped(1, "a")], then=urllib3.exceptions.ReadTimeoutError(None, "/log", "read timed out"))
    resumed = Body([stamped(1, "a"), stamped(7, "b")])
    server = LogServer([timed_out, resumed])
    pods = Pods(pod("running"))
    _, thread, stop, lines = follower(server, pods, read_timeout=0.5)
    wait_lines(lines, 2)
    pods.set(pod("terminated", phase="Succeeded"))
    stop.set()
    thread.join(5)
    assert lines == ["a", "b"]
    assert [r.get("sinceTime") for r in server.requests] == [None, "2026-05-01T10:00:01Z"]


def test_a_forbidden_log_is_reported_once_and_not_retried(caplog):
    said = 'pods "tj-node-0-0-abcde" is forbidden: User "u" cannot get resource "pods/log" in API group "" in the namespace "ns"'
    denied = api_error(403, {"reason": "Forbidden", "message": said})
    server = LogServer([denied])
    with caplog.at_level(logging.WARNING):
        _, thread, stop, _ = follower(server, Pods(pod("running")))
        thread.join(5)
    assert not thread.is_alive() and len(server.requests) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lacks the permission get on pods/log" in warnings[0]
    stop.set()


def test_a_restarted_container_first_seen_after_the_restart_shows_its_previous_log_first():
    server = LogServer([Body([stamped(1, "first try")]), Body([stamped(9, "second try")])])
    pods = Pods(pod("running", restarts=1))
    _, thread, stop, lines = follower(server, pods)
    wait_lines(lines, 2)
    pods.set(pod("terminated", restarts=1, phase="Succeeded"))
    stop.set()
    thread.join(5)
    assert lines == ["first try", "second try"]
    assert server.requests[0].get("previous") == "true" and server.requests[1].get("follow") == "true"


def test_a_finished_container_seen_only_after_the_job_ended_is_still_read():
    server = LogServer([Body([stamped(3, "all of it")])])
    pods = Pods()
    _, thread, stop, lines = follower(server, pods)
    stop.set()
    pods.set(pod("terminated", phase="Succeeded"))  # the pod watch trails the TrainJob's
    thread.join(5)
    assert lines == ["all of it"] and "follow" not in server.requests[0]


def test_lines_reach_the_sink_as_log_lines():
    assert LogLine("node-0", "x").text == "x"



def test_a_stream_left_open_after_its_container_terminated_is_cut_and_the_rest_read_before_the_job_ends():
    hanging = Body([stamped(1, "a"), stamped(1, "b")], hang=True)  # a kubelet may hold it open for seconds
    rest = Body([stamped(1, "a"), stamped(1, "b"), stamped(2, "c")])
    server = LogServer([hanging, rest])
    pods = Pods(pod("running"))
    f, thread, stop, lines = follower(server, pods)
    wait_lines(lines, 2)
    pods.set(pod("terminated", phase="Succeeded"))
    wait_lines(lines, 3)  # no stop: the terminated state alone ends the follow
    assert lines == ["a", "b", "c"] and hanging.closed.is_set()
    assert "follow" not in server.requests[1] and server.requests[1]["sinceTime"] == "2026-05-01T10:00:01Z"
    stop.set()
    f.pods.wake()
    thread.join(5)
    assert not thread.is_alive() and len(server.requests) == 2


def test_only_a_terminated_instance_or_a_gone_pod_counts_as_finished_for_cutting():
    assert _terminated(pod("terminated", phase="Succeeded"), ("p1", 0))
    assert _terminated(None, ("p1", 0)) and _terminated(pod("running", uid="p2"), ("p1", 0))
    assert not _terminated(pod("running"), ("p1", 0))
    assert not _terminated(pod("terminated", restarts=1), ("p1", 0))  # a restart: the next instance's log is another read


def test_any_sink_gets_the_lines_that_arrived_together_in_one_call():
    """One sink protocol: a plain function is handed batches (``LogLine.count``), as the step's printer is."""
    got: list[LogLine] = []
    server = LogServer([Body([stamped(1, "a") + stamped(1, "b") + stamped(2, "c")])])
    pods = Pods(pod("running"))
    f = NodeLogFollower(server, namespace="ns", job="tj", replicated_job="node", index=0, sink=got.append, stop=threading.Event(),
                        source="node-0", pods=pods, settle=5, sleep=lambda s: None)  # fmt: skip
    thread = threading.Thread(target=f.run, daemon=True)
    thread.start()
    for _ in range(500):
        if got:
            break
        threading.Event().wait(0.01)
    pods.set(pod("terminated", phase="Succeeded"))
    f.stop.set()
    thread.join(5)
    assert got == [LogLine("node-0", "a\nb\nc", 3)] and got[0].lines == ["a", "b", "c"]
