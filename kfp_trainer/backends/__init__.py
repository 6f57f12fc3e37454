"""Backends: places that run TrainJobs (a Kubernetes cluster, this machine).

Example:
    >>> backend = select_backend("local")   # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from .base import Backend

BACKEND_ENV = "KFP_TRAINER_BACKEND"


def select_backend(kind: str = "auto", **kwargs: Any) -> Backend:
    """The backend named by ``kind``: ``local``, ``kubernetes``, or ``auto``.

    ``auto`` reads ``KFP_TRAINER_BACKEND`` (set by ``kfp-trainer run --local``) and
    otherwise uses the cluster. It never falls back to local when a cluster is unreachable.

    Raises:
        ValueError: Unknown ``kind``.
    """
    chosen = os.environ.get(BACKEND_ENV, "kubernetes") if kind in ("auto", "") else kind
    if chosen == "local":
        from .local import LocalBackend

        return LocalBackend(**kwargs)
    if chosen == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend.from_config(**kwargs)
    from ..errors import ValidationError

    raise ValidationError("backend", kind, "auto, local or kubernetes")
