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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_trainer.data import DatasetError, chat_renderer, load_split
from kfp_trainer.progress import ProgressReporter
from kfp_trainer.tracking.trainer import log_params
from kfp_trainer.trainers import checkpointing
from kfp_trainer.trainers._common import (
    DistEnv,
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
        help="stop training after this many seconds, whatever the step count; the learning rate schedule follows whichever limit "
        "is nearer; 0 or unset: no time limit (the run is then the same on a busy machine as on an idle one)",
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


@dataclass
class Process:
    """This process's place in the job: its rank, its device, whether ranks must agree."""

    env: DistEnv
    device: Any
    use_cuda: bool
    bf16: bool  # autocast to bfloat16 (CUDA devices that support it)

    @property
    def distributed(self) -> bool:
        """More than one process trains."""
        return self.env.world_size > 1

    def log(self, message: str) -> None:
        """A progress line on stderr, from rank 0 only."""
        if self.env.is_main:
            print(f"sft: {message}", file=sys.stderr, flush=True)

    def mean(self, values: list[float]) -> list[float]:
        """The mean of each value over all ranks."""
        import torch
        import torch.distributed as dist

        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return (t / self.env.world_size).tolist()

    def elapsed_since(self, start: float) -> float:
        """Seconds since ``start`` on the slowest rank: every rank must agree on the stop step and the learning rate."""
        import torch
        import torch.distributed as dist

        elapsed = time.perf_counter() - start
        if not self.distributed:
            return elapsed
        t = torch.tensor([elapsed], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())


def start_process() -> Process:
    """Pick this process's device and join the other ranks (gloo on CPU, nccl on CUDA)."""
    import torch
    import torch.distributed as dist

    env = dist_env()
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if env.world_size > 1:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Process(env, device, use_cuda, bf16=use_cuda and torch.cuda.is_bf16_supported())


def load_model(args: argparse.Namespace, proc: Process) -> tuple[Any, Any]:
    """The tokenizer and the model to train (float32 master weights, a LoRA adapter with ``--lora``)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model_dir)
    # float32 master weights whatever the checkpoint's dtype (bf16 autocast on CUDA).
    model = AutoModelForCausalLM.from_pretrained(args.model_dir).float()
    model.config.use_cache = False
    if args.lora:
        model = _wrap_lora(model, args)
    model.to(proc.device)
    model.train()
    return tokenizer, model


def make_optimizer(params: list[Any], args: argparse.Namespace) -> Any:
    """AdamW, with weight decay on matrices only."""
    import torch

    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate,
        betas=(0.9, 0.98),
    )


@dataclass(frozen=True)
class Batches:
    """How the examples are split: per process, per step, per epoch."""

    per_process: int  # examples each process takes per step
    steps_per_epoch: int
    world_size: int

    @property
    def global_size(self) -> int:
        """Examples per optimizer step, over all processes."""
        return self.per_process * self.world_size

    def shard(self, examples: int, seed: int, epoch: int, rank: int) -> list[int]:
        """This rank's example indices for ``epoch``: the same shuffle on every rank, every world_size-th index."""
        import torch

        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(examples, generator=generator).tolist()
        return order[rank :: self.world_size][: self.steps_per_epoch * self.per_process]


def plan_batches(examples: int, batch_size: int, world_size: int) -> Batches:
    """Share ``batch_size`` examples per step over ``world_size`` processes."""
    per_rank = examples // world_size
    if per_rank < 1:
        raise SystemExit(f"{examples} training records cannot be shared by {world_size} processes")
    per_process = max(1, min(math.ceil(batch_size / world_size), per_rank))
    return Batches(per_process=per_process, steps_per_epoch=max(1, per_rank // per_process), world_size=world_size)


@dataclass
class Progress:
    """Where training is: steps done, seconds spent, the loss sums for the log and the summary."""

    step: int = 0
    elapsed: float = 0.0
    loss_sum_total: float = 0.0
    loss_sum_interval: float = 0.0
    interval_steps: int = 0
    lr: float = 0.0
    stopped_by: str = "max_steps"
    resumed_from_step: int = 0

    def add_loss(self, value: float) -> None:
        """Count one step's loss."""
        self.loss_sum_total += value
        self.loss_sum_interval += value
        self.interval_steps += 1
        self.step += 1


def resume(args: argparse.Namespace, meta: dict[str, Any], model: Any, optimizer: Any, proc: Process) -> Progress:
    """Continue from a checkpoint an earlier try left in the output dir with the same settings, if any."""
    if args.checkpoint_steps <= 0:
        return Progress()
    resumed = checkpointing.resume(args.output_dir, meta)
    if resumed[0] is None:
        if resumed[1]:
            proc.log(resumed[1])
        return Progress()
    found, state = resumed
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    proc.log(f"resuming from the checkpoint at step {state['step']} ({found.path})")
    return Progress(
        step=state["step"], elapsed=state["elapsed"], loss_sum_total=state["loss_sum_total"], resumed_from_step=state["step"]
    )


def should_stop(progress: Progress, args: argparse.Namespace) -> bool:
    """Whether the step count or the time budget is used up (sets ``stopped_by``)."""
    if progress.step >= args.max_steps:
        return True
    budget = args.time_budget_seconds
    if budget and progress.step > 0 and progress.elapsed >= budget:
        progress.stopped_by = "time_budget"
        return True
    return False


def set_learning_rate(optimizer: Any, progress: Progress, args: argparse.Namespace) -> None:
    """The schedule's rate for the coming step: by steps, or by time when the budget is nearer."""
    done = progress.step / args.max_steps
    budget = args.time_budget_seconds
    if budget is not None and budget > 0:
        done = max(done, progress.elapsed / budget)
    progress.lr = lr_at(progress.step, done, args.learning_rate, args.warmup_steps, args.min_lr_ratio)
    for group in optimizer.param_groups:
        group["lr"] = progress.lr


def train_step(model: Any, optimizer: Any, params: list[Any], batch: dict[str, Any], args: argparse.Namespace, bf16: bool) -> float:
    """One optimizer step on ``batch`` (gradients of ``params`` clipped); returns its loss."""
    import torch

    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    if args.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def report_interval(progress: Progress, batches: Batches, examples: int, args: argparse.Namespace, proc: Process, reporter: Any) -> None:
    """Every ``--logging-steps`` steps: the mean loss as a JSON line and to the Trainer's progress (rank 0)."""
    (mean_loss,) = proc.mean([progress.loss_sum_interval / progress.interval_steps])
    if proc.env.is_main:
        emit({
            "step": progress.step,
            "epoch": round(progress.step * batches.global_size / examples, 4),
            "loss": round(mean_loss, 6),
            "learning_rate": float(f"{progress.lr:.6g}"),
        })  # fmt: skip
        budget = args.time_budget_seconds
        fraction = max(progress.step / args.max_steps, progress.elapsed / budget if budget else 0.0)
        if fraction < 1.0:  # the end is reported once, with the summary
            reporter.report_fraction(fraction, {"loss": round(mean_loss, 6), "learning_rate": f"{progress.lr:.6g}"})
    progress.loss_sum_interval, progress.interval_steps = 0.0, 0


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the fine-tuning on this process.

    Args:
        args: Parsed command line arguments (see :func:`build_parser`).

    Returns:
        The final summary (``train_loss``, ``train_runtime``, ``train_steps``,
        ``world_size``, ...), identical on every rank.
    """
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    proc = start_process()
    env = proc.env
    tokenizer, model = load_model(args, proc)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable, n_total = sum(p.numel() for p in trainable), sum(p.numel() for p in model.parameters())
    if not proc.use_cuda:
        torch.set_num_threads(cpu_threads(args.num_threads, processes_on_this_host(env), n_total))
    examples = load_examples(args, tokenizer, proc)
    ddp_model: Any = model
    if proc.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(model, device_ids=[env.local_rank] if proc.use_cuda else None)
    optimizer = make_optimizer(trainable, args)
    batches = plan_batches(len(examples), args.batch_size, env.world_size)
    # "name: value" on purpose: "name=value" lines are read as metrics by the launcher.
    proc.log(
        f"world size: {env.world_size}, device: {proc.device}, threads: {torch.get_num_threads()}, "
        f"examples: {len(examples)}, batch: {batches.per_process}x{env.world_size}, "
        f"params: {n_total}, trainable: {n_trainable}, max steps: {args.max_steps}, "
        f"time budget: {args.time_budget_seconds}"
    )
    meta = {"world_size": env.world_size, "batch_size": batches.per_process, "examples": len(examples), "max_steps": args.max_steps,
            "learning_rate": args.learning_rate, "seed": args.seed, "lora": args.lora}  # fmt: skip
    progress = resume(args, meta, model, optimizer, proc)
    reporter = ProgressReporter()  # to the Trainer's status server (TrainJobStatus gate), rank 0 only; else a no-op
    start = time.perf_counter() - progress.elapsed
    loop = Loop(args, proc, ddp_model, optimizer, trainable, reporter, checkpoint=(model, meta))
    loop.run(examples, tokenizer, batches, progress, start)
    runtime = time.perf_counter() - start
    summary = summarize(progress, batches, len(examples), runtime, proc)
    if env.is_main:
        emit(summary)
        reporter.report_fraction(1.0, {k: summary[k] for k in ("train_loss", "train_steps", "train_runtime")})
        save(model, tokenizer, args, summary, trainable_params=n_trainable, resumed_from_step=progress.resumed_from_step)
        checkpointing.clear(args.output_dir)
        proc.log(f"saved to {args.output_dir}")
    if proc.distributed:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    return summary


def load_examples(args: argparse.Namespace, tokenizer: Any, proc: Process) -> list[Any]:
    """The train split, tokenized (loss on the completion tokens only)."""
    try:
        records = load_split(args.dataset_dir, "train", render_chat=chat_renderer(tokenizer), log=proc.log)
    except DatasetError as e:
        raise SystemExit(f"sft: {e}") from None
    return encode_examples(tokenizer, records, max_length=args.max_length)


@dataclass
class Loop:
    """The training loop and what stays the same through it."""

    args: argparse.Namespace
    proc: Process
    model: Any  # DistributedDataParallel-wrapped when distributed
    optimizer: Any
    params: list[Any]  # the trainable parameters (their gradients are clipped)
    reporter: Any
    checkpoint: tuple[Any, dict[str, Any]]  # (the unwrapped model, the settings a resumed run must share)

    def run(self, examples: list[Any], tokenizer: Any, batches: Batches, progress: Progress, start: float) -> None:
        """Epochs of shuffled batches until the step count or the time budget is used up; checkpoints on the way."""
        args, proc = self.args, self.proc
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        epoch, skip = divmod(progress.step, batches.steps_per_epoch)
        while True:
            shard = batches.shard(len(examples), args.seed, epoch, proc.env.rank)
            epoch += 1
            for at in range(skip * batches.per_process, len(shard), batches.per_process):
                if progress.step % TIME_SYNC_STEPS == 0:
                    progress.elapsed = proc.elapsed_since(start)
                if should_stop(progress, args):
                    return
                set_learning_rate(self.optimizer, progress, args)
                batch = collate([examples[i] for i in shard[at : at + batches.per_process]], pad_id)
                batch = {k: v.to(proc.device) for k, v in batch.items()}
                progress.add_loss(train_step(self.model, self.optimizer, self.params, batch, args, proc.bf16))
                if progress.step % args.logging_steps == 0:
                    report_interval(progress, batches, len(examples), args, proc, self.reporter)
                if args.checkpoint_steps > 0 and progress.step % args.checkpoint_steps == 0 and progress.step < args.max_steps:
                    self.save_checkpoint(progress, start)
            skip = 0

    def save_checkpoint(self, progress: Progress, start: float) -> None:
        """Rank 0 saves the model, the optimizer and the progress, for a retried job to continue from."""
        if not self.proc.env.is_main:
            return
        model, meta = self.checkpoint
        state = {"model": model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": progress.step,
                 "elapsed": time.perf_counter() - start, "loss_sum_total": progress.loss_sum_total}  # fmt: skip
        checkpointing.save(self.args.output_dir, progress.step, state, meta)


def summarize(progress: Progress, batches: Batches, examples: int, runtime: float, proc: Process) -> dict[str, Any]:
    """The final summary, the same on every rank."""
    step = progress.step
    (train_loss,) = proc.mean([progress.loss_sum_total / step if step else float("nan")])
    return {
        "train_loss": round(train_loss, 6),
        "train_runtime": round(runtime, 3),
        "train_steps": step,
        "train_samples_per_second": round(step * batches.global_size / runtime, 2) if runtime > 0 else 0.0,
        "epoch": round(step * batches.global_size / examples, 4),
        "world_size": proc.env.world_size,
        "batch_size": batches.global_size,
        "batch_size_per_process": batches.per_process,
        "stopped_by": progress.stopped_by,
    }


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
    log_params(vars(args), trainer="kfp_trainer.trainers.sft")  # the step's MLflow run, from rank 0 (if any)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
