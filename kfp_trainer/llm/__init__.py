"""The LLM trainer path: torchtune runtimes (BuiltinTrainer), TRL runtimes, checkpoints.

A function run as ``CustomTrainer`` is rendered by :mod:`kfp_trainer.custom_trainer`; trainers
report progress with :mod:`kfp_trainer.progress`.

Modules:
    inputs: typed, validated settings (torchtune, LoRA, dataset preprocessing, initializers, CustomTrainer).
    runtimes: what a (Cluster)TrainingRuntime object says about its trainer (framework, command).
    render: torchtune settings -> the TrainJob inputs of the kubeflow SDK 0.5.0's BuiltinTrainer job. Pure.
    tune_command: the Trainer controller's composition of the effective ``tune run`` command. Pure.
    local_tune: a torchtune runtime's command -> command and env to run it on this machine.
    cpu_compat: local-only patches that let torchtune's distributed recipes run on CPU.
    checkpoints: latest complete torchtune checkpoint in an output dir -> resume overrides.
    tune_output: a torchtune output dir's loss log as metric points; checks of extra overrides.
    trl_config: TRL settings (KEP-626 TRLConfig names), checked, rendered as the trainer's arguments. Pure.
    rewards: GRPO's reward functions: built-ins, the user's own shipped as source, checked. Standard library only.
    trl_runtime: the kfp-trainer-trl ClusterTrainingRuntime (deploy/trl-runtime.yaml, built in locally).
    tiny_models: offline tiny models/tokenizers/datasets of the torchtune runtimes' architectures.
"""
