"""The LLM trainer path: torchtune runtimes (BuiltinTrainer), TRL runtimes, CustomTrainer rendering, checkpoints, progress.

Modules:
    inputs: typed, validated settings (torchtune, LoRA, dataset preprocessing, initializers, CustomTrainer).
    runtimes: what a (Cluster)TrainingRuntime object says about its trainer (framework, command).
    render: settings -> the TrainJob spec pieces the kubeflow SDK 0.5.0 renders. Pure.
    tune_command: the Trainer controller's composition of the effective ``tune run`` command. Pure.
    local_tune: a torchtune runtime's command -> command and env to run it on this machine.
    cpu_compat: local-only patches that let torchtune's distributed recipes run on CPU.
    checkpoints: latest complete torchtune checkpoint in an output dir -> resume overrides.
    tune_output: a torchtune output dir's loss log as metric points; checks of extra overrides.
    progress: report progress to the Trainer v2.3 status server (stdlib only).
    trl_config: TRL settings (KEP-626 TRLConfig names), checked, rendered as the trainer's arguments. Pure.
    trl_runtime: the kfp-trainer-trl ClusterTrainingRuntime (deploy/trl-runtime.yaml, built in locally).
    tiny_models: offline tiny models/tokenizers/datasets of the torchtune runtimes' architectures.
"""
