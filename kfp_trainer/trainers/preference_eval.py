"""Preference metrics of a causal LM on held-out prompt/chosen/rejected pairs.

For each pair the model scores both answers by their log-probability given the prompt (the
answer's tokens and EOS, as DPO scores them). ``win_rate`` is the fraction of pairs whose
chosen answer scores higher, ``logp_margin`` the mean difference. With a reference model (the
model DPO started from), ``reward_margin`` is DPO's implicit reward margin,
``beta * ((logp_c - ref_c) - (logp_r - ref_r))`` averaged, and ``reward_accuracy`` the
fraction of pairs where it is positive. With ``exact_match`` (the default) the model also
answers each prompt greedily: ``exact_match`` is the fraction of answers equal to the chosen
one, ``loss`` the chosen answers' mean token loss (:func:`kfp_trainer.trainers.evaluate.evaluate`).

Usage::

    python -m kfp_trainer.trainers.preference_eval MODEL_DIR DATASET_DIR [--reference REF_DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kfp_trainer.data import chat_renderer, load_preference_split
from kfp_trainer.trainers._common import available_cpus, collate, encode_examples, load_tokenizer


def answer_logps(model_dir: str | Path, pairs: list[dict[str, str]], *, batch_size: int = 128) -> tuple[list[float], list[float]]:
    """Summed log-probabilities of the chosen and of the rejected answers, pair by pair."""
    import torch

    from kfp_trainer.trainers.evaluate import load_model

    tokenizer = load_tokenizer(model_dir)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(available_cpus())
    model = load_model(model_dir).to(device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def score(answer: str) -> list[float]:
        encoded = encode_examples(tokenizer, [{"prompt": p["prompt"], "completion": p[answer]} for p in pairs])
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(encoded), batch_size):
                batch = {k: v.to(device) for k, v in collate(encoded[start : start + batch_size], pad_id).items()}
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
                labels = batch["labels"][:, 1:]
                mask = labels != -100
                taken = torch.gather(logits.log_softmax(-1), 2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                out.extend((taken * mask).sum(-1).tolist())
        return out

    return score("chosen"), score("rejected")


def evaluate_preferences(
    model_dir: str | Path,
    dataset_dir: str | Path,
    *,
    split: str = "test",
    max_examples: int | None = None,
    reference_dir: str | Path | None = None,
    beta: float = 0.1,
    exact_match: bool = True,
) -> dict[str, Any]:
    """``win_rate``, ``logp_margin`` and ``pairs``; with a reference model also ``reward_margin`` and ``reward_accuracy``.

    With ``exact_match``, also ``exact_match`` and ``loss`` of greedy answers against the chosen ones.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    pairs = load_preference_split(dataset_dir, split, render_chat=chat_renderer(load_tokenizer(model_dir)))
    if max_examples:
        pairs = pairs[:max_examples]
    chosen, rejected = answer_logps(model_dir, pairs)
    n = len(pairs)
    result: dict[str, Any] = {
        "win_rate": round(sum(c > r for c, r in zip(chosen, rejected, strict=True)) / n, 6),
        "logp_margin": round(sum(c - r for c, r in zip(chosen, rejected, strict=True)) / n, 6),
        "pairs": n,
    }
    if reference_dir is not None:
        ref_c, ref_r = answer_logps(reference_dir, pairs)
        rewards = [beta * ((c - rc) - (r - rr)) for c, r, rc, rr in zip(chosen, rejected, ref_c, ref_r, strict=True)]
        result["reward_margin"] = round(sum(rewards) / n, 6)
        result["reward_accuracy"] = round(sum(x > 0 for x in rewards) / n, 6)
    if exact_match:
        from kfp_trainer.trainers.evaluate import evaluate

        answers = evaluate(model_dir, dataset_dir, split=split, max_examples=max_examples)
        result.update(exact_match=answers["exact_match"], loss=answers["loss"])
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: prints the metrics as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m kfp_trainer.trainers.preference_eval", description=__doc__.split("\n")[0])
    p.add_argument("model_dir")
    p.add_argument("dataset_dir")
    p.add_argument("--split", default="test")
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--reference", default=None, help="the model DPO started from: adds reward_margin and reward_accuracy")
    p.add_argument("--beta", type=float, default=0.1)
    a = p.parse_args(argv)
    result = evaluate_preferences(
        a.model_dir, a.dataset_dir, split=a.split, max_examples=a.max_examples, reference_dir=a.reference, beta=a.beta
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
