"""Waiting for a deleted TrainJob's pods looks again once they are gone: the Job controller can
replace pods of a Job already deleted (its cache lags), and those orphans count as left over."""

from __future__ import annotations

import time

from kfp_trainer.backends.kube import lifecycle
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import Credentials
from kfp_trainer.jobstatus import JobRef


def test_pods_made_just_after_the_last_one_went_are_waited_for(monkeypatch):
    orphan = {"metadata": {"name": "train-x-node-0-0-new", "uid": "u2"}}
    calls: list[str] = []

    def wait_gone(api, path, selectors, *, timeout, keep, stop=None):
        kind = path.rsplit("/", 1)[-1]
        calls.append(kind)
        if kind == "pods" and calls.count("pods") == 2:
            return [orphan]  # appeared after the first look found none, still there at the bound
        return []

    monkeypatch.setattr(lifecycle, "wait_gone", wait_gone)
    monkeypatch.setattr(lifecycle, "POD_SETTLE", 0.01)
    life = lifecycle.Lifecycle(Client(Credentials("http://127.0.0.1:9")))
    left = life._wait_tree(JobRef("ns", "train-x", "u1"), time.monotonic() + 5, tree=True)
    assert calls == ["trainjobs", "jobsets", "jobs", "pods", "pods"]
    assert [(x.kind, x.name) for x in left] == [("Pod", "train-x-node-0-0-new")]


def test_no_second_look_once_the_bound_has_passed(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(lifecycle, "wait_gone", lambda api, path, selectors, *, timeout, keep, stop=None: calls.append(path) or [])
    life = lifecycle.Lifecycle(Client(Credentials("http://127.0.0.1:9")))
    assert life._wait_tree(JobRef("ns", "train-x", "u1"), time.monotonic() - 1, tree=True) == []
    assert len(calls) == 4
