"""How the API server's refusals reach the user: whose fault, what to do, never retried when retrying cannot help."""

from __future__ import annotations

import pytest

from kfp_trainer.backends.kube.api import call
from kfp_trainer.backends.kube.apierrors import APIError, api_error
from kfp_trainer.backends.kube.discovery import version_mismatch
from kfp_trainer.errors import ForbiddenError, RejectedError


def refused(status: int, message: str, reason: str = "x") -> APIError:
    return api_error(status, {"kind": "Status", "reason": reason, "message": message})


def attempts_until_error(raised: APIError):
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
    hint = version_mismatch(refused(400, f'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: {message}', "BadRequest"))
    assert (advice in hint) if advice else hint is None


def test_only_a_strict_decoding_refusal_is_read_as_a_version_mismatch():
    said = 'admission webhook "x" denied the request: unknown field "spec.runtimePatches" is what someone typed'
    assert version_mismatch(refused(403, said)) is None
    assert version_mismatch(refused(400, said)) is None
    assert version_mismatch(None) is None
