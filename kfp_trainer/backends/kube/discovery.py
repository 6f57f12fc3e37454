"""What the cluster offers: the API client, the default namespace, the Trainer API, the runtimes.

The Trainer API version decides how the TrainJob is rendered (``runtimePatches`` since v2.2,
``podTemplateOverrides`` in v2.1). It is found with one small request: a server-side
dry-run create of a TrainJob carrying an empty ``runtimePatches`` under strict field
validation. The server decodes the body before anything else it does; a v2.1 API answers
"unknown field spec.runtimePatches", a v2.2+ API gets past decoding (to an admission answer or
a dry-run success, nothing stored). When the dry run is not allowed, the TrainJob schema is
read from the OpenAPI v3 document (about 1 MB). The backend asks once and keeps the answer.

Example:
    >>> api = load_api_client()                          # doctest: +SKIP
    >>> detect_api_version(api, namespace="kubeflow")    # doctest: +SKIP
    'v2.2'
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote

from ...errors import ForbiddenError, InfraError, RejectedError, RuntimeNotFoundError, UserError
from ...spec import API_VERSION, GROUP, PLURAL, VERSION, ApiVersion, TrainJobInputs
from ..base import RuntimeInfo
from ..owner import SA_NAMESPACE
from .api import NotFound, RetryPolicy, call
from .apierrors import APIError
from .client import Client
from .credentials import context_namespace, load

log = logging.getLogger(__name__)
PROBE_RUNTIME = "kfp-trainer-api-probe"
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> Client:
    """An API client from the pod's service account, else from a kubeconfig (see :mod:`.credentials`)."""
    return Client(load(kubeconfig, context))


def default_namespace() -> str:
    """The launcher pod's own namespace, else the kubeconfig context's, else ``default``."""
    if SA_NAMESPACE.exists():
        return SA_NAMESPACE.read_text().strip()
    try:
        return context_namespace()
    except Exception:  # noqa: BLE001 -- an unreadable kubeconfig
        return "default"


def detect_api_version(
    api: Client, *, namespace: str, policy: RetryPolicy = RetryPolicy(), runtime: tuple[str, str] | None = None
) -> ApiVersion:
    """The Trainer API the cluster serves: ``v2.2`` (runtimePatches) or ``v2.1`` (podTemplateOverrides).

    A server-side dry run of a tiny TrainJob answers it (nothing is stored). It names
    ``runtime`` (kind, name) when given -- the runtime the job will use -- so the Trainer's
    validating webhook has no reason to deny the probe.

    Raises:
        UserError: The cluster serves no TrainJob kind, or neither field.
    """
    return _probe(api, namespace, policy, runtime or ("ClusterTrainingRuntime", PROBE_RUNTIME)) or _from_openapi(api, policy)


def _probe(api: Client, namespace: str, policy: RetryPolicy, runtime: tuple[str, str]) -> ApiVersion | None:
    kind, name = runtime
    body = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"generateName": "kfp-trainer-api-probe-"},
        "spec": {"runtimeRef": {"apiGroup": GROUP, "kind": kind, "name": name}, "runtimePatches": []},
    }
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    query = [("dryRun", "All"), ("fieldValidation", "Strict")]
    try:
        call(api.request, "POST", path, query=query, body=body, timeout=(10, 30), what="probe the Trainer API (dry run)", policy=policy)
        return "v2.2"
    except RejectedError as e:  # decoding came first: only an unknown field says v2.1
        return "v2.1" if "spec.runtimePatches" in unknown_fields(e.answer) else "v2.2"
    except (ForbiddenError, NotFound, InfraError, UserError) as e:
        log.info("Trainer API probe inconclusive (%s); reading the OpenAPI schema", e)
        return None


