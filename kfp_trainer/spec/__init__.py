"""What a user can ask of a TrainJob, validated, and the manifest it renders to. Pure: no I/O.

* :mod:`~kfp_trainer.spec.inputs` -- :class:`TrainJobInputs` (the ``train_job`` component's
  inputs), the Trainer API's names and the size limits;
* :mod:`~kfp_trainer.spec.rules`, :mod:`~kfp_trainer.spec.env_rules`,
  :mod:`~kfp_trainer.spec.pod_fields` and :mod:`~kfp_trainer.spec.validate` -- :func:`validate`
  checks every input at once and raises :class:`~kfp_trainer.errors.InvalidSpecErrors`
  naming each bad field, its value (secret-like values hidden) and what is allowed;
* :mod:`~kfp_trainer.spec.policy` -- what the rendered job may contain once the ``patch``
  is merged: the launcher's own fields kept, no credentials, no host access
  (:mod:`~kfp_trainer.spec.host_access`) unless the cluster admin allows it, a size the API
  server accepts;
* :mod:`~kfp_trainer.spec.manifest` -- the one builder of the manifest, unchecked, under
  both :mod:`~kfp_trainer.spec.validate` and :mod:`~kfp_trainer.spec.render`;
* :mod:`~kfp_trainer.spec.render` -- :func:`render` turns valid inputs into a
  ``trainer.kubeflow.org/v1alpha1`` TrainJob for Trainer v2.2+ (``runtimePatches``) or
  v2.1 (``podTemplateOverrides``).

Example:
    >>> inputs = TrainJobInputs(runtime="torch-distributed", num_nodes=2,
    ...                         run_id="run-1", task_name="train")
    >>> manifest = render(inputs, api_version="v2.2")
    >>> manifest["spec"]["trainer"]["numNodes"]
    2
"""

from ..dicts import dig
from ..redaction import find_secret, is_secret_name, redact_text, redact_uri, scrub
from .inputs import (
    ALLOW_HOST_ACCESS_ANNOTATION,
    ANNOTATION_RUN,
    ANNOTATION_TASK,
    API_VERSION,
    API_VERSIONS,
    DATASET_SCHEMES,
    GROUP,
    INITIALIZER_JOBS,
    LABEL_DIGEST,
    LABEL_MANAGED_BY,
    LABEL_PIPELINE,
    LABEL_PREFIX,
    LABEL_RUN,
    LABEL_SCOPE,
    LABEL_TASK,
    LOCAL_SCHEMES,
    MANAGER,
    MANAGERS,
    MAX_MANIFEST_BYTES,
    MAX_NODES,
    MAX_VALUE_BYTES,
    MODEL_SCHEMES,
    MULTIKUEUE,
    PLURAL,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RESERVED_ENV_PREFIXES,
    TRAINER_CONTROLLER,
    TRAINER_JOBS,
    VERSION,
    ApiVersion,
    TrainJobInputs,
    env_list,
)
from .manifest import deep_merge, lineage_labels, pod_targets, resolve_name
from .options import check_launch_options
from .policy import check_manifest
from .render import build_trainjob, render
from .validate import validate

__all__ = [
    "ALLOW_HOST_ACCESS_ANNOTATION",
    "ANNOTATION_RUN",
    "ANNOTATION_TASK",
    "API_VERSION",
    "API_VERSIONS",
    "DATASET_SCHEMES",
    "GROUP",
    "INITIALIZER_JOBS",
    "LABEL_DIGEST",
    "LABEL_MANAGED_BY",
    "LABEL_PIPELINE",
    "LABEL_SCOPE",
    "LABEL_PREFIX",
    "LABEL_RUN",
    "LABEL_TASK",
    "LOCAL_SCHEMES",
    "MANAGER",
    "MANAGERS",
    "MAX_MANIFEST_BYTES",
    "MAX_NODES",
    "MAX_VALUE_BYTES",
    "MODEL_SCHEMES",
    "MULTIKUEUE",
    "PLURAL",
    "PRIORITY_LABEL",
    "QUEUE_LABEL",
    "RESERVED_ENV_PREFIXES",
    "TRAINER_CONTROLLER",
    "TRAINER_JOBS",
    "VERSION",
    "ApiVersion",
    "TrainJobInputs",
    "build_trainjob",
    "check_launch_options",
    "check_manifest",
    "deep_merge",
    "dig",
    "env_list",
    "find_secret",
    "is_secret_name",
    "lineage_labels",
    "pod_targets",
    "redact_text",
    "redact_uri",
    "render",
    "resolve_name",
    "scrub",
    "validate",
]
