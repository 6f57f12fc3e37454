"""Which way a watch listed (a streaming list, a list request, a refused streaming list) is
counted on its client (``api.lists``); the version-skew integration tests read it."""

from __future__ import annotations

from test_kube_watch import LIST, POD, Body, FakeApi, initial_events_end, take

from kfp_trainer.backends.kube.apierrors import api_error
from kfp_trainer.backends.kube.watch import streaming_lists_refused, watch


def counted(api, run) -> dict[str, int]:
    run()
    return {k: n for k, n in api.lists.counts.items() if n}


def test_a_streaming_list_is_counted_as_streaming():
    api = FakeApi([Body([{"type": "ADDED", "object": POD}, initial_events_end("12")])])
    assert counted(api, lambda: take(watch(api, "/x", [], initial_events=True, sleep=lambda s: None), 1)) == {"streaming": 1}
    assert not streaming_lists_refused(api)


def test_a_refused_streaming_list_is_counted_and_remembered_for_the_client():
    gate = "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
    refused = api_error(422, {"reason": "Invalid", "message": gate})
    api = FakeApi([refused, LIST])
    assert counted(api, lambda: take(watch(api, "/x", [], initial_events=True, sleep=lambda s: None), 1)) == {"refused": 1, "list": 1}
    assert streaming_lists_refused(api)
    assert not streaming_lists_refused(FakeApi([]))  # per client: another server is asked again


def test_a_watch_without_initial_events_counts_its_list():
    api = FakeApi([LIST])
    assert counted(api, lambda: take(watch(api, "/x", [], sleep=lambda s: None), 1)) == {"list": 1}
