"""Evaluation of a causal LM on a dataset split read as prompt/completion examples.

Computes the completion loss (and perplexity) with teacher forcing, and the
exact match rate of greedy generations::

    python -m kfp_trainer.trainers.evaluate --model-dir out --dataset-dir data

prints one JSON line such as
``{"loss": 0.05, "perplexity": 1.05, "exact_match": 0.97, "examples": 500}``.
Model directories holding a LoRA adapter (``adapter_config.json``) are loaded
with peft on top of their base model. The dataset is read with
:func:`kfp_trainer.data.load_split`: the formats, layouts and record shapes the SFT trainer
reads; a missing test split is the validation split, else the slice of train the trainer held out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from kfp_trainer.data import chat_renderer, load_split
from kfp_trainer.trainers._common import (
    available_cpus,
    collate,
    encode_examples,
    load_tokenizer,
)


def load_model(model_dir: str | Path) -> Any:
    """Loads a causal LM, or a base model plus LoRA adapter, for inference.

    Args:
        model_dir: A Hugging Face model directory, or a peft adapter directory.

    Returns:
        The model in eval mode.

    Raises:
        RuntimeError: If the directory holds an adapter and peft is missing.
    """
    if (Path(model_dir) / "adapter_config.json").is_file():
        try:
            from peft import AutoPeftModelForCausalLM
        except ImportError as e:
            raise RuntimeError(f"{model_dir} holds a LoRA adapter; loading it needs the 'peft' package") from e
        model = AutoPeftModelForCausalLM.from_pretrained(str(model_dir))
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.eval()
    return model


def evaluate(
    model_dir: str | Path,
    dataset_dir: str | Path,
    split: str = "test",
    max_examples: int | None = None,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    predictions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Evaluates a model on a prompt/completion dataset split.

    Args:
        model_dir: Hugging Face model (or LoRA adapter) directory.
        dataset_dir: Dataset folder, or one data file (read whole), as
            :func:`kfp_trainer.data.load_split` reads it.
        split: Split to evaluate.
        max_examples: Evaluate only the first N records.
        max_new_tokens: Generation length limit for exact match.
        batch_size: Examples per forward pass.
        predictions: If given, filled with one dict per example
            (``prompt``, ``completion``, ``prediction``).

    Returns:
        ``loss`` (mean cross-entropy per completion token, EOS included),
        ``perplexity`` (``exp(loss)``), ``exact_match`` (fraction of greedy
        generations equal to the completion after stripping whitespace) and
        ``examples`` (count).
    """
    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = load_tokenizer(model_dir)
    records = load_split(dataset_dir, split, render_chat=chat_renderer(tokenizer))
    if max_examples is not None:
        records = records[:max_examples]

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(available_cpus())
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model = load_model(model_dir).to(device)
    encoded = encode_examples(tokenizer, records)
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )

    total_loss = 0.0
    total_tokens = 0
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(records), batch_size):
            chunk = encoded[start : start + batch_size]
            batch = {k: v.to(device) for k, v in collate(chunk, pad_id).items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            labels = batch["labels"][:, 1:]
            total_loss += float(
                torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.size(-1)),
                    labels.reshape(-1),
                    ignore_index=-100,
                    reduction="sum",
                )
            )
            total_tokens += int((labels != -100).sum())

            prompts = collate([(ids[:prompt_len], prompt_len) for ids, prompt_len in chunk], pad_id, left_pad=True)
            width = prompts["input_ids"].size(1)
            generated = model.generate(
                input_ids=prompts["input_ids"].to(device),
                attention_mask=prompts["attention_mask"].to(device),
                generation_config=generation_config,
            )
            texts = tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
            for record, text in zip(records[start : start + batch_size], texts, strict=True):
                hit = text.strip() == str(record["completion"]).strip()
                correct += int(hit)
                if predictions is not None:
                    predictions.append({"prompt": record["prompt"], "completion": record["completion"], "prediction": text.strip()})

    loss = total_loss / max(1, total_tokens)
    try:
        perplexity = math.exp(loss)
    except OverflowError:
        perplexity = float("inf")
    return {
        "loss": round(loss, 6),
        "perplexity": round(perplexity, 6),
        "exact_match": round(correct / len(records), 6),
        "examples": len(records),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: prints the metrics as one JSON line.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    p = argparse.ArgumentParser(prog="python -m kfp_trainer.trainers.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, help="Hugging Face model or LoRA adapter directory")
    p.add_argument("--dataset-dir", required=True, help="dataset folder or file (see kfp_trainer.data)")
    p.add_argument("--split", default="test", help="split to evaluate (default %(default)s)")
    p.add_argument("--max-examples", type=int, default=None, help="evaluate only the first N records")
    p.add_argument("--max-new-tokens", type=int, default=8, help="generation limit (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per forward pass (default %(default)s)")
    p.add_argument("--output", default=None, help="also write the metrics JSON to this file")
    p.add_argument("--show", type=int, default=0, help="print the first N predictions to stderr")
    args = p.parse_args(argv)
    # Sleeping OpenMP workers cope better with busy shared CPUs (read at torch import).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    predictions: list[dict[str, str]] = []
    metrics = evaluate(
        args.model_dir,
        args.dataset_dir,
        split=args.split,
        max_examples=args.max_examples,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        predictions=predictions,
    )
    for item in predictions[: args.show]:
        print(json.dumps(item), file=sys.stderr)
    line = json.dumps(metrics)
    print(line, flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
