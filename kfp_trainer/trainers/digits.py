r"""A small digit classifier trained with DistributedDataParallel (torchrun), and its data.

The data is the classic "optical recognition of handwritten digits" set (UCI; 1,797 8x8
grey images of the digits 0-9) that ships inside the scikit-learn package, so it is
available offline. ``prepare`` splits it into train / validation / test; ``train`` fits a
one-hidden-layer MLP on every process of a ``torchrun`` job (each rank a shard of every
epoch, gradients all-reduced), prints one JSON line of metrics per epoch on rank 0, and
saves the model there. Rank 0 checkpoints every epoch in the output dir; a retried or
restarted job resumes after the last checkpointed epoch (:mod:`.checkpointing`).

    python -m kfp_trainer.trainers.digits prepare --output-dir DATA
    torchrun --nnodes 2 --nproc-per-node 1 -m kfp_trainer.trainers.digits train \
        --dataset-dir DATA --output-dir MODEL --epochs 30 --learning-rate 0.1 --hidden 64

Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..progress import ProgressReporter
from ..tracking.trainer import log_params
from . import checkpointing
from ._common import dist_env, emit, threads_per_process

CLASSES = list(range(10))
SPLITS = ("train", "validation", "test")


def prepare(output_dir: str | Path, *, test_fraction: float = 0.25, validation_fraction: float = 0.15, seed: int = 0) -> dict[str, Any]:
    """Write the digits data set as ``<split>.npz`` (``x``: float32 in [0, 1], ``y``: int64) and ``meta.json``.

    The split is stratified: every class is divided in the same proportions.

    Args:
        output_dir: Folder to write to.
        test_fraction: Share of each class held out for the final evaluation.
        validation_fraction: Share of each class held out for model selection.
        seed: Seed of the shuffle.

    Returns:
        The metadata written to ``meta.json`` (sizes of the splits, classes, source).

    Raises:
        ValueError: The fractions leave no training data.
    """
    import numpy as np
    from sklearn.datasets import load_digits

    if not (0 < test_fraction < 1 and 0 <= validation_fraction < 1 and test_fraction + validation_fraction < 0.9):
        raise ValueError(f"test_fraction={test_fraction}, validation_fraction={validation_fraction}: leave at least 10% for training")
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    rng = np.random.default_rng(seed)
    parts: dict[str, list[int]] = {s: [] for s in SPLITS}
    for label in CLASSES:
        idx = rng.permutation(np.flatnonzero(y == label))
        n_test = round(len(idx) * test_fraction)
        n_val = round(len(idx) * validation_fraction)
        parts["test"] += idx[:n_test].tolist()
        parts["validation"] += idx[n_test : n_test + n_val].tolist()
        parts["train"] += idx[n_test + n_val :].tolist()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, indices in parts.items():
        order = rng.permutation(np.array(indices, dtype="int64"))
        np.savez(out / f"{split}.npz", x=x[order], y=y[order])
    meta = {
        "source": "scikit-learn load_digits (UCI optical recognition of handwritten digits)",
        "features": int(x.shape[1]),
        "classes": [str(c) for c in CLASSES],
        **{f"{s}_examples": len(parts[s]) for s in SPLITS},
        "seed": seed,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def load_split(dataset_dir: str | Path, split: str) -> tuple[Any, Any]:
    """``(x, y)`` numpy arrays of one split written by :func:`prepare`.

    Raises:
        FileNotFoundError: The split is not there.
    """
    import numpy as np

    path = Path(dataset_dir) / f"{split}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"dataset split {split!r} not found: {path} does not exist (write it with `digits prepare`)")
    with np.load(path) as data:
        return data["x"], data["y"]


def build_model(features: int, hidden: int, classes: int) -> Any:
    """The classifier: ``features -> hidden (ReLU) -> classes``."""
    from torch import nn

    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def load_model(model_dir: str | Path) -> Any:
    """The trained classifier saved by :func:`train`, in eval mode."""
    from safetensors.torch import load_file

    config = json.loads((Path(model_dir) / "config.json").read_text())
    model = build_model(config["features"], config["hidden"], len(config["classes"]))
    model.load_state_dict(load_file(str(Path(model_dir) / "model.safetensors")))
    return model.eval()


def predict(model: Any, x: Any) -> list[int]:
    """Predicted class of each row of ``x``."""
    import torch

    with torch.no_grad():
        predicted: list[int] = model(torch.as_tensor(x)).argmax(dim=1).tolist()
        return predicted


def _evaluate(model: Any, x: Any, y: Any) -> tuple[float, float]:
    import torch
    from torch.nn import functional

    with torch.no_grad():
        logits = model(x)
        return float(functional.cross_entropy(logits, y)), float((logits.argmax(dim=1) == y).float().mean())


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Fit the classifier on this process's shard; rank 0 reports and saves.

    Returns:
        The final summary (``loss``, ``val_loss``, ``val_accuracy``, ``world_size``, ...).
    """
    import torch
    import torch.distributed as dist
    from torch.nn import functional
    from torch.nn.parallel import DistributedDataParallel

    env = dist_env()
    torch.set_num_threads(threads_per_process(env.local_world_size))
    distributed = env.world_size > 1
    if distributed:
        dist.init_process_group(backend="gloo")
    torch.manual_seed(args.seed)  # same initial weights on every rank
    x_train, y_train = (torch.as_tensor(a) for a in load_split(args.dataset_dir, "train"))
    x_val, y_val = (torch.as_tensor(a) for a in load_split(args.dataset_dir, "validation"))
    model = build_model(x_train.shape[1], args.hidden, len(CLASSES))
    ddp = DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.learning_rate, momentum=0.9)
    started, steps, first = time.monotonic(), 0, 1
    summary: dict[str, Any] = {}
    reporter = ProgressReporter()  # to the Trainer's status server (TrainJobStatus gate), rank 0 only; else a no-op
    # A checkpoint an earlier try left in the output dir, saved with the same settings: go on after its epoch.
    meta = {"world_size": env.world_size, **{k: getattr(args, k) for k in HYPERPARAMETERS}}
    if args.checkpoint:
        resumed = checkpointing.resume(args.output_dir, meta)
        if resumed[0] is not None:
            found, state = resumed
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            first, steps, summary = state["epoch"] + 1, state["steps"], state["summary"]
            started -= state["elapsed"]
            if env.is_main:
                print(f"digits: resuming after epoch {state['epoch']} ({found.path})", file=sys.stderr, flush=True)
        elif resumed[1] and env.is_main:
            print(f"digits: {resumed[1]}", file=sys.stderr, flush=True)
    resumed_from = steps
    for epoch in range(first, args.epochs + 1):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(args.seed + epoch))
        shard = order[env.rank :: env.world_size]
        total, count = torch.zeros(2), 0
        for start in range(0, len(shard), args.batch_size):
            batch = shard[start : start + args.batch_size]
            optimizer.zero_grad()
            loss = functional.cross_entropy(ddp(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(batch), len(batch)])  # item(): a number, not a graph node (float() warns)
            count += 1
        if distributed:
            dist.all_reduce(total)
        steps += count
        val_loss, val_accuracy = _evaluate(model, x_val, y_val)
        summary = {
            "epoch": epoch, "loss": round(float(total[0] / total[1]), 6), "val_loss": round(val_loss, 6),
            "val_accuracy": round(val_accuracy, 6),
        }
        if env.is_main:
            emit(summary)
            reporter.report_step(epoch, args.epochs, summary)
            if args.checkpoint and epoch < args.epochs:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "steps": steps,
                         "summary": summary, "elapsed": time.monotonic() - started}  # fmt: skip
                checkpointing.save(args.output_dir, steps, state, meta)
    summary.update({"world_size": env.world_size, "steps": steps, "train_runtime": round(time.monotonic() - started, 2)})
    if resumed_from:
        summary["resumed_from_step"] = resumed_from
    if env.is_main:
        save(model, args, summary)
        checkpointing.clear(args.output_dir)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def save(model: Any, args: argparse.Namespace, summary: dict[str, Any]) -> None:
    """Write ``model.safetensors``, ``config.json`` and ``training_info.json`` to ``--output-dir``."""
    from safetensors.torch import save_file

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    config = {"architecture": "mlp", "features": model[0].in_features, "hidden": args.hidden, "classes": [str(c) for c in CLASSES]}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    info = {
        "weights": "full", "format": "safetensors", "method": "ddp", "dataset": str(args.dataset_dir),
        "steps": summary["steps"], "world_size": summary["world_size"], "train_loss": summary["loss"],
        "val_accuracy": summary["val_accuracy"], "train_runtime": summary["train_runtime"],
        **({"resumed_from_step": summary["resumed_from_step"]} if summary.get("resumed_from_step") else {}),
        "hyperparameters": {
            "learning_rate": args.learning_rate, "hidden": args.hidden, "epochs": args.epochs,
            "batch_size": args.batch_size, "seed": args.seed,
        },
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``prepare`` and ``train``."""
    parser = argparse.ArgumentParser(prog="python -m kfp_trainer.trainers.digits", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the train/validation/test splits")
    prep.add_argument("--output-dir", required=True)
    prep.add_argument("--test-fraction", type=float, default=0.25)
    prep.add_argument("--validation-fraction", type=float, default=0.15)
    prep.add_argument("--seed", type=int, default=0)
    fit = sub.add_parser("train", help="train the classifier (under torchrun for several processes)")
    fit.add_argument("--dataset-dir", required=True)
    fit.add_argument("--output-dir", required=True)
    fit.add_argument("--epochs", type=int, default=30)
    fit.add_argument("--learning-rate", type=float, default=0.1)
    fit.add_argument("--hidden", type=int, default=64)
    fit.add_argument("--batch-size", type=int, default=32)
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument(
        "--no-checkpoint", dest="checkpoint", action="store_false",
        help="do not checkpoint each epoch in the output dir (nor resume from a checkpoint found there)",
    )
    fit.add_argument(
        "--hyperparameters", metavar="JSON", default="",
        help='values overriding the options above, as name=value,... or a JSON object, e.g. learning_rate=0.05,hidden=32',
    )
    return parser


HYPERPARAMETERS = ("epochs", "learning_rate", "hidden", "batch_size", "seed")


def apply_hyperparameters(args: argparse.Namespace, text: str) -> argparse.Namespace:
    """Override ``args`` with ``name=value,...`` or a JSON object (names with ``_`` or ``-``).

    Example:
        >>> ns = apply_hyperparameters(argparse.Namespace(learning_rate=0.1, hidden=64), '{"learning-rate": 0.5, "hidden": 8.0}')
        >>> (ns.learning_rate, ns.hidden)
        (0.5, 8)
        >>> apply_hyperparameters(ns, "hidden=16, learning_rate=0.02").hidden
        16

    Raises:
        SystemExit: Neither form, an unknown name, or a value of the wrong type.
    """
    if text.lstrip().startswith("{"):
        try:
            values = json.loads(text)
        except ValueError:
            raise SystemExit(f"--hyperparameters {text!r}: not a JSON object") from None
    else:
        pairs = [part.partition("=") for part in text.split(",") if part.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise SystemExit(f"--hyperparameters {text!r}: expected name=value,... or a JSON object")
        values = {k.strip(): v.strip() for k, _, v in pairs}
    if not isinstance(values, dict):
        raise SystemExit(f"--hyperparameters {text!r}: expected a JSON object")
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in HYPERPARAMETERS:
            raise SystemExit(f"--hyperparameters: unknown {key!r}; known: {', '.join(HYPERPARAMETERS)}")
        kind = float if name == "learning_rate" else int
        try:
            number = float(value)
            if kind is int and not number.is_integer():
                raise ValueError(value)
        except (TypeError, ValueError):
            raise SystemExit(f"--hyperparameters: {key}={value!r} is not {'a number' if kind is float else 'an integer'}") from None
        setattr(args, name, kind(number))
    return args


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "prepare":
        print(json.dumps(prepare(args.output_dir, test_fraction=args.test_fraction,
                                 validation_fraction=args.validation_fraction, seed=args.seed)))
        return 0
    if args.hyperparameters:
        args = apply_hyperparameters(args, args.hyperparameters)
    for name in ("epochs", "hidden", "batch_size"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if not args.learning_rate > 0:
        raise SystemExit("--learning-rate must be positive")
    log_params(vars(args), trainer="kfp_trainer.trainers.digits")  # the step's MLflow run, from rank 0 (if any)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
