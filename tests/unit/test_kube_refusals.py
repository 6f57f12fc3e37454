"""How the API server's refusals reach the user: whose fault, what to do, never retried when retrying cannot help."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from kfp_trainer.backends.kube.api import call
from kfp_trainer.backends.kube.discovery import version_mismatch
from kfp_trainer.errors import ForbiddenError, RejectedError


def refused(status: int, message: str) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "message": message})
    return e


def attempts_until_error(raised: ApiException):
    calls = []

    def fn():
        calls.append(1)
        raise raised

    with pytest.raises(Exception) as info:
        call(fn, what="create TrainJob ns/x", sleep=lambda s: None)
    return info.value, len(calls)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (403, 'admission webhook "validate.trainjob.trainer.kubeflow.org" denied the request: runtime "x" not found'),
        (400, 'admission webhook "gatekeeper.sh" denied the request: [no-gpus] GPUs need an approved budget'),
        (422, "trainjobs.trainer.kubeflow.org \"x\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: no"),
        (403, 'trainjobs.trainer.kubeflow.org "x" is forbidden: exceeded quota: q, requested: count/trainjobs=1, used: 5, limited: 5'),
    ],
)
def test_policy_refusals_carry_the_policys_words_and_no_rbac_advice(status, message):
    error, attempts = attempts_until_error(refused(status, message))
    assert type(error) is RejectedError and attempts == 1
    assert message in str(error) and "refused by the cluster's policy" in str(error)
    assert "rbac" not in str(error).lower()


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "etcdserver: request is too large"),
        (500, "rpc error: code = ResourceExhausted desc = trying to send message larger than max (2098831 vs. 2097152)"),
        (413, "Request entity too large: limit is 3145728"),
    ],
)
def test_size_refusals_are_the_users_to_fix_and_never_retried(status, message):
    error, attempts = attempts_until_error(refused(status, message))
    assert isinstance(error, RejectedError) and error.exit_code == 2 and attempts == 1
    assert "too large" in str(error) and "volume or the pipeline workspace" in str(error)


def test_an_rbac_denial_names_the_missing_permission():
    message = (
        'pods "p" is forbidden: User "system:serviceaccount:kubeflow:pipeline-runner" '
        'cannot get resource "pods/log" in API group "" in the namespace "kubeflow"'
    )
    error, attempts = attempts_until_error(refused(403, message))
    assert isinstance(error, ForbiddenError) and attempts == 1
    assert "lacks the permission get on pods/log" in str(error) and "deploy/rbac.yaml" in str(error)


def test_an_ordinary_server_error_is_still_retried():
    error, attempts = attempts_until_error(refused(500, "etcdserver: leader changed"))
    assert error.exit_code == 3 and attempts == 8


@pytest.mark.parametrize(
    ("message", "advice"),
    [
        ('strict decoding error: unknown field "spec.podTemplateOverrides"', "use api_version auto or v2.2"),
        ('strict decoding error: unknown field "spec.labels", unknown field "spec.podTemplateOverrides"', "use api_version auto or v2.2"),
        ('strict decoding error: unknown field "spec.runtimePatches"', "use api_version auto or v2.1"),
        ('strict decoding error: unknown field "spec.trainer.numNode"', None),
    ],
)
def test_a_manifest_for_the_other_trainer_api_gets_a_clear_hint(message, advice):
    hint = version_mismatch(message)
    assert (advice in hint) if advice else hint is None
