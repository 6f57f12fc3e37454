r"""Post-training with Hugging Face TRL: supervised fine-tuning (``SFTTrainer``), DPO (``DPOTrainer``) or GRPO (``GRPOTrainer``).

Run one process per device with ``torchrun`` (what the ``kfp-trainer-trl`` runtime does), e.g.::

    torchrun -m kfp_trainer.trainers.trl_train dpo --model_name_or_path /workspace/model \\
        --dataset_name /workspace/dataset --output_dir /workspace/output --beta 0.1 --max_steps 40

The first argument is the method (``sft``, ``dpo`` or ``grpo``); the flags are TRL's own: those of
``SFTConfig``/``DPOConfig``/``GRPOConfig`` and ``ModelConfig`` (``--use_peft``, ``--lora_r``,
``--load_in_4bit``, ...), parsed with TRL's argument classes, so every flag of the installed TRL is
accepted.
``--dataset_name`` is a dataset folder or file read with :mod:`kfp_trainer.data` (split
``--dataset_train_split``, default ``train``): SFT reads prompt/completion, chat, instruction,
question/answer or input/output records (or preference pairs, learning the chosen answer);
DPO reads prompt/chosen/rejected pairs (:func:`kfp_trainer.data.load_preference_split`); GRPO reads
prompts and the columns its rewards read (:func:`kfp_trainer.data.load_prompt_split`), its reward
functions given as JSON in ``--rewards`` (:mod:`kfp_trainer.llm.rewards`: built-ins by name, and
the pipeline's own functions, shipped as source). A reward function that fails, or returns what
is not one finite number per completion, ends the run with its name and the sample.

* **Checkpoints and resume.** Checkpoints go to ``<output_dir>/checkpoint-<step>`` every
  ``--save_steps`` steps (default 50, the newest two kept). A run that finds one there (a
  retried step's TrainJob, or a restarted pod) resumes from the newest, says so on stdout
  (``{"resumed_from_step": N}``) and records it in ``training_info.json``. The checkpoints are
  removed once the final model is saved.
* **Output.** A full fine-tune saves the model; a LoRA run saves the merged model at the top
  and the adapter in ``adapter/``; a QLoRA run (``--load_in_4bit``: needs CUDA and
  bitsandbytes, refused otherwise) saves the adapter alone. With the tokenizer and
  ``training_info.json`` (method, weights, steps, loss, settings).
* **Progress.** Rank 0 prints each log as a JSON line (``{"step": 10, "loss": 1.2, ...}``; GRPO's
  ``rewards/<name>/mean`` and ``/std``, ``reward``, ``kl``, ``completions/mean_length``,
  ``clip_ratio/...``) and reports the fraction done to the Trainer's status server when there is one
  (:class:`~kfp_trainer.progress.ProgressReporter`).
* **GRPO's completions.** Rank 0 keeps the last batch it scored: ``completions.jsonl`` in the
  output folder holds up to 16 prompts, completions and each reward's value.

On CPU, ``bf16`` is off and ``use_cpu`` on unless the flags say otherwise; ``--bf16`` without a
GPU that supports it is refused.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

METHODS = ("sft", "dpo", "grpo")
DEFAULT_SAVE_STEPS = 50
DEFAULT_LOGGING_STEPS = 10
KEPT_CHECKPOINTS = 2
#: What GRPO's logs keep (TRL logs some 25 values a step): each reward's mean and spread, their weighted sum, KL,
#: completion length, clipping; the rest (token counts, min/max lengths, step times) stays out of the metrics.
GRPO_LOGGED = ("loss", "learning_rate", "reward", "reward_std", "kl", "entropy", "completions/mean_length",
               "completions/clipped_ratio", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean", "epoch")  # fmt: skip


def logged(method: str, name: str) -> bool:
    """Whether a value TRL logged is printed as a metric (everything but GRPO's extra counters).

    Example:
        >>> [n for n in ("rewards/exact_answer/mean", "num_tokens", "kl", "step_time") if logged("grpo", n)]
        ['rewards/exact_answer/mean', 'kl']
    """
    return method != "grpo" or name in GRPO_LOGGED or (name.startswith("rewards/") and name.endswith(("/mean", "/std")))


@dataclasses.dataclass
class DataArgs:
    """The dataset and what to do with an adapter (the flags TRL's classes do not have)."""

    dataset_name: str = dataclasses.field(metadata={"help": "dataset folder or file (see kfp_trainer.data)"})
    dataset_train_split: str = dataclasses.field(default="train", metadata={"help": "split to train on"})
    merge_adapter: bool = dataclasses.field(default=True, metadata={"help": "LoRA: save the merged model next to adapter/"})
    rewards: str = dataclasses.field(default="", metadata={"help": "GRPO: the reward functions, as JSON (kfp_trainer.llm.rewards)"})


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, item in enumerate(argv):
        if item == f"--{name}":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            return "true" if not nxt or nxt.startswith("--") else nxt
        if item.startswith(f"--{name}="):
            return item.split("=", 1)[1]
    return None


def _true(value: str | None) -> bool:
    return str(value).lower() in ("true", "1", "yes", "y")


def prepare_argv(method: str, argv: list[str], *, cuda: bool, bf16_ok: bool, bitsandbytes: bool) -> list[str]:
    """The flags with this machine's defaults added; refuses what it cannot run.

    Example:
        >>> prepare_argv("sft", ["--output_dir", "o"], cuda=False, bf16_ok=False, bitsandbytes=False)
        ['--output_dir', 'o', '--report_to', 'none', '--disable_tqdm', 'true', '--save_steps', '50', '--save_total_limit', '2', \
'--logging_steps', '10', '--use_cpu', 'true', '--bf16', 'false']

    Raises:
        SystemExit: An unknown method, bf16 or QLoRA on a machine that cannot run them.
    """
    if method not in METHODS:
        raise SystemExit(f"trl_train: method {method!r} is not one of {', '.join(METHODS)}")
    out = list(argv)
    defaults = {"report_to": "none", "disable_tqdm": "true", "save_steps": str(DEFAULT_SAVE_STEPS),
                "save_total_limit": str(KEPT_CHECKPOINTS), "logging_steps": str(DEFAULT_LOGGING_STEPS)}  # fmt: skip
    for name, value in defaults.items():
        if _flag_value(out, name) is None:
            out += [f"--{name}", value]
    if _true(_flag_value(out, "bf16")) and not bf16_ok:
        raise SystemExit("trl_train: bf16 needs a GPU that supports bfloat16, and this node has none; set bf16=false")
    if _true(_flag_value(out, "load_in_4bit")):
        missing = [what for what, ok in (("CUDA (a GPU)", cuda), ("the bitsandbytes package", bitsandbytes)) if not ok]
        if missing:
            raise SystemExit(f"trl_train: QLoRA (load_in_4bit) needs {' and '.join(missing)}, which this node lacks; "
                             "train a LoRA adapter (use_peft) instead")  # fmt: skip
    if not cuda:
        if _flag_value(out, "use_cpu") is None:
            out += ["--use_cpu", "true"]
        if _flag_value(out, "bf16") is None:
            out += ["--bf16", "false"]
    return out


def last_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    """The newest complete ``checkpoint-<step>`` folder under ``output_dir`` (with its trainer state)."""
    found = []
    root = Path(output_dir)
    for child in root.iterdir() if root.is_dir() else []:
        step = child.name.removeprefix("checkpoint-")
        if child.is_dir() and step.isdecimal() and (child / "trainer_state.json").is_file():
            found.append((int(step), child))
    return max(found) if found else None


def _callback(env: Any, reporter: Any, method: str) -> Any:
    from transformers import TrainerCallback

    from kfp_trainer.trainers._common import emit

    class Progress(TrainerCallback):
        """JSON lines on stdout and progress to the status server, from rank 0."""

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            if not env.is_main or not logs:
                return
            kept = {k: v for k, v in logs.items() if logged(method, k) or k.startswith("train_")}
            record = {"step": state.global_step, **{k: round(float(v), 6) for k, v in kept.items() if isinstance(v, (int, float))}}
            emit(record)
            if state.max_steps and state.global_step < state.max_steps:
                shown = {k: record[k] for k in ("loss", "learning_rate", "rewards/margins", "rewards/accuracies", "reward") if k in record}
                reporter.report_step(state.global_step, state.max_steps, shown)

    return Progress()


def _dataset(method: str, data: DataArgs, tokenizer: Any, log: Any) -> Any:
    from datasets import Dataset

    from kfp_trainer.data import DatasetError, chat_renderer, load_preference_split, load_split

    read = load_preference_split if method == "dpo" else load_split
    try:
        records = read(data.dataset_name, data.dataset_train_split, render_chat=chat_renderer(tokenizer), log=log)
    except DatasetError as e:
        raise SystemExit(f"trl_train: {e}") from None
    return Dataset.from_list(records)


def _rewards(data: DataArgs, log: Any, recorder: Any) -> tuple[Any, list[Any], list[float]]:
    """GRPO's prompt dataset, reward functions and weights; a clear exit for anything wrong with them."""
    from datasets import Dataset

    from kfp_trainer.data import DatasetError
    from kfp_trainer.errors import UserError
    from kfp_trainer.llm.rewards import build, check_rewards, prompt_records

    if not data.rewards:
        raise SystemExit("trl_train: grpo needs --rewards (a JSON list of reward functions: kfp_trainer.llm.rewards)")
    try:
        specs = check_rewards(data.rewards)
        records, columns = prompt_records(data.dataset_name, data.dataset_train_split, specs, log=log)
        functions, weights = build(specs, columns=columns, recorder=recorder)
    except (DatasetError, UserError) as e:
        raise SystemExit(f"trl_train: {e}") from None
    log(f"rewards: {', '.join(f'{s.name} x {s.weight:g}' for s in specs)}")
    return Dataset.from_list(records), functions, weights


def _save(trainer: Any, tokenizer: Any, out: Path, *, adapter: bool, quantized: bool, merge: bool) -> str:
    """Save the final model; the weights it holds (``full``, ``adapter`` or ``merged``)."""
    from kfp_trainer.trainers._common import save_tokenizer

    model = trainer.model
    if not adapter:
        model.save_pretrained(str(out), safe_serialization=True)
        weights = "full"
    elif quantized or not merge:
        model.save_pretrained(str(out), safe_serialization=True)
        weights = "adapter"
    else:
        model.save_pretrained(str(out / "adapter"), safe_serialization=True)
        model.merge_and_unload().save_pretrained(str(out), safe_serialization=True)
        weights = "merged"
    save_tokenizer(tokenizer, out)
    return weights


def train(method: str, argv: list[str]) -> dict[str, Any]:
    """Run SFT, DPO or GRPO with the parsed flags (see the module docstring); the summary."""
    import torch
    from transformers import AutoModelForCausalLM, HfArgumentParser, PrinterCallback
    from transformers.utils import logging as hf_logging
    from trl import (
        DPOConfig,
        DPOTrainer,
        GRPOConfig,
        GRPOTrainer,
        ModelConfig,
        SFTConfig,
        SFTTrainer,
        get_peft_config,
        get_quantization_config,
    )

    from kfp_trainer.progress import ProgressReporter
    from kfp_trainer.trainers._common import cpu_threads, dist_env, emit, load_tokenizer

    hf_logging.disable_progress_bar()
    cuda = torch.cuda.is_available()
    argv = prepare_argv(method, argv, cuda=cuda, bf16_ok=cuda and torch.cuda.is_bf16_supported(),
                        bitsandbytes=importlib.util.find_spec("bitsandbytes") is not None)  # fmt: skip
    config_class, trainer_class = {"dpo": (DPOConfig, DPOTrainer), "grpo": (GRPOConfig, GRPOTrainer)}.get(method, (SFTConfig, SFTTrainer))
    dataclass_types: tuple[Any, ...] = (DataArgs, config_class, ModelConfig)  # transformers types these as NewType("DataClassType", Any)
    data, config, model_args = HfArgumentParser(dataclass_types).parse_args_into_dataclasses(argv)
    env = dist_env()
    from kfp_trainer.tracking.trainer import log_params  # the step's MLflow run, from rank 0 (if any)

    log_params({"method": method, **dataclasses.asdict(data), **dataclasses.asdict(model_args), **config.to_sanitized_dict()},
               trainer="kfp_trainer.trainers.trl_train")  # fmt: skip

    def log(message: str) -> None:
        if env.is_main:
            print(f"trl_train: {message}", file=sys.stderr, flush=True)

    if not model_args.model_name_or_path:
        raise SystemExit("trl_train: --model_name_or_path (the model folder) is required")
    quantized = bool(model_args.load_in_4bit or model_args.load_in_8bit)
    adapter = bool(model_args.use_peft or quantized)
    if adapter:
        model_args.use_peft = True
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    kwargs: dict[str, Any] = {"quantization_config": get_quantization_config(model_args)} if quantized else {}
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    if not cuda:
        model = model.float()
        torch.set_num_threads(cpu_threads(None, env.local_world_size, sum(p.numel() for p in model.parameters())))
    from kfp_trainer.llm.rewards import Recorder, RewardError

    recorder = Recorder() if env.is_main else None
    extra: dict[str, Any] = {}
    if method == "grpo":
        dataset, extra["reward_funcs"], config.reward_weights = _rewards(data, log, recorder)
    else:
        dataset = _dataset(method, data, tokenizer, log)
    trainer = trainer_class(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                            peft_config=get_peft_config(model_args) if adapter else None, **extra)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    reporter = ProgressReporter()
    trainer.add_callback(_callback(env, reporter, method))

    found = last_checkpoint(config.output_dir)
    resumed = found[0] if found else 0
    if found:
        log(f"resuming from {found[1]} (step {found[0]}) left by an earlier run")
        if env.is_main:
            emit({"resumed_from_step": found[0]})
    log(f"{method}: {len(dataset)} records, world size {env.world_size}, {'LoRA adapter' if adapter else 'full weights'}"
        f"{' on a 4-bit base' if quantized else ''}, device {'cuda' if cuda else 'cpu'}")  # fmt: skip
    try:
        result = trainer.train(resume_from_checkpoint=str(found[1]) if found else None)
    except RewardError as e:  # a user's reward function: its name and the sample, not TRL's traceback
        raise SystemExit(f"trl_train: {e}") from None
    summary = {"train_loss": round(float(result.training_loss), 6), "train_steps": int(result.global_step),
               "train_runtime": round(float(result.metrics.get("train_runtime", 0.0)), 3), "world_size": env.world_size}  # fmt: skip
    if env.is_main:
        out = Path(config.output_dir)
        weights = _save(trainer, tokenizer, out, adapter=adapter, quantized=quantized, merge=data.merge_adapter)
        info = {
            "base_model": model_args.model_name_or_path, "dataset": data.dataset_name, "method": method, "framework": "trl",
            "weights": "adapter" if weights != "full" else "full", "merged_model": weights == "merged",
            "format": "safetensors", "steps": summary["train_steps"], "train_loss": summary["train_loss"],
            "world_size": env.world_size, **({"resumed_from_step": resumed} if resumed else {}),
            "hyperparameters": {"learning_rate": config.learning_rate, "per_device_train_batch_size": config.per_device_train_batch_size,
                                "num_train_epochs": config.num_train_epochs, "max_steps": config.max_steps, "seed": config.seed,
                                **({"beta": config.beta} if method in ("dpo", "grpo") else {}),
                                **({"num_generations": config.num_generations, "max_completion_length": config.max_completion_length,
                                    "temperature": config.temperature, "loss_type": config.loss_type} if method == "grpo" else {}),
                                **({"lora_r": model_args.lora_r, "lora_alpha": model_args.lora_alpha} if adapter else {})},
        }  # fmt: skip
        if method == "grpo" and recorder is not None:
            reward_weights = config.reward_weights or []
            named = zip(extra["reward_funcs"], reward_weights, strict=False)
            info["rewards"] = [{"name": getattr(f, "__name__", ""), "weight": w} for f, w in named]
            samples = recorder.samples()
            (out / "completions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
            info["completion_samples"] = len(samples)
        (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
        for step_dir in out.glob("checkpoint-*"):
            shutil.rmtree(step_dir, ignore_errors=True)
        emit(summary)
        reporter.report_fraction(1.0, {k: summary[k] for k in ("train_loss", "train_steps")})
        log(f"saved the {weights} model to {out}")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: ``<sft|dpo|grpo> --flag value ...``.

    Returns:
        The exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    train(argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
