# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""The ``evaluate_preferences`` component.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.preference.run_preference_eval` inside the component's container.
"""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from ._image import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate_preferences(
    model: Input[Model],
    dataset: Input[Dataset],
    metrics: Output[Metrics],
    reference_model: Input[Model] = None,
    split: str = "test",
    max_examples: int = 0,
    beta: float = 0.1,
    baseline: Input[Metrics] = None,
    gate_metric: str = "win_rate",
    min_improvement: float = 0.0,
) -> bool:
    """Scores a causal LM on held-out preference pairs (prompt, chosen, rejected) and gives a verdict.

    Each answer is scored by its log-probability given the prompt: win_rate is the fraction of
    pairs whose chosen answer scores higher, logp_margin the mean difference. With
    reference_model (the model DPO started from), reward_margin is DPO's implicit reward margin
    beta * ((logp_chosen - ref_chosen) - (logp_rejected - ref_rejected)), averaged, and
    reward_accuracy the fraction of pairs where it is positive. The model also answers each
    prompt greedily: exact_match is the fraction of answers equal to the chosen one, loss the
    chosen answers' mean token loss. The dataset is read as the TRL
    trainer reads preference pairs (.jsonl, .json, .csv, .parquet or save_to_disk files; without
    a test split, the validation split, else the held-out slice of train). The verdict compares
    gate_metric with the baseline metrics (another evaluate_preferences' metrics): use it in
    dsl.If(task.outputs["Output"] == True).

    Args:
        model: Model directory (Hugging Face format, or a LoRA adapter).
        dataset: Dataset directory with prompt/chosen/rejected records.
        reference_model: The model the candidate was trained from (adds reward_margin, reward_accuracy).
        split: Split to evaluate.
        max_examples: Score only the first N pairs; 0 means all.
        beta: DPO beta for reward_margin.
        baseline: Metrics to compare with.
        gate_metric: Metric the verdict is based on: win_rate, logp_margin, reward_margin, reward_accuracy, exact_match or loss.
        min_improvement: How much gate_metric must improve on the baseline to pass.

    Returns:
        metrics: win_rate, logp_margin, pairs, exact_match, loss, (reward_margin, reward_accuracy), eval_seconds, gate_passed (1 or 0).
        Output: True when gate_metric improved on the baseline by at least min_improvement (or there is no baseline).
    """
    from kfp_trainer import steps

    passed, _ = steps.exit_on_error(
        lambda: steps.run_preference_eval(
            model=model, dataset=dataset, metrics=metrics, reference_model=reference_model, split=split, max_examples=max_examples,
            beta=beta, baseline=baseline, gate_metric=gate_metric, min_improvement=min_improvement,
        )
    )
    return passed
