"""kfp-trainer: Kubeflow Pipelines components that run Kubeflow Trainer v2 TrainJobs.

The library behind the components, usable on its own:

    >>> from kfp_trainer import build_trainjob
    >>> manifest = build_trainjob(runtime="torch-distributed", run_id="r1", task_name="train")
    >>> manifest["kind"]
    'TrainJob'

The names below come from :mod:`kfp_trainer.spec` on first use, so that importing the
components (``kfp_trainer.components``) does not load the spec's models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spec.inputs import TrainJobInputs
    from .spec.render import build_trainjob, render

__all__ = ["TrainJobInputs", "build_trainjob", "render"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``TrainJobInputs``, ``build_trainjob`` and ``render`` from :mod:`kfp_trainer.spec`, imported when first asked for."""
    if name in __all__:
        from . import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
