"""Experiment tracking and the model registry in MLflow, through its REST API (standard library only).

* :mod:`.settings` -- which server, experiment and run a step logs into (KFP's MLflow plugin's
  variables, or the component's ``mlflow_*`` inputs), and what its trainer nodes are told;
* :mod:`.client` -- the REST client (no ``mlflow`` package: the component image stays light);
* :mod:`.step` -- the launcher's side: the step's run, the TrainJob, times, final metrics, report;
* :mod:`.trainer` -- the trainers' side: params, per-step metrics and system tags from rank 0;
* :mod:`.registry` -- a model version of an approved model, its lineage and alias.

Nothing is imported here, so that ``import kfp_trainer.tracking.settings`` costs what that module costs.
See ``docs/mlflow.md``.
"""