def _from_openapi(api: Client, policy: RetryPolicy) -> ApiVersion:
    try:
        doc = call(
            api.request,
            "GET",
            f"/openapi/v3/apis/{GROUP}/{VERSION}",
            timeout=30,
            headers={"Accept-Encoding": "gzip"},
            what="read the Trainer OpenAPI schema",
            policy=policy,
        )
    except NotFound:
        raise UserError(f"The cluster serves no TrainJob kind in {GROUP}/{VERSION}: is Kubeflow Trainer installed?") from None
    schemas = ((doc or {}).get("components") or {}).get("schemas") or {}
    for key, schema in schemas.items():
        if key.endswith(".TrainJob"):
            fields = ((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
            if "runtimePatches" in fields:
                return "v2.2"
            if "podTemplateOverrides" in fields:
                return "v2.1"
            raise UserError(
                "The cluster's TrainJob API has neither runtimePatches (Trainer v2.2+) nor podTemplateOverrides (v2.1); "
                "set api_version explicitly."
            )
    raise UserError(f"The cluster serves no TrainJob kind in {GROUP}/{VERSION}: is Kubeflow Trainer installed?")


def unknown_fields(answer: APIError | None) -> set[str]:
    """The fields a strict decoding refusal (400 ``BadRequest``) names as unknown; empty for any other answer.

    The server lists them only in its message (``strict decoding error: unknown field "spec.x", ...``).

    Example:
        >>> from .apierrors import api_error
        >>> sorted(unknown_fields(api_error(400, {"reason": "BadRequest",
        ...     "message": 'TrainJob in version "v1alpha1" cannot be handled as a TrainJob: strict decoding error: '
        ...                'unknown field "spec.labels", unknown field "spec.podTemplateOverrides"'})))
        ['spec.labels', 'spec.podTemplateOverrides']
    """
    if answer is None or answer.status not in (400, 422) or "strict decoding error" not in answer.message:
        return set()
    return set(_UNKNOWN_FIELD.findall(answer.message))


def version_mismatch(answer: APIError | None) -> str | None:
    """A clear message when a create was refused because the manifest targets the other Trainer API.

    Example:
        >>> from .apierrors import api_error
        >>> version_mismatch(api_error(400, {"reason": "BadRequest",
        ...     "message": 'strict decoding error: unknown field "spec.podTemplateOverrides"'}))[:40]
        'this cluster serves Trainer v2.2 or late'
    """
    fields = unknown_fields(answer)
    if fields & {"spec.podTemplateOverrides", "spec.labels", "spec.annotations"}:
        return (
            "this cluster serves Trainer v2.2 or later, which removed podTemplateOverrides and top-level labels/annotations; "
            "use api_version auto or v2.2"
        )
    if fields & {"spec.runtimePatches", "spec.activeDeadlineSeconds"}:
        return "this cluster serves Trainer v2.1, which has no runtimePatches or activeDeadlineSeconds; use api_version auto or v2.1"
    if any(f.endswith("terminationGracePeriodSeconds") for f in fields):
        return "this cluster serves Trainer v2.2, whose runtimePatches have no terminationGracePeriodSeconds (v2.3+); leave it unset"
    if "spec.podSpecOverrides" in fields:
        return "the manifest targets Trainer v2.0, which this cluster does not serve; use api_version auto"
    return None


def runtime_not_seen(answer: APIError | None, kind: str, name: str) -> bool:
    """Whether a create was refused by a webhook that does not know the runtime ``kind``/``name`` (yet).

    The Trainer's webhook looks the runtime up in its controller's cache, which learns of a
    runtime a moment after the API server stored it: a runtime made just before the TrainJob
    (read by the launcher, so it exists) can be refused as not found. The webhook says so only
    in words, in its message or in the field cause for ``spec.runtimeRef``.

    Example:
        >>> from .apierrors import api_error
        >>> runtime_not_seen(api_error(422, {"reason": "Invalid", "message": 'admission webhook "validator.trainjob.trainer.kubeflow.org" '
        ...     'denied the request: spec.runtimeRef: Invalid value: {...}: TrainingRuntime.trainer.kubeflow.org "team" not found'}),
        ...     "TrainingRuntime", "team")
        True
    """
    if answer is None or answer.status not in (400, 403, 422):
        return False
    words = re.compile(r"(?<![A-Za-z])" + re.escape(f'{kind}.{GROUP} "{name}" not found'))  # not ClusterTrainingRuntime for TrainingRuntime
    texts = [answer.message] + [c.get("message", "") for c in answer.causes if c.get("field") == "spec.runtimeRef"]
    return "denied the request" in answer.message and any(words.search(text) for text in texts)


def available_runtimes(api: Client, namespace: str, *, policy: RetryPolicy) -> list[str]:
    """``Kind/name`` of every runtime visible from ``namespace`` (notes where listing is not allowed)."""
    names = []
    for kind, path in (
        ("ClusterTrainingRuntime", f"/apis/{GROUP}/{VERSION}/clustertrainingruntimes"),
        ("TrainingRuntime", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trainingruntimes"),
    ):
        try:
            items = call(api.request, "GET", path, timeout=(10, 60), what=f"list {kind}s", policy=policy).get("items") or []
        except UserError:
            names.append(f"({kind}s: not allowed to list)")
            continue
        names += [f"{kind}/{i['metadata']['name']}" for i in items]
    return names


def resolve_runtime(api: Client, inputs: TrainJobInputs, *, namespace: str, api_version: ApiVersion, policy: RetryPolicy) -> RuntimeInfo:
    """Fetch the referenced runtime; raise :class:`RuntimeNotFoundError` listing those that exist."""
    name = quote(inputs.runtime, safe="")
    if inputs.runtime_kind == "TrainingRuntime":
        path, what = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trainingruntimes/{name}", f"{namespace}/{inputs.runtime}"
    else:
        path, what = f"/apis/{GROUP}/{VERSION}/clustertrainingruntimes/{name}", inputs.runtime
    try:
        runtime: dict[str, Any] = call(api.request, "GET", path, timeout=(10, 60), what=f"get {inputs.runtime_kind} {what}", policy=policy)
    except NotFound:
        available = available_runtimes(api, namespace, policy=policy)
        raise RuntimeNotFoundError(
            f"runtime: {inputs.runtime_kind} {inputs.runtime!r} does not exist"
            + (f" in namespace {namespace}" if inputs.runtime_kind == "TrainingRuntime" else "")
            + f". Available: {', '.join(available) or 'none (is Kubeflow Trainer installed?)'}"
        ) from None
    return RuntimeInfo.from_runtime(
        runtime, name=inputs.runtime, kind=inputs.runtime_kind, api_version=api_version, num_nodes=inputs.num_nodes
    )
