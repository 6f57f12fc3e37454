"""GRPO's reward functions and settings: what is refused when the pipeline is built, and how a failing reward is named.

Every bad input of a GRPO step is refused here before anything runs: a reward function that cannot
be shipped (a lambda, a closure, a module-level helper, an import the image lacks), a wrong
signature, fewer than two generations or a count that does not divide the generation batch, a
zero completion length. In the trainer, a reward that raises or returns the wrong values fails
with its name and the sample.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from kfp import compiler, dsl

from kfp_trainer.components import reward, trl_finetune, workspace_config
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm.rewards import RewardError, build, check_rewards, column_errors, normalised, prompt_records
from kfp_trainer.llm.trl_config import trl_settings

OFFSET = 3


def exact_sum(completions, prompts, **kwargs):
    """The sum the prompt asks for, read from the prompt itself: a reward with no reference column."""
    import re

    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        a, b = (int(x) for x in re.findall(r"\d+", prompt)[:2])
        out.append(1.0 if completion.strip() == str(a + b) else 0.0)
    return out


def by_column(completions, answer, bonus=0.0):
    return [float(c == a) + bonus for c, a in zip(completions, answer, strict=True)]


def uses_module_state(completions, **kwargs):
    return [float(OFFSET)] * len(completions)


def imports_missing(completions, **kwargs):
    import sympy_is_not_in_the_image  # noqa: F401

    return [0.0] * len(completions)


def no_completions(prompts, **kwargs):
    return [0.0] * len(prompts)


def positional_only(completions, /, **kwargs):
    return [0.0] * len(completions)


def make_closure():
    scale = 2.0

    def scaled(completions, **kwargs):
        return [scale] * len(completions)

    return scaled


def raises_on_seven(completions, **kwargs):
    return [1.0 / (0 if c == "7" else 1) for c in completions]


def too_few(completions, **kwargs):
    return [1.0]


def not_finite(completions, **kwargs):
    import math

    return [math.nan if c == "x" else 0.0 for c in completions]


def text_values(completions, **kwargs):
    return ["1" for _ in completions]


def errors_of(excinfo) -> list[str]:
    return [str(e) for e in excinfo.value.errors]


@pytest.mark.parametrize(
    ("func", "said"),
    [
        (lambda completions: [0.0], "a lambda has no source"),
        (make_closure(), "reads scale (a closure)"),
        (uses_module_state, "reads OFFSET from outside it"),
        (imports_missing, "imports sympy_is_not_in_the_image"),
        (no_completions, "a parameter named completions"),
        (positional_only, "no positional-only parameters"),
        (print, "a plain Python function"),
    ],
    ids=["lambda", "closure", "module-state", "import-not-in-image", "no-completions", "positional-only", "builtin"],
)
def test_a_reward_function_that_cannot_be_shipped_or_called_is_refused_when_the_pipeline_is_built(func, said):
    with pytest.raises(InvalidSpecErrors) as excinfo:
        reward(func)
    assert any(said in e for e in errors_of(excinfo)), errors_of(excinfo)


def test_a_module_the_users_image_has_is_allowed_once_named():
    item = reward(imports_missing, modules=["sympy_is_not_in_the_image"])
    assert item["modules"] == ["sympy_is_not_in_the_image"]


def test_a_shipped_function_runs_from_its_source_alone_with_only_the_arguments_it_takes():
    specs = check_rewards([reward(exact_sum), reward(by_column, weight=0.5)])
    functions, weights = build(specs, columns=["prompt", "answer"])
    assert weights == [1.0, 0.5]
    kwargs = {"prompts": ["12+7=", "40+2="], "completions": ["19", "41"], "answer": ["19", "42"], "trainer_state": None,
              "completion_ids": [[1], [2]], "log_extra": None}  # fmt: skip
    assert [f(**kwargs) for f in functions] == [[1.0, 0.0], [1.0, 0.0]]
    assert [f.__name__ for f in functions] == ["exact_sum", "by_column"]  # what TRL logs: rewards/<name>/mean


@pytest.mark.parametrize(
    ("func", "said"),
    [
        (raises_on_seven, r"reward function raises_on_seven raised ZeroDivisionError: .* on sample 2 \(prompt '3\+4=', completion '7'\)"),
        (too_few, r"reward function too_few returned 1 values for 3 completions"),
        (not_finite, r"reward function not_finite returned nan for sample 3 \(prompt '1\+1=', completion 'x'\)"),
        (text_values, r"reward function text_values returned '1' for sample 1 .*expected a finite number"),
    ],
    ids=["raises", "wrong-count", "nan", "text"],
)
def test_a_reward_that_fails_in_the_trainer_is_named_with_the_sample_that_broke_it(func, said):
    (function,), _ = build(check_rewards([reward(func)]), columns=["prompt"])
    with pytest.raises(RewardError, match=said):
        function(prompts=["9+9=", "3+4=", "1+1="], completions=["18", "7", "x"], trainer_state=None)


def test_builtins_compare_numbers_as_numbers_and_text_normalised():
    assert normalised(" 1,019 ") == normalised("1019.0") == 1019.0
    assert normalised("Paris.") == normalised("  paris ") == "paris"
    specs = check_rewards(["exact_answer", {"name": "format", "pattern": "[0-9]+", "weight": 0.2},
                           {"name": "length_penalty", "limit": 2, "weight": 0.1}])  # fmt: skip
    functions, weights = build(specs, columns=["prompt", "completion"])  # no answer column: the reference completion
    kwargs = {"completions": ["19", "19.0", "nineteen", "1900"], "completion": ["19"] * 4}
    assert [f(**kwargs) for f in functions] == [[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0], [0.0, -1.0, -1.0, -1.0]]
    assert weights == [1.0, 0.2, 0.1]
    conversational = [[{"role": "assistant", "content": "19"}]]
    assert functions[0](completions=conversational, completion=["19"]) == [1.0]


def test_exact_answer_scores_whatever_a_sampling_model_writes_without_raising():
    # A sampled completion of a sum model is any string of its characters: "e41" once read as an exponent with no digits.
    assert normalised("e41") == "e41" and normalised("1e3") == 1000.0 and normalised(".5") == 0.5
    for odd in ("e", "E5", ".", "-", "+", ",", "1,00", "1e", "1.e2", "--1", "1e400", "1,000,00", "+-1"):
        assert isinstance(normalised(odd), (str, float)), odd
    (exact,), _ = build(check_rewards(["exact_answer"]), columns=["prompt", "completion"])
    rng = random.Random(0)
    samples = ["".join(rng.choice("0123456789+-.,eE= ") for _ in range(rng.randint(0, 6))) for _ in range(5000)]
    scores = exact(completions=samples, completion=["41"] * len(samples))
    assert set(scores) <= {0.0, 1.0} and scores.count(1.0) == sum(normalised(s) == 41.0 for s in samples)


def test_bad_reward_lists_are_refused_with_every_problem_named():
    with pytest.raises(InvalidSpecErrors) as excinfo:
        check_rewards(["exact_answer", "no_such_reward", {"name": "format", "pattern": "("}, {"name": "length_penalty"},
                       {"name": "exact_answer", "weight": "heavy"}, 7])  # fmt: skip
    text = "\n".join(errors_of(excinfo))
    for said in ("rewards[1].name: got 'no_such_reward'", "rewards[2].pattern", "rewards[3].limit", "rewards[4].weight",
                 "rewards[4].name: got 'exact_answer'", "rewards[5]: got 7"):  # fmt: skip
        assert said in text, text
    with pytest.raises(InvalidSpecErrors, match="a list of rewards"):
        check_rewards([])


def test_a_reward_reading_a_column_the_dataset_lacks_is_named(tmp_path):
    specs = check_rewards(["exact_answer", reward(by_column)])
    errors = column_errors(specs, ["prompt", "completion_text"], dataset="train.jsonl")
    assert [e.value for e in errors] == ["exact_answer", "by_column"]
    assert "reads answer" in str(errors[0]) and "has completion_text, prompt" in str(errors[0])
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    from kfp_trainer.data import DatasetError

    with pytest.raises(DatasetError, match=r"train.jsonl: has no prompt column .*its columns: \['question', 'answer'\]"):
        prompt_records(tmp_path / "train.jsonl", "train", specs, log=lambda line: None)


def test_grpo_settings_refuse_what_trl_would_refuse_only_when_training_starts():
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(method="grpo", rewards=["exact_answer"], num_generations=1, max_completion_length=0, temperature=0.0,
                     loss_type="ppo")  # fmt: skip
    fields = {e.field: e.allowed for e in excinfo.value.errors}
    assert "at least 2" in fields["num_generations"] and "at least 1" in fields["max_completion_length"]
    assert "positive" in fields["temperature"] and "dapo" in fields["loss_type"]
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(method="grpo", rewards=["exact_answer"], num_generations=6, per_device_train_batch_size=4, world_size=2)
    (error,) = excinfo.value.errors
    assert re.search(r"generation batch, 8 completions \(per_device_train_batch_size 4 x 2 processes", error.allowed)
    assert trl_settings(method="grpo", rewards=["exact_answer"], num_generations=6, per_device_train_batch_size=4, world_size=3)
    with pytest.raises(InvalidSpecErrors, match="a list of rewards"):
        trl_settings(method="grpo")
    with pytest.raises(InvalidSpecErrors, match="num_generations is GRPO's"):
        trl_settings(method="dpo", num_generations=4)


def test_the_rewards_travel_as_one_json_flag_and_the_summary_keeps_no_source():
    s = trl_settings(method="grpo", rewards=[reward(exact_sum), "exact_answer"], num_generations=4, max_completion_length=4)
    args = s.to_args()
    rewards = json.loads(args[args.index("--rewards") + 1])
    assert [r["name"] for r in rewards] == ["exact_sum", "exact_answer"] and "def exact_sum" in rewards[0]["source"]
    assert s.summary()["rewards"] == [{"name": "exact_sum", "kind": "function", "weight": 1.0},
                                      {"name": "exact_answer", "kind": "exact_answer", "weight": 1.0}]  # fmt: skip


def _pipeline_with(**grpo) -> None:
    @dsl.pipeline(name="grpo-check", pipeline_config=workspace_config("1Gi"))
    def pipeline():
        trl_finetune(method="grpo", model_uri="builtin://models/tiny-char-lm", dataset_uri="builtin://datasets/addition", **grpo)

    compiler.Compiler().compile(pipeline, "/dev/null")


@pytest.mark.parametrize(
    ("grpo", "said"),
    [
        ({"rewards": ["exact_answer"], "num_generations": 1}, "num_generations: got 1"),
        ({"rewards": ["exact_answer"], "num_generations": 3, "per_device_train_batch_size": 4, "num_nodes": 2, "num_proc_per_node": "1"},
         "num_generations: got 3; expected a divisor of the generation batch, 8 completions"),
        ({"rewards": ["exact_answer"], "max_completion_length": 0}, "max_completion_length: got 0"),
        ({"rewards": []}, "a list of rewards"),
        ({"rewards": ["exact_answer", {"name": "format", "pattern": "(("}]}, "rewards[1].pattern"),
    ],
    ids=["one-generation", "batch-not-divisible", "zero-length", "no-rewards", "bad-pattern"],
)
def test_a_pipeline_with_a_bad_grpo_step_fails_at_the_call_with_the_steps_words(grpo, said):
    with pytest.raises(InvalidSpecErrors) as excinfo:
        _pipeline_with(**grpo)
    assert said in str(excinfo.value), str(excinfo.value)


def test_a_pipeline_with_a_users_reward_function_compiles_with_its_source_in_the_step(tmp_path):
    @dsl.pipeline(name="grpo-ok", pipeline_config=workspace_config("1Gi"))
    def pipeline():
        trl_finetune(method="grpo", model_uri="builtin://models/tiny-char-lm", dataset_uri="builtin://datasets/addition",
                     rewards=[reward(exact_sum), {"name": "format", "pattern": "[0-9]+", "weight": 0.1}], num_generations=4,
                     per_device_train_batch_size=8, max_completion_length=4)  # fmt: skip

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    assert "def exact_sum(completions, prompts, **kwargs)" in out.read_text()


def test_the_world_size_is_known_before_the_job_runs_only_where_no_gpu_decides_it():
    from types import SimpleNamespace as Inputs

    from kfp_trainer.steps.trl import _world_size

    runtime = Inputs(replicated_jobs=(("node", 2),), document={"spec": {"mlPolicy": {"torch": {"numProcPerNode": "auto"}}}})
    assert _world_size(runtime, Inputs(num_proc_per_node=3, resources_per_node={})) == 6
    assert _world_size(runtime, Inputs(num_proc_per_node=None, resources_per_node={"cpu": 4})) == 2  # auto on CPU: one per node
    for gpus in ({"nvidia.com/gpu": 1}, {"limits": {"nvidia.com/gpu": 1}}):  # auto with GPUs: one per GPU, known only on the node
        assert _world_size(runtime, Inputs(num_proc_per_node=None, resources_per_node=gpus)) is None
