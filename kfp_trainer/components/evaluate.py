# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``evaluate_model`` component.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.run_evaluate` inside the component's container.
"""

from typing import Optional

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from ._image import TRAINER_IMAGE
from .calls import with_run_context


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate_model(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    split: str = "test",
    max_examples: int = 0,
    baseline: Input[Metrics] = None,
    gate_metric: str = "exact_match",
    min_improvement: float = 0.0,
    lm_eval_tasks: Optional[list] = None,
) -> bool:
    """Evaluates a causal language model on a dataset split and gives a verdict.

    Computes the completion loss, perplexity and the exact-match rate of greedy generations
    on one split (a LoRA adapter directory is loaded on top of its base model). The dataset is
    read as the SFT trainer (kfp_trainer.trainers.sft) reads it: .jsonl, .json, .csv, .parquet
    or save_to_disk .arrow files, laid out as <split>.<ext>, a Hugging Face Hub snapshot
    (data/<split>-00000-of-00001-*.parquet) or <split>/ folders, with records of one of these
    shapes: prompt/completion; chat messages (list of role/content turns: the completion is the
    last assistant turn, the prompt the turns before it in the tokenizer's chat template, or
    "<|role|>" lines without one); Alpaca instruction/input/output (Alpaca's prompt template);
    question/answer; input/output. Without a test split, the validation split is read, else the
    deterministic 5% slice of train (at most 1000 records) that the SFT trainer left out. With
    lm_eval_tasks and the lm-eval package installed, adds lm-evaluation-harness scores
    (skipped with a log line when the package is absent). The verdict compares gate_metric
    with the baseline metrics (e.g. the base model's evaluation): use it in
    dsl.If(task.outputs["Output"] == True) (a bool, so the condition also works under kfp.local).

    Args:
        model: Model directory (Hugging Face format, or a LoRA adapter).
        dataset: Dataset directory (the files, layouts and record shapes above).
        split: Split to evaluate.
        max_examples: Evaluate only the first N records; 0 means all.
        baseline: Metrics to compare with (another evaluate_model's metrics output).
        gate_metric: Metric the verdict is based on (lower is better for loss/perplexity).
        min_improvement: How much gate_metric must improve on the baseline to pass.
        lm_eval_tasks: lm-evaluation-harness task names (optional, needs lm-eval).

    Returns:
        metrics: loss, perplexity, exact_match, examples, gate_passed (1 or 0), and lm_eval/<task>/<metric>.
        Output: True when gate_metric improved on the baseline by at least min_improvement (or there is no baseline).
    """
    from kfp_trainer import steps

    passed, _ = steps.exit_on_error(
        lambda: steps.run_evaluate(
            model=model, dataset=dataset, metrics=metrics, split=split, max_examples=max_examples, baseline=baseline,
            gate_metric=gate_metric, min_improvement=min_improvement, lm_eval_tasks=lm_eval_tasks,
        )
    )
    return passed


evaluate_model = with_run_context(evaluate_model)
