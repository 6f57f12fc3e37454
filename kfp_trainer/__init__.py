"""kfp-trainer: Kubeflow Pipelines components that run Kubeflow Trainer v2 TrainJobs.

The library behind the components, usable on its own:

    >>> from kfp_trainer import build_trainjob
    >>> manifest = build_trainjob(runtime="torch-distributed", run_id="r1", task_name="train")
    >>> manifest["kind"]
    'TrainJob'
"""

from .spec import TrainJobInputs, build_trainjob, render

__all__ = ["TrainJobInputs", "build_trainjob", "render"]
__version__ = "0.1.0"
