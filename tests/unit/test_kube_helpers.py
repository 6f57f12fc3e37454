"""Pure helpers of the Kubernetes backend: error mapping, retries, log cursors, status classification."""

from __future__ import annotations

import pytest

from kfp_trainer.backends.base import RuntimeInfo, trainjob_status
from kfp_trainer.backends.kube.api import Conflict, Gone, NotFound, RetryPolicy, call
from kfp_trainer.backends.kube.apierrors import APIError, TransportError
from kfp_trainer.backends.kube.apierrors import api_error as answer
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import Credentials
from kfp_trainer.backends.kube.job import KubeJob
from kfp_trainer.backends.kube.logs import _Cursor
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import ForbiddenError, InfraError, KfpTrainerError, RejectedError
from kfp_trainer.jobstatus import Phase
from kfp_trainer.timestamps import parse_timestamp


def api_error(status: int, message: str = "boom", causes=None) -> APIError:
    return answer(status, {"kind": "Status", "reason": "Reason", "message": message, "details": {"causes": causes or []}})


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (api_error(422, "TrainJob is invalid", [{"field": "spec.foo", "message": "unknown field"}]), RejectedError),
        (api_error(400), RejectedError),
        (api_error(403), ForbiddenError),
        (api_error(401), ForbiddenError),
        (api_error(404), NotFound),
        (api_error(409), Conflict),
        (api_error(410), Gone),
    ],
)
def test_user_side_errors_are_mapped_and_not_retried(raised, expected):
    calls = []

    def fn():
        calls.append(1)
        raise raised

    with pytest.raises(expected) as info:
        call(fn, what="x", sleep=lambda s: None)
    assert len(calls) == 1
    assert info.value.answer is raised  # the server's status, reason and details stay with the error


def test_rejection_message_carries_the_field_causes():
    with pytest.raises(RejectedError, match=r"create x: TrainJob is invalid \(spec.foo: unknown field\)"):
        call(
            lambda: (_ for _ in ()).throw(api_error(422, "TrainJob is invalid", [{"field": "spec.foo", "message": "unknown field"}])),
            what="create x",
            sleep=lambda s: None,
        )


def test_forbidden_points_at_the_rbac_manifest():
    with pytest.raises(ForbiddenError, match="deploy/rbac.yaml"):
        call(lambda: (_ for _ in ()).throw(api_error(403)), what="x", sleep=lambda s: None)


@pytest.mark.parametrize(
    "raised",
    [
        api_error(500),
        api_error(503),
        api_error(429),
        TransportError("GET /x: connection reset"),
        TransportError("GET /x: connection refused"),
        TransportError("GET /x: read timed out"),
    ],
)
def test_transient_errors_are_retried_then_infra_error(raised):
    sleeps = []
    attempts = []

    def fn():
        attempts.append(1)
        raise raised

    with pytest.raises(InfraError):
        call(fn, what="x", policy=RetryPolicy(attempts=4, base=1), sleep=sleeps.append)
    assert len(attempts) == 4 and len(sleeps) == 3


def test_transient_then_success():
    results = iter([TransportError("reset"), "ok"])

    def fn():
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r

    assert call(fn, what="x", sleep=lambda s: None) == "ok"


def test_client_exceptions_never_leak():
    for raised in (api_error(418), TransportError("GET /x: read timed out")):
        with pytest.raises(KfpTrainerError):
            call(lambda r=raised: (_ for _ in ()).throw(r), what="x", policy=RetryPolicy(attempts=1), sleep=lambda s: None)


def test_timestamps():
    assert parse_timestamp("2026-12-02T10:00:00.5Z") == (parse_timestamp("2026-12-02T10:00:00Z")[0], 500_000_000)
    assert parse_timestamp("2026-12-02T10:00:00.123456789Z")[1] == 123456789
    assert parse_timestamp("hello") is None and parse_timestamp("2026-12-02 10:00:00") is None


