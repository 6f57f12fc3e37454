"""The container images the components run in, named in one place.

The project publishes two images per release, built from ``deploy/Dockerfile.component``
and ``deploy/Dockerfile.trainer`` by the release workflow and tagged with the package
version:

* ``ghcr.io/kfp-trainer/kfp-trainer:<version>`` -- the launcher components (no torch);
* ``ghcr.io/kfp-trainer/kfp-trainer-trainer:<version>`` -- adds torch, transformers and peft.

Build your own with ``make images REGISTRY=<registry>/<namespace>`` and point the compiled
YAML at them with ``kfp-trainer compile --base-image IMG --trainer-image IMG``, or set
``KFP_TRAINER_REGISTRY`` (both images under another namespace) or
``KFP_TRAINER_COMPONENT_IMAGE`` / ``KFP_TRAINER_TRAINER_IMAGE`` (read when
:mod:`kfp_trainer.components` is first imported).
"""

import os
from importlib import metadata

REGISTRY = "ghcr.io/kfp-trainer"
REGISTRY_ENV = "KFP_TRAINER_REGISTRY"
COMPONENT_IMAGE_NAME = "kfp-trainer"
TRAINER_IMAGE_NAME = "kfp-trainer-trainer"
IMAGE_ENV = "KFP_TRAINER_COMPONENT_IMAGE"
TRAINER_IMAGE_ENV = "KFP_TRAINER_TRAINER_IMAGE"


def _version() -> str:
    try:
        return metadata.version("kfp-trainer")
    except metadata.PackageNotFoundError:
        return "0.1.0"


VERSION = _version()
IMAGE_REPOSITORY = f"{REGISTRY}/{COMPONENT_IMAGE_NAME}"
TRAINER_IMAGE_REPOSITORY = f"{REGISTRY}/{TRAINER_IMAGE_NAME}"
DEFAULT_IMAGE = f"{IMAGE_REPOSITORY}:{VERSION}"
DEFAULT_TRAINER_IMAGE = f"{TRAINER_IMAGE_REPOSITORY}:{VERSION}"

_registry = (os.environ.get(REGISTRY_ENV) or REGISTRY).rstrip("/")
BASE_IMAGE = os.environ.get(IMAGE_ENV) or f"{_registry}/{COMPONENT_IMAGE_NAME}:{VERSION}"
# The trainer image: the component image plus torch and transformers. Steps that load
# models in their own pod (evaluate_model) and the sample trainers run in it.
TRAINER_IMAGE = os.environ.get(TRAINER_IMAGE_ENV) or f"{_registry}/{TRAINER_IMAGE_NAME}:{VERSION}"
