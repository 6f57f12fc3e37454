r"""Supervised fine-tuning of a Hugging Face causal language model.

Run one process per device with ``torchrun``, for example::

    torchrun --nnodes 1 --nproc-per-node 2 -m kfp_trainer.trainers.sft \\
        --model-dir /workspace/model --dataset-dir /workspace/dataset \\
        --output-dir /workspace/output --max-steps 2500 --time-budget-seconds 90

or as a single plain ``python -m kfp_trainer.trainers.sft ...`` process.

The dataset directory is read with :func:`kfp_trainer.data.load_split` (split ``train``): JSONL,
JSON, CSV, parquet or ``save_to_disk`` arrow files, as ``<split>.<ext>``, a Hugging Face Hub
snapshot (``data/train-00000-of-00001-*.parquet``) or ``<split>/`` folders, with records of
prompt/completion, chat ``messages``, Alpaca instruction/input/output, question/answer or
input/output shape (:mod:`kfp_trainer.data` lists the templates). A dataset with neither test
nor validation split leaves a deterministic 5% slice of train out of training: the test split
``evaluate_model`` reads. The loss is computed on the completion tokens (and EOS) only. Each
rank trains on its own shard of every epoch's shuffle, gradients are averaged
with DistributedDataParallel (gloo on CPU, nccl on CUDA).

Every ``--checkpoint-steps`` steps rank 0 saves a checkpoint in the output directory
(:mod:`kfp_trainer.trainers.checkpointing`); a run that finds one saved with the same settings
(a retried or restarted TrainJob) continues from it and records ``resumed_from_step`` in
``training_info.json``.

Rank 0 prints JSON lines to stdout: one per logging interval, e.g.
``{"step": 20, "epoch": 0.4, "loss": 1.23, "learning_rate": 0.001}``, and a
final summary with ``train_loss``, ``train_runtime``, ``train_steps`` and
``world_size``. It then saves the model and tokenizer with ``save_pretrained``
(safetensors) and a ``training_info.json`` to the output directory.

Defaults are tuned for ``builtin://models/tiny-char-lm`` on
``builtin://datasets/addition``; pass a smaller ``--learning-rate`` for
pretrained models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from kfp_trainer.data import DatasetError, chat_renderer, load_split
from kfp_trainer.llm.progress import ProgressReporter
from kfp_trainer.trainers import checkpointing
from kfp_trainer.trainers._common import (
    collate,
    cpu_threads,
    dist_env,
    emit,
    encode_examples,
    load_tokenizer,
    processes_on_this_host,
    save_tokenizer,
)

DEFAULT_MAX_STEPS = 2500
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BATCH_SIZE = 16
DEFAULT_WARMUP_STEPS = 50
DEFAULT_LOGGING_STEPS = 50
DEFAULT_SEED = 42
DEFAULT_CHECKPOINT_STEPS = 100
# Ranks agree on the elapsed time (for the time budget) every this many steps.
TIME_SYNC_STEPS = 10


def build_parser() -> argparse.ArgumentParser:
    """Builds the command line parser.

    Returns:
        The parser.
    """
    p = argparse.ArgumentParser(
        prog="python -m kfp_trainer.trainers.sft",
        description="Supervised fine-tuning of a causal LM on a prompt/completion, chat or instruction dataset.",
    )
    p.add_argument("--model-dir", required=True, help="Hugging Face model directory to start from")
    p.add_argument("--dataset-dir", required=True, help="dataset folder or file; its train split is read (see kfp_trainer.data)")
    p.add_argument("--output-dir", required=True, help="where rank 0 saves the trained model")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="optimizer steps (default %(default)s)")
    p.add_argument(
        "--time-budget-seconds",
        type=float,
        default=None,
        help="stop training after this many seconds, whatever the step count; the learning rate schedule follows whichever limit is nearer",
    )
    p.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE, help="peak learning rate (default %(default)s)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="global examples per optimizer step, split evenly over the processes (default %(default)s)",
    )
    p.add_argument("--warmup-steps", type=int, default=DEFAULT_WARMUP_STEPS, help="linear warmup steps (default %(default)s)")
    p.add_argument("--min-lr-ratio", type=float, default=0.05, help="final learning rate as a fraction of the peak")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default %(default)s)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm; 0 disables")
    p.add_argument("--max-length", type=int, default=1024, help="truncate examples to this many tokens")
    p.add_argument("--logging-steps", type=int, default=DEFAULT_LOGGING_STEPS, help="print metrics every N steps")
    p.add_argument(
        "--num-threads",
        type=int,
        default=None,
        help="CPU threads per process (default: usable CPUs divided by the processes on this machine; 1 for models under 5M parameters)",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed for shuffling and initialisation")
    p.add_argument(
        "--checkpoint-steps",
        type=int,
        default=DEFAULT_CHECKPOINT_STEPS,
        help="save a checkpoint in the output dir every N steps, and resume from one found there (default %(default)s; 0: never)",
    )
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (needs the peft package) instead of all weights")
    p.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (default %(default)s)")
    p.add_argument("--lora-alpha", type=int, default=16, help="LoRA alpha (default %(default)s)")
    p.add_argument("--lora-target-modules", default="all-linear", help="comma separated module names, or all-linear")
    return p


def lr_at(step: int, progress: float, peak: float, warmup_steps: int, min_lr_ratio: float) -> float:
    """Learning rate after linear warmup and cosine decay.

    Args:
        step: Zero-based index of the step about to run.
        progress: Fraction of training done, 0 to 1 (by steps or by time).
        peak: Peak learning rate.
        warmup_steps: Steps of linear warmup.
        min_lr_ratio: Final learning rate as a fraction of the peak.

    Returns:
        The learning rate for this step.
    """
    warmup = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    progress = min(1.0, max(0.0, progress))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * warmup * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def _wrap_lora(model: Any, args: argparse.Namespace) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise SystemExit("--lora needs the 'peft' package, which is not installed (pip install peft)") from e
    targets: str | list[str] = args.lora_target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in str(targets).split(",") if t.strip()]
    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the fine-tuning on this process.

    Args:
        args: Parsed command line arguments (see :func:`build_parser`).

    Returns:
        The final summary (``train_loss``, ``train_runtime``, ``train_steps``,
        ``world_size``, ...), identical on every rank.
    """
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    env = dist_env()
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    distributed = env.world_size > 1
    if distributed:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    host_processes = processes_on_this_host(env)

    def log(message: str) -> None:
        if env.is_main:
            print(f"sft: {message}", file=sys.stderr, flush=True)

    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    # float32 master weights whatever the checkpoint's dtype (bf16 autocast on CUDA).
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).float()
    model.config.use_cache = False
    if args.lora:
        model = _wrap_lora(model, args)
    model.to(device)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    if not use_cuda:
        torch.set_num_threads(cpu_threads(args.num_threads, host_processes, n_total))

    try:
        records = load_split(args.dataset_dir, "train", render_chat=chat_renderer(tokenizer), log=log)
    except DatasetError as e:
        raise SystemExit(f"sft: {e}") from None
    examples = encode_examples(tokenizer, records, max_length=args.max_length)

    ddp_model: Any = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(model, device_ids=[env.local_rank] if use_cuda else None)

    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate,
        betas=(0.9, 0.98),
    )
    autocast_bf16 = use_cuda and torch.cuda.is_bf16_supported()

    per_rank = len(examples) // env.world_size
    if per_rank < 1:
        raise SystemExit(f"{len(examples)} training records cannot be shared by {env.world_size} processes")
    batch_size = max(1, min(math.ceil(args.batch_size / env.world_size), per_rank))
    steps_per_epoch = max(1, per_rank // batch_size)
    global_batch = batch_size * env.world_size
    # "name: value" on purpose: "name=value" lines are read as metrics by the launcher.
    log(
        f"world size: {env.world_size}, device: {device}, threads: {torch.get_num_threads()}, "
        f"examples: {len(examples)}, batch: {batch_size}x{env.world_size}, "
        f"params: {n_total}, trainable: {n_trainable}, max steps: {args.max_steps}, "
        f"time budget: {args.time_budget_seconds}"
    )

    def reduce_mean(values: list[float]) -> list[float]:
        if not distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return (t / env.world_size).tolist()

    def synced_elapsed(start: float) -> float:
        # Every rank must agree on the stop step and the learning rate: the
        # slowest rank's clock counts.
        elapsed = time.perf_counter() - start
        if not distributed:
            return elapsed
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # A checkpoint an earlier try left in the output dir, saved with the same settings: go on from it.
    meta = {"world_size": env.world_size, "batch_size": batch_size, "examples": len(examples), "max_steps": args.max_steps,
            "learning_rate": args.learning_rate, "seed": args.seed, "lora": args.lora}  # fmt: skip
    start_step, resumed_elapsed, loss_sum_total = 0, 0.0, 0.0
    if args.checkpoint_steps > 0:
        found, state = checkpointing.resume(args.output_dir, meta)
        if found is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_step, resumed_elapsed, loss_sum_total = state["step"], state["elapsed"], state["loss_sum_total"]
            log(f"resuming from the checkpoint at step {start_step} ({found.path})")
        elif state:
            log(str(state))

    budget = args.time_budget_seconds
    reporter = ProgressReporter()  # to the Trainer's status server (TrainJobStatus gate), rank 0 only; else a no-op
    elapsed = resumed_elapsed
    step = start_step
    loss_sum_interval = 0.0
    interval_steps = 0
    lr = 0.0
    stopped_by = "max_steps"
    start = time.perf_counter() - resumed_elapsed
    epoch, skip = divmod(start_step, steps_per_epoch)
    done = False
    while not done:
        # Same permutation on every rank; each takes every world_size-th index.
        generator = torch.Generator().manual_seed(args.seed + epoch)
        order = torch.randperm(len(examples), generator=generator).tolist()
        shard = order[env.rank :: env.world_size][: steps_per_epoch * batch_size]
        epoch += 1
        for batch_start in range(skip * batch_size, len(shard), batch_size):
            if step % TIME_SYNC_STEPS == 0:
                elapsed = synced_elapsed(start)
            if step >= args.max_steps:
                done = True
                break
            if budget is not None and step > 0 and elapsed >= budget:
                stopped_by = "time_budget"
                done = True
                break
            progress = step / args.max_steps
            if budget is not None and budget > 0:
                progress = max(progress, elapsed / budget)
            lr = lr_at(step, progress, args.learning_rate, args.warmup_steps, args.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr

            batch = collate([examples[i] for i in shard[batch_start : batch_start + batch_size]], pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast_bf16):
                loss = ddp_model(**batch).loss
            loss.backward()
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(trainable, args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            value = float(loss.detach())
            loss_sum_total += value
            loss_sum_interval += value
            interval_steps += 1
            step += 1
            if step % args.logging_steps == 0:
                (mean_loss,) = reduce_mean([loss_sum_interval / interval_steps])
                if env.is_main:
                    emit(
                        {
                            "step": step,
                            "epoch": round(step * global_batch / len(examples), 4),
                            "loss": round(mean_loss, 6),
                            "learning_rate": float(f"{lr:.6g}"),
                        }
                    )
                    fraction = max(step / args.max_steps, elapsed / budget if budget else 0.0)
                    if fraction < 1.0:  # the end is reported once, with the summary
                        reporter.report_fraction(fraction, {"loss": round(mean_loss, 6), "learning_rate": f"{lr:.6g}"})
                loss_sum_interval = 0.0
                interval_steps = 0
            if args.checkpoint_steps > 0 and step % args.checkpoint_steps == 0 and step < args.max_steps and env.is_main:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                         "elapsed": time.perf_counter() - start, "loss_sum_total": loss_sum_total}  # fmt: skip
                checkpointing.save(args.output_dir, step, state, meta)
        skip = 0
    runtime = time.perf_counter() - start

    (train_loss,) = reduce_mean([loss_sum_total / step if step else float("nan")])
    summary = {
        "train_loss": round(train_loss, 6),
        "train_runtime": round(runtime, 3),
        "train_steps": step,
        "train_samples_per_second": round(step * global_batch / runtime, 2) if runtime > 0 else 0.0,
        "epoch": round(step * global_batch / len(examples), 4),
        "world_size": env.world_size,
        "batch_size": global_batch,
        "batch_size_per_process": batch_size,
        "stopped_by": stopped_by,
    }
    if env.is_main:
        emit(summary)
        reporter.report_fraction(1.0, {k: summary[k] for k in ("train_loss", "train_steps", "train_runtime")})
        save(model, tokenizer, args, summary, trainable_params=n_trainable, resumed_from_step=start_step)
        checkpointing.clear(args.output_dir)
        log(f"saved to {args.output_dir}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def save(
    model: Any, tokenizer: Any, args: argparse.Namespace, summary: dict[str, Any], trainable_params: int, resumed_from_step: int = 0
) -> None:
    """Saves the trained model, its tokenizer and ``training_info.json``.

    Args:
        model: The trained (unwrapped) model; a peft model saves its adapter only.
        tokenizer: The tokenizer to save beside it.
        args: The command line arguments of the run.
        summary: The final training summary.
        trainable_params: Number of trained parameters.
        resumed_from_step: The checkpoint's step this run continued from (0: none).
    """
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(tokenizer, out)
    info = {
        "base_model": str(args.model_dir),
        "dataset": str(args.dataset_dir),
        "weights": "adapter" if args.lora else "full",
        "method": "lora" if args.lora else "full-fine-tuning",
        "format": "safetensors",
        "steps": summary["train_steps"],
        "world_size": summary["world_size"],
        "train_loss": summary["train_loss"],
        "train_runtime": summary["train_runtime"],
        "stopped_by": summary["stopped_by"],
        "trainable_params": trainable_params,
        **({"resumed_from_step": resumed_from_step} if resumed_from_step else {}),
        "hyperparameters": {
            "learning_rate": args.learning_rate,
            "batch_size": summary["batch_size"],
            "batch_size_per_process": summary["batch_size_per_process"],
            "max_steps": args.max_steps,
            "time_budget_seconds": args.time_budget_seconds,
            "warmup_steps": args.warmup_steps,
            "weight_decay": args.weight_decay,
            "seed": args.seed,
            **({"lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha} if args.lora else {}),
        },
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    args = build_parser().parse_args(argv)
    if args.max_steps < 1:
        raise SystemExit("--max-steps must be at least 1")
    if args.logging_steps < 1:
        raise SystemExit("--logging-steps must be at least 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Sleeping instead of spinning OpenMP workers keeps CPU training fast when
    # cores are shared with other work; read when torch is first imported.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
