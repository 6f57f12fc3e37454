"""What each component does at run time, on plain values and artifact-like objects.

The KFP component functions in :mod:`kfp_trainer.components` only collect their inputs and
call one function here, one module per component:

* :mod:`.train_job` -- ``train_job`` and ``trainjob_component`` components: one TrainJob, and the
  mechanism typed trainers plug into;
* :mod:`.step_types` -- the step's artifacts and options, the typed-trainer contract;
* :mod:`.arguments` -- the components' input values sorted into the steps' arguments;
* :mod:`.finetune` -- ``torchtune_finetune``: a torchtune runtime's fine-tune, its model, its resume
  (:mod:`.finetune_inputs`: its inputs sorted into settings, sources and TrainJob inputs);
* :mod:`.checks` -- what the steps check before touching anything, also run when a pipeline is built;
* :mod:`.trl` -- ``trl_finetune``: TRL's SFT or DPO in a TRL runtime's TrainJob, its model, its resume;
* :mod:`.preference` -- ``evaluate_preferences``: preference win rate and reward margin, the gate verdict;
* :mod:`.initializers` -- ``dataset_initializer`` / ``model_initializer``;
* :mod:`.evaluate` -- ``evaluate_model``: LM metrics and the gate verdict;
* :mod:`.function` -- ``trainjob_component`` components: a Python function run as the SDK's CustomTrainer;
* :mod:`.classify` -- classifier evaluation (metrics and a confusion matrix);
* :mod:`.sweep` -- choosing the best of several trained models;
* :mod:`.common` -- log lines, exit codes and the stop token of a step, the KFP run identity, files on shared volumes.

Artifacts are duck-typed (``.path``, ``.uri``, ``.metadata``, ``.log_metric``), so no module
here imports KFP or torch at module level and each can be tested without a pipeline.
"""

from .arguments import function_job_arguments, train_job_inputs, trl_arguments
from .classify import run_classifier_evaluation
from .common import (
    copy_dir,
    dir_stats,
    exit_on_error,
    finite,
    identity_from_uri,
    log,
    model_metadata,
    resolve_identity,
    resolve_scope,
    run_step,
    scope_from_uri,
    shared_dir,
    stage,
    unresolved,
)
from .evaluate import compare, read_metrics_artifact, run_evaluate, run_lm_eval
from .finetune import run_torchtune_finetune
from .finetune_inputs import torchtune_finetune_arguments
from .function import run_function_job
from .initializers import run_initializer
from .preference import run_preference_eval
from .step_types import StepArtifacts, StepOptions
from .sweep import run_select_best
from .train_job import run_train_job
from .trl import run_trl_finetune

__all__ = [
    "StepArtifacts",
    "StepOptions",
    "compare",
    "copy_dir",
    "dir_stats",
    "exit_on_error",
    "finite",
    "function_job_arguments",
    "identity_from_uri",
    "log",
    "model_metadata",
    "read_metrics_artifact",
    "resolve_identity",
    "resolve_scope",
    "scope_from_uri",
    "run_evaluate",
    "run_initializer",
    "run_step",
    "run_preference_eval",
    "run_trl_finetune",
    "trl_arguments",
    "run_lm_eval",
    "run_classifier_evaluation",
    "run_select_best",
    "run_function_job",
    "run_torchtune_finetune",
    "run_train_job",
    "shared_dir",
    "stage",
    "torchtune_finetune_arguments",
    "train_job_inputs",
    "unresolved",
]
