"""Training programs that run inside TrainJobs (or locally under ``torchrun``).

* :mod:`kfp_trainer.trainers.builtin`: offline ``builtin://`` datasets and models
  (:mod:`kfp_trainer.trainers.prebuilt`: written ahead of time, for an image without torch).
* :mod:`kfp_trainer.trainers.sft`: supervised fine-tuning of a causal LM (DDP).
* :mod:`kfp_trainer.trainers.trl_train`: SFT or DPO with Hugging Face TRL (LoRA, QLoRA, resume).
* :mod:`kfp_trainer.trainers.evaluate`: loss, perplexity and exact match.
* :mod:`kfp_trainer.trainers.preference_eval`: preference win rate and DPO reward margin.
* :mod:`kfp_trainer.trainers.allreduce`: distributed smoke test.
* :mod:`kfp_trainer.trainers.checkpointing`: checkpoints in the output dir, and resuming from them.

Importing this package (or any of its modules) loads only the standard library;
torch and transformers are imported when a program runs.
"""