def test_cursor_skips_what_was_shown_after_a_reconnect():
    t = [f"2026-12-02T10:00:0{i}.000000000Z".encode() for i in range(4)]
    cursor = _Cursor()
    cursor.start_read()
    # two lines share a timestamp
    assert cursor.take([t[0] + b" a", t[1] + b" b", t[1] + b" c"]) == [b"a", b"b", b"c"]
    # Reconnect: the server resends from the second of t[1], including the two lines already shown.
    cursor.start_read()
    assert cursor.take([t[1] + b" b", t[1] + b" c", t[1] + b" d", t[2] + b" e"]) == [b"d", b"e"]
    cursor.start_read()
    assert cursor.take([t[0] + b" a"]) == []
    assert cursor.take([b"no timestamp"]) == [b"no timestamp"]
    # a timestamp in another form (whole seconds) is parsed and compared as a time
    assert cursor.take([b"2026-12-02T10:00:03Z f", b"2026-12-02T10:00:02Z old"]) == [b"f"]


def test_trainjob_status_classification():
    def obj(conditions=(), jobs=(), suspend=False):
        return {"spec": {"suspend": suspend}, "status": {"conditions": list(conditions), "jobsStatus": list(jobs)}}

    assert trainjob_status(None).phase is Phase.DELETED
    assert trainjob_status(obj()).phase is Phase.PENDING
    assert trainjob_status(obj(jobs=[{"name": "node", "active": 1, "ready": 0}])).phase is Phase.PENDING
    assert trainjob_status(obj(jobs=[{"name": "node", "active": 1, "ready": 1}])).phase is Phase.RUNNING
    assert trainjob_status(obj(suspend=True)).phase is Phase.SUSPENDED
    done = trainjob_status(obj([{"type": "Complete", "status": "True", "reason": "AllJobsCompleted"}]))
    assert (done.phase, done.reason) == (Phase.SUCCEEDED, "AllJobsCompleted")
    failed = trainjob_status(
        obj([{"type": "Suspended", "status": "False"}, {"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])
    )
    assert (failed.phase, failed.reason) == (Phase.FAILED, "DeadlineExceeded")
    assert trainjob_status(obj([{"type": "Suspended", "status": "True", "reason": "Suspended"}])).phase is Phase.SUSPENDED


def test_each_submitted_job_keeps_the_runtime_it_was_rendered_for_in_its_own_handle(monkeypatch):
    backend = KubernetesBackend(Client(Credentials("http://127.0.0.1:9")), namespace="ns")
    made: dict = {}

    def create(namespace, manifest, *, stop):  # as the create request answers
        name = manifest["metadata"]["name"]
        meta = {"name": name, "namespace": namespace, "uid": f"u-{name}", "resourceVersion": "7", "creationTimestamp": "t0"}
        made[name] = {"metadata": meta}
        return made[name]

    monkeypatch.setattr(backend.lifecycle, "create", create)
    state = dict(vars(backend)), dict(vars(backend.lifecycle))
    mpi = RuntimeInfo(name="mpi", kind="ClusterTrainingRuntime", api_version="v2.2", replicated_jobs=(("launcher", 1), ("node", 2)))
    torch = RuntimeInfo(name="torch", kind="ClusterTrainingRuntime", api_version="v2.2", replicated_jobs=(("node", 4),))
    first = backend.submit({"metadata": {"name": "a"}}, runtime=mpi).job
    second = backend.submit({"metadata": {"name": "b"}}, runtime=torch).job
    assert isinstance(first, KubeJob) and isinstance(second, KubeJob)
    assert (first.runtime, first.trainer_job) == (mpi, "launcher") and (second.runtime, second.trainer_job) == (torch, "node")
    assert first.known is made["a"] and first.created == "t0" and first.ref.uid == "u-a"  # the watch starts from the job as created
    assert (dict(vars(backend)), dict(vars(backend.lifecycle))) == state  # the backend keeps nothing per job
    assert not any(value is backend for value in vars(first).values())  # and the handle reads nothing of it
