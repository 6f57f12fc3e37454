"""The container image the components run in, named in one place.

The published image has ``kfp-trainer`` (and so ``kfp``) installed, so the components
install nothing at start-up. Override it when compiling with ``kfp-trainer compile
--base-image IMG`` or the ``KFP_TRAINER_COMPONENT_IMAGE`` environment variable (read when
:mod:`kfp_trainer.components` is first imported).
"""

import os
from importlib import metadata

IMAGE_REPOSITORY = "ghcr.io/kubeflow/kfp-trainer"
IMAGE_ENV = "KFP_TRAINER_COMPONENT_IMAGE"


def _version() -> str:
    try:
        return metadata.version("kfp-trainer")
    except metadata.PackageNotFoundError:
        return "0.1.0"


DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{_version()}"
BASE_IMAGE = os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE

# The trainer image: the component image plus torch and transformers. Steps that load
# models in their own pod (evaluate_model) and the sample trainers run in it.
TRAINER_IMAGE_REPOSITORY = "ghcr.io/kubeflow/kfp-trainer-trainer"
TRAINER_IMAGE_ENV = "KFP_TRAINER_TRAINER_IMAGE"
DEFAULT_TRAINER_IMAGE = f"{TRAINER_IMAGE_REPOSITORY}:{_version()}"
TRAINER_IMAGE = os.environ.get(TRAINER_IMAGE_ENV) or DEFAULT_TRAINER_IMAGE
