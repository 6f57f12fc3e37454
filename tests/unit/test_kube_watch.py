"""The watch loop against scripted server answers (event streams as constants, no sleeps)."""

from __future__ import annotations

import json

import pytest
import urllib3

from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kube.apierrors import TransportError, api_error
from kfp_trainer.backends.kube.client import ListStats, Stream
from kfp_trainer.backends.kube.watch import Handle, wait_gone, watch
from kfp_trainer.errors import InfraError

POD = {"metadata": {"name": "p", "uid": "u1", "resourceVersion": "10"}}
LIST = {"items": [POD], "metadata": {"resourceVersion": "10"}}
EXPIRED = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version: 1 (269)"}}


class Body:
    """A streamed HTTP body: its chunks, then an end or a dropped connection."""

    def __init__(self, events=(), *, drop: bool = False) -> None:
        self.chunks = [json.dumps(e).encode() + b"\n" for e in events]
        self.drop = drop

    def stream(self, amt=None, decode_content=True):
        yield from self.chunks
        if self.drop:
            raise urllib3.exceptions.ProtocolError("Connection broken: reset by peer")

    def release_conn(self):
        pass

    def close(self):
        pass

    def shutdown(self):
        pass


class FakeApi:
    """Answers each request from a script: a dict (list body), a Body (watch, read by the client's Stream), or an exception."""

    def __init__(self, script) -> None:
        self.script = list(script)
        self.requests: list[dict] = []
        self.lists = ListStats()

    def request(self, method, path, *, query=None, stream=False, **kwargs):
        self.requests.append({"path": path, "method": method, **{k: str(v) for k, v in dict(query or []).items()}})
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return Stream(answer, f"{method} {path}") if stream else answer


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def test_a_410_in_the_stream_relists_and_resumes_from_the_new_version():
    api = FakeApi(
        [Body([EXPIRED]), LIST, Body([{"type": "MODIFIED", "object": {**POD, "metadata": {**POD["metadata"], "resourceVersion": "11"}}}])]
    )
    events = take(watch(api, "/x", [], resource_version="1", sleep=lambda s: None), 2)
    assert events[0] == ("LIST", {"items": [POD]})
    assert events[1][0] == "MODIFIED"
    assert [r.get("resourceVersion") for r in api.requests] == ["1", None, "10"]
    assert api.requests[1].get("watch") is None  # the second request is the list


def test_hours_of_reconnects_never_exhaust_the_failure_budget():
    # Each stream opens fine, then the connection is cut (a proxy's idle timeout): 50 times in a row.
    policy = RetryPolicy(attempts=3, base=0.01)
    api = FakeApi([Body([], drop=True) for _ in range(50)] + [Body([{"type": "MODIFIED", "object": POD}])])
    sleeps: list[float] = []
    first = next(e for e in watch(api, "/x", [], resource_version="5", policy=policy, sleep=sleeps.append) if e is not None)
    assert first[0] == "MODIFIED" and len(sleeps) == 50


def test_failures_in_a_row_give_up_with_an_infra_error():
    policy = RetryPolicy(attempts=3, base=0.01)
    refused = TransportError("GET /x: connection refused")
    api = FakeApi([refused] * 3)
    with pytest.raises(InfraError, match="gave up after 2 failed reconnects"):
        list(watch(api, "/x", [], resource_version="5", policy=policy, sleep=lambda s: None))


def test_bookmarks_advance_the_version_without_being_yielded():
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}
    api = FakeApi([Body([bookmark]), Body([{"type": "DELETED", "object": POD}])])
    events = take(watch(api, "/x", [], resource_version="5", sleep=lambda s: None), 2)
    assert events == [None, ("DELETED", POD)]
    assert api.requests[1]["resourceVersion"] == "42"


def test_a_closed_handle_ends_the_watch():
    handle = Handle()
    api = FakeApi([Body([{"type": "ADDED", "object": POD}])])
    stream = watch(api, "/x", [], resource_version="5", handle=handle)
    assert next(stream)[0] == "ADDED"
    handle.close()
    assert list(stream) == []


def test_wait_gone_returns_once_the_watch_sees_the_deletion():
    api = FakeApi([LIST, Body([{"type": "DELETED", "object": POD}])])
    assert wait_gone(api, "/x", [], timeout=30) == []
    assert [r["method"] for r in api.requests] == ["GET", "GET"] and api.requests[1]["watch"] == "true"


def test_wait_gone_reports_what_is_left_when_time_runs_out():
    ticks = iter([0.0, 0.0, 31.0, 31.0])
    api = FakeApi([LIST, Body([{"type": "MODIFIED", "object": POD}])])
    left = wait_gone(api, "/x", [], timeout=30, clock=lambda: next(ticks))
    assert [o["metadata"]["name"] for o in left] == ["p"]


def test_wait_gone_only_waits_for_the_objects_it_keeps():
    api = FakeApi([LIST])
    assert wait_gone(api, "/x", [], timeout=30, keep=lambda o: o["metadata"]["uid"] == "another") == []
    assert len(api.requests) == 1


def initial_events_end(version: str) -> dict:
    return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version, "annotations": {"k8s.io/initial-events-end": "true"}}}}


def test_a_streaming_list_takes_one_request_where_list_and_watch_took_two():
    other = {"metadata": {"name": "q", "uid": "u2", "resourceVersion": "7"}}
    changed = {**POD, "metadata": {**POD["metadata"], "resourceVersion": "13"}}
    api = FakeApi([Body([{"type": "ADDED", "object": POD}, {"type": "ADDED", "object": other}, initial_events_end("12"),
                         {"type": "MODIFIED", "object": changed}])])  # fmt: skip
    events = take(watch(api, "/x", [("labelSelector", "a=b")], initial_events=True, sleep=lambda s: None), 2)
    assert events == [("LIST", {"items": [POD, other]}), ("MODIFIED", changed)]
    assert len(api.requests) == 1
    assert api.requests[0]["watch"] == "true" and api.requests[0]["sendInitialEvents"] == "true"
    assert api.requests[0]["resourceVersionMatch"] == "NotOlderThan" and api.requests[0]["labelSelector"] == "a=b"


def test_a_stream_cut_before_the_initial_events_end_starts_the_list_again_and_resumes_from_the_marker():
    api = FakeApi([Body([{"type": "ADDED", "object": POD}], drop=True), Body([{"type": "ADDED", "object": POD}, initial_events_end("12")]),
                   Body([{"type": "DELETED", "object": POD}])])  # fmt: skip
    events = [e for e in take(watch(api, "/x", [], initial_events=True, sleep=lambda s: None), 3) if e is not None]
    assert events[0] == ("LIST", {"items": [POD]}) and events[1][0] == "DELETED"
    assert [r.get("sendInitialEvents") for r in api.requests] == ["true", "true", None]
    assert api.requests[2]["resourceVersion"] == "12"  # not the version of an object of the initial list


def test_a_server_that_refuses_streaming_lists_is_listed_from_then_on():
    said = 'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: not enabled'
    refused = api_error(422, {"reason": "Invalid", "message": said})
    api = FakeApi([refused, LIST, Body([EXPIRED]), LIST, Body([])])
    events = [e for e in take(watch(api, "/x", [], initial_events=True, sleep=lambda s: None), 3) if e is not None]
    assert events == [("LIST", {"items": [POD]}), ("LIST", {"items": [POD]})]
    assert [(r.get("watch"), r.get("sendInitialEvents")) for r in api.requests] == [
        ("true", "true"), (None, None), ("true", None), (None, None), ("true", None)]  # fmt: skip
