"""KFP components of kfp-trainer: thin definitions over the library.

    from kfp_trainer.components import dataset_initializer, model_initializer, train_job, evaluate_model
    from kfp_trainer.components import torchtune_finetune, trainjob_component
    from kfp_trainer.components import trl_finetune, reward, evaluate_preferences
    from kfp_trainer.components import register_model

Each module here imports only the standard library and ``kfp`` at its top level; what a
component does at run time lives in :mod:`kfp_trainer.steps`. A call with literal arguments
runs the step's checks on them at once, so mistakes fail while the pipeline is built
(:mod:`.calls`). ``workspace_config`` makes a
pipeline workspace the KFP backend accepts. Compiled YAML of every
component is in ``components/<name>/component.yaml`` (``kfp-trainer compile``).
"""

from ._image import BASE_IMAGE, DEFAULT_IMAGE, DEFAULT_TRAINER_IMAGE, TRAINER_IMAGE
from .calls import with_run_context
from .evaluate import evaluate_model
from .finetune import torchtune_finetune
from .function import trainjob_component
from .initializers import dataset_initializer, model_initializer
from .loading import load_component_from_file, load_component_from_url
from .preference import evaluate_preferences
from .registry import register_model
from .train_job import TASK_CONFIG_PASSTHROUGHS, train_job
from .trl import reward, trl_finetune
from .workspace import workspace_config

# name -> component, in the order the generated files list them
COMPONENTS = {
    "train_job": train_job,
    "torchtune_finetune": torchtune_finetune,
    "trl_finetune": trl_finetune,
    "dataset_initializer": dataset_initializer,
    "model_initializer": model_initializer,
    "evaluate_model": evaluate_model,
    "evaluate_preferences": evaluate_preferences,
    "register_model": register_model,
}

__all__ = [
    "BASE_IMAGE",
    "COMPONENTS",
    "DEFAULT_IMAGE",
    "DEFAULT_TRAINER_IMAGE",
    "TASK_CONFIG_PASSTHROUGHS",
    "TRAINER_IMAGE",
    "dataset_initializer",
    "evaluate_model",
    "evaluate_preferences",
    "load_component_from_file",
    "load_component_from_url",
    "model_initializer",
    "register_model",
    "reward",
    "torchtune_finetune",
    "train_job",
    "trainjob_component",
    "trl_finetune",
    "with_run_context",
    "workspace_config",
]
