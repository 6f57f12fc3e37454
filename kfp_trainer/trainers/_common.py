"""Helpers shared by the training programs.

Only the standard library is imported at module level; torch is imported
inside the functions that need it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DistEnv:
    """Process placement as described by the ``torchrun`` environment.

    Attributes:
        rank: Global rank of this process.
        world_size: Total number of processes.
        local_rank: Rank of this process on its node.
        local_world_size: Number of processes on this node.
        node_rank: Index of this node.
        launched: Whether a launcher (torchrun) set the environment.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    launched: bool = False

    @property
    def is_main(self) -> bool:
        """Whether this is the global rank 0 process."""
        return self.rank == 0


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            from kfp_trainer.numbers import parse_int  # ASCII digits only: int() would read '١٢' too

            return parse_int(value.strip(), f"environment variable {name}")
    return default


def dist_env() -> DistEnv:
    """Reads the process placement from the environment.

    Without a launcher (no ``WORLD_SIZE``), the process is alone: rank 0 of 1.

    Returns:
        The placement of this process.
    """
    return DistEnv(
        rank=_env_int(("RANK",), 0),
        world_size=_env_int(("WORLD_SIZE",), 1),
        local_rank=_env_int(("LOCAL_RANK",), 0),
        local_world_size=_env_int(("LOCAL_WORLD_SIZE",), 1),
        node_rank=_env_int(("GROUP_RANK", "NODE_RANK", "PET_NODE_RANK"), 0),
        launched="WORLD_SIZE" in os.environ and "RANK" in os.environ,
    )


def available_cpus() -> int:
    """Counts the CPUs this process may use.

    Takes the smallest of ``os.cpu_count()``, the scheduler affinity mask and
    a cgroup v2 CPU quota (as set by a container CPU limit).

    Returns:
        The number of usable CPUs, at least 1.
    """
    count = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        try:
            count = min(count, len(os.sched_getaffinity(0)))
        except OSError:
            pass
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def threads_per_process(local_world_size: int) -> int:
    """Splits the usable CPUs evenly among the processes of a node.

    Args:
        local_world_size: Number of training processes on this node.

    Returns:
        Threads each process should use, at least 1.
    """
    return max(1, available_cpus() // max(1, local_world_size))


def emit(record: dict[str, Any]) -> None:
    """Prints one JSON line to stdout and flushes it; its numbers go to the step's MLflow run too.

    The trainers call it from global rank 0; with no MLflow run to log into (see
    :mod:`kfp_trainer.tracking.trainer`) that part is a no-op.

    Args:
        record: The values to print.
    """
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()
    from kfp_trainer.tracking.trainer import log_record

    log_record(record)


def load_tokenizer(model_dir: str | Path) -> Any:
    """Loads a tokenizer and makes sure it has a padding token.

    Args:
        model_dir: Hugging Face model (or adapter) directory.

    Returns:
        The tokenizer.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
    return tokenizer


def save_tokenizer(tokenizer: Any, dest: str | Path) -> None:
    """Saves a tokenizer so that older transformers releases load it too.

    Recent transformers releases record generic fast tokenizers under a class
    name older releases lack; such entries are renamed to
    ``PreTrainedTokenizerFast``, which every release knows.

    Args:
        tokenizer: A Hugging Face tokenizer.
        dest: Directory to save to.
    """
    tokenizer.save_pretrained(str(dest))
    config_path = Path(dest) / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
            config_path.write_text(json.dumps(config, indent=2) + "\n")


def encode_example(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], int]:
    """Tokenizes a prompt/completion pair for causal LM training.

    The prompt is tokenized with the tokenizer's special tokens (for example a
    leading BOS token); the completion without them, followed by EOS.

    Args:
        tokenizer: A Hugging Face tokenizer.
        prompt: The instruction part; its tokens get no loss.
        completion: The answer part; its tokens (and EOS) are learned.

    Returns:
        The token ids and the number of leading prompt tokens.
    """
    prompt_ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        completion_ids.append(tokenizer.eos_token_id)
    return prompt_ids + completion_ids, len(prompt_ids)


def encode_examples(
    tokenizer: Any,
    records: list[dict[str, Any]],
    max_length: int | None = None,
) -> list[tuple[list[int], int]]:
    """Tokenizes many prompt/completion records like :func:`encode_example`.

    Args:
        tokenizer: A Hugging Face tokenizer.
        records: Dicts with ``prompt`` and ``completion`` strings.
        max_length: Truncate longer sequences to this many tokens.

    Returns:
        Pairs of token ids and prompt length, in record order.
    """
    prompts = tokenizer([r["prompt"] for r in records], add_special_tokens=True)["input_ids"]
    completions = tokenizer([r["completion"] for r in records], add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    encoded = []
    for prompt_ids, completion_ids in zip(prompts, completions, strict=True):
        ids = list(prompt_ids) + list(completion_ids) + eos
        prompt_len = len(prompt_ids)
        if max_length is not None and len(ids) > max_length:
            ids = ids[:max_length]
            prompt_len = min(prompt_len, max_length)
        encoded.append((ids, prompt_len))
    return encoded


def collate(
    examples: list[tuple[list[int], int]],
    pad_id: int,
    *,
    left_pad: bool = False,
) -> dict[str, Any]:
    """Pads encoded examples into a batch with completion-only labels.

    Args:
        examples: Pairs of token ids and prompt length from :func:`encode_example`.
        pad_id: Token id used for padding.
        left_pad: Pad on the left instead of the right.

    Returns:
        ``input_ids``, ``attention_mask`` and ``labels`` tensors; labels are
        ``-100`` on prompt and padding positions.
    """
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(examples):
        start = width - len(ids) if left_pad else 0
        end = start + len(ids)
        input_ids[row, start:end] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, start:end] = 1
        labels[row, start + prompt_len : end] = torch.tensor(ids[prompt_len:], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# Below this many parameters a CPU process trains fastest on one thread.
SMALL_MODEL_PARAMS = 5_000_000


def processes_on_this_host(env: DistEnv) -> int:
    """Counts the training processes that share this machine.

    Usually ``LOCAL_WORLD_SIZE``, but several single-process "nodes" may run on
    one machine (local mode), so ranks compare host names when a process group
    is up.

    Args:
        env: Placement of this process.

    Returns:
        The number of ranks on this host, at least ``env.local_world_size``.
    """
    import torch.distributed as dist

    if env.world_size <= 1 or not dist.is_initialized():
        return env.local_world_size
    hosts: list[Any] = [None] * env.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    return max(env.local_world_size, hosts.count(socket.gethostname()))


def cpu_threads(requested: int | None, host_processes: int, n_params: int) -> int:
    """Chooses the intra-op CPU threads of one training process.

    The usable CPUs are shared among the ranks on this machine. Models below
    :data:`SMALL_MODEL_PARAMS` get one thread: their matrices are too small for
    several threads to pay for their synchronisation (measured on the tiny
    builtin model: 1 thread ran about twice as fast as 2 on 2 cores).

    Args:
        requested: Threads asked for on the command line, if any.
        host_processes: Training processes on this machine.
        n_params: Parameters of the model.

    Returns:
        The number of threads, at least 1.
    """
    if requested:
        return max(1, requested)
    share = threads_per_process(host_processes)
    return 1 if n_params < SMALL_MODEL_PARAMS else share
