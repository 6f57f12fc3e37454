"""A create the Trainer's webhook refuses for a runtime it does not see yet is tried again, a few times, then refused."""

from __future__ import annotations

import pytest

from kfp_trainer.backends.kube import lifecycle
from kfp_trainer.backends.kube.apierrors import api_error
from kfp_trainer.backends.kube.discovery import runtime_not_seen
from kfp_trainer.cancel import Stop
from kfp_trainer.errors import RejectedError

NOT_SEEN = ('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.runtimeRef: Invalid value: '
            '{"name":"team-torch","apiGroup":"trainer.kubeflow.org","kind":"TrainingRuntime"}: TrainingRuntime.trainer.kubeflow.org '
            '"team-torch" not found: specified trainingRuntime must be created before the TrainJob is created')  # fmt: skip
MANIFEST = {"metadata": {"name": "train-x"}, "spec": {"runtimeRef": {"kind": "TrainingRuntime", "name": "team-torch"}}}


class Api:
    """Answers each create with the next of ``answers``: an error to raise, or the object made."""

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.calls = 0

    def request(self, method, path, **kwargs):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def refusal(message: str = NOT_SEEN, status: int = 422):
    return api_error(status, {"reason": "Invalid", "message": message})


@pytest.fixture
def slept(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr(Stop, "sleep", lambda self, seconds: pauses.append(seconds))
    return pauses


def test_a_runtime_the_webhook_sees_a_moment_later_gets_its_trainjob_created(slept):
    api = Api([refusal(), refusal(), {"metadata": {"name": "train-x", "uid": "u"}}])
    created = lifecycle.Lifecycle(api).create("ns", MANIFEST, stop=Stop())
    assert created["metadata"]["uid"] == "u" and api.calls == 3 and slept == [0.5, 1.0]


def test_a_runtime_the_webhook_never_sees_is_refused_after_a_few_seconds_naming_it(slept):
    api = Api([refusal() for _ in range(5)])
    with pytest.raises(RejectedError, match='TrainingRuntime.trainer.kubeflow.org "team-torch" not found'):
        lifecycle.Lifecycle(api).create("ns", MANIFEST, stop=Stop())
    assert api.calls == 5 and slept == list(lifecycle.RUNTIME_SEEN_WAITS)


def test_other_refusals_are_not_tried_again(slept):
    for answer in (refusal('admission webhook "x" denied the request: no GPUs on Sundays'),
                   refusal('TrainingRuntime.trainer.kubeflow.org "team-torch" not found'),  # not a webhook's words
                   refusal(NOT_SEEN.replace("team-torch", "other"))):  # fmt: skip
        api = Api([answer, {"metadata": {"name": "train-x"}}])
        with pytest.raises(RejectedError):
            lifecycle.Lifecycle(api).create("ns", MANIFEST, stop=Stop())
        assert api.calls == 1
    assert slept == []


def test_the_runtime_is_recognised_in_the_field_cause_as_well_as_in_the_message():
    words = 'ClusterTrainingRuntime.trainer.kubeflow.org "torch" not found'
    cause = {"field": "spec.runtimeRef", "reason": "FieldValueInvalid", "message": words}
    answer = api_error(422, {"reason": "Invalid", "message": 'admission webhook "v" denied the request: TrainJob is invalid',
                             "details": {"causes": [cause]}})  # fmt: skip
    assert runtime_not_seen(answer, "ClusterTrainingRuntime", "torch")
    assert not runtime_not_seen(answer, "TrainingRuntime", "torch")
    assert not runtime_not_seen(api_error(409, {"message": NOT_SEEN}), "TrainingRuntime", "team-torch")
    assert not runtime_not_seen(None, "TrainingRuntime", "team-torch")
