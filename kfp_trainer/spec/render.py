"""Valid inputs -> the TrainJob manifest for the Trainer API the cluster serves. Pure: no I/O.

* ``v2.2`` (Trainer v2.2 and later): pod settings go into ``spec.runtimePatches``;
* ``v2.1``: pod settings go into ``spec.podTemplateOverrides`` and JobSet labels into
  ``spec.labels`` / ``spec.annotations``.

:func:`render` runs the one check-and-build :func:`~kfp_trainer.spec.validate.validate` runs too
(:func:`~kfp_trainer.spec.validate.checked_build`: every input rule, then the job built once and
checked once the ``patch`` is merged, :mod:`kfp_trainer.spec.policy`), here with the runtime's
facts, so what it returns is safe to send.

Example:
    >>> from kfp_trainer.spec import TrainJobInputs
    >>> manifest = render(TrainJobInputs(runtime="torch-distributed", num_nodes=2, run_id="run-1", task_name="train"))
    >>> manifest["spec"]["trainer"]["numNodes"]
    2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidSpecErrors
from .inputs import ApiVersion, TrainJobInputs
from .validate import checked_build


def render(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion = "v2.2",
    runtime_jobs: list[str] | None = None,
    max_name_length: int | None = None,
    local: bool = False,
    allow_host_access: bool = False,
    init_containers: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Validate ``inputs`` and render the TrainJob manifest for ``api_version``.

    Args:
        inputs: What to run.
        api_version: ``"v2.2"`` (runtimePatches, Trainer v2.2+) or ``"v2.1"``
            (podTemplateOverrides).
        runtime_jobs: Replicated job names of the referenced runtime, when known.
        max_name_length: Name budget for the runtime, when known.
        local: Render for the local backend (accepts ``builtin://`` and ``file://`` URIs).
        allow_host_access: The runtime allows host access (hostPath volumes, privileged
            containers, host namespaces and ports); see :mod:`kfp_trainer.spec.policy`.
        init_containers: The runtime's init container names per replicated job, when known:
            ``init_containers`` inputs must name one of them (the Trainer API patches only those).

    Returns:
        The TrainJob as a dict, ready for ``kubectl apply`` or the API.

    Raises:
        InvalidSpecErrors: Any input is invalid, or the merged ``patch`` breaks the policy
            (all problems listed).
    """
    manifest, errors = checked_build(
        inputs, api_version=api_version, local=local, allow_host_access=allow_host_access, runtime_jobs=runtime_jobs,
        max_name_length=max_name_length, init_containers=init_containers,
    )  # fmt: skip
    if errors or manifest is None:
        raise InvalidSpecErrors(errors)
    return manifest


def build_trainjob(*, api_version: ApiVersion = "v2.2", **inputs: Any) -> dict[str, Any]:
    """Render the TrainJob manifest from the same inputs the ``train_job`` component takes.

    Numbers and booleans in ``command``, ``args`` and ``env`` values become text, as the
    component makes them (:func:`~kfp_trainer.spec.inputs.normalize_values`).

    Example:
        >>> m = build_trainjob(runtime="torch-distributed", run_id="r1", task_name="train",
        ...                    num_nodes=2, env={"EPOCHS": 3}, args=["--lr", 0.1])
        >>> m["spec"]["trainer"]["env"], m["spec"]["trainer"]["args"]
        ([{'name': 'EPOCHS', 'value': '3'}], ['--lr', '0.1'])
    """
    return render(TrainJobInputs.parse(**inputs), api_version=api_version)
