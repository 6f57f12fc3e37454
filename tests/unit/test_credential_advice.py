"""A literal credential's refusal proposes what works in a pipeline, and ``kfp-trainer run --local`` shows that advice whole.

The advice used to be an EnvVar with ``valueFrom``, which the ``train_job`` component's ``env``
(a map of names to values) cannot take -- KFP's type check refuses the list; and the local run's
summary, which masks secrets in what it prints, masked words of the advice itself
(``credentials: *** a Secret``, ``HF_TOKEN: *** it by reference``).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kfp import kubernetes
from kfp.dsl.types.type_utils import InconsistentTypeException
from test_cli_run_failure import kfp_error
from test_components_build_checks import built, refused_at_build, run_time_error

from kfp_trainer import spec
from kfp_trainer.components import train_job
from kfp_trainer.errors import EXIT_JOB_FAILED, InvalidSpecErrors
from kfp_trainer.local_failure import failure_block
from kfp_trainer.redaction import redact_text

REPO = Path(__file__).resolve().parents[2]
HF = "hf_" + "abcdefghijklmnopqrstuvwxyz0123456789"
S3 = "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI1K7MDENGbPxRfiCYEXAMPLEKEY@bucket/data"


def test_a_literal_token_in_env_proposes_use_secret_as_env_and_that_call_builds():
    refused = refused_at_build(lambda: train_job(env={"HF_TOKEN": HF}))
    advice = refused.errors[0].allowed
    call = re.search(r"kfp\.kubernetes\.use_secret_as_env\(task, (secret_name=.*?\})\)", advice)
    assert call, advice
    assert HF not in str(refused)

    def body() -> None:
        task = train_job(command=["python", "train.py"])
        eval(f"kubernetes.use_secret_as_env(task, {call.group(1)})", {"kubernetes": kubernetes, "task": task})  # noqa: S307

    text = built(body)
    assert "secretAsEnv" in text and "HF_TOKEN" in text and "my-secret" in text


def test_the_valueFrom_item_the_old_advice_proposed_is_refused_by_kfp_in_a_pipeline_but_taken_by_the_library():
    item = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "hf_token"}}}
    with pytest.raises(InconsistentTypeException, match="'LIST' is incompatible"):  # env is a map: KFP refuses a list
        built(lambda: train_job(env=[item]))
    advice = str(refused_at_build(lambda: train_job(env={"HF_TOKEN": HF})))
    assert "with build_trainjob or kfp-trainer launch" in advice and "'valueFrom'" in advice
    assert spec.build_trainjob(run_id="r", env=[item])["spec"]["trainer"]["env"] == [item]


def test_an_initializers_env_proposes_its_secret_input():
    with pytest.raises(InvalidSpecErrors, match=r"name that Secret in dataset_secret") as info:
        spec.build_trainjob(run_id="r", dataset_uri="hf://org/d", dataset_env={"HF_TOKEN": HF})
    assert HF not in str(info.value)


STEP_REFUSALS = [
    ("URI with credentials", {"dataset_uri": S3}, "name a Secret holding them in dataset_secret"),
    ("token in env", {"env": {"HF_TOKEN": HF}}, "secret_key_to_env={'hf_token': 'HF_TOKEN'}"),
    ("token after a flag", {"args": ["--hf-token", "secret-value-1234"]}, "no literal value after --hf-token -- take"),
]


@pytest.mark.parametrize(("what", "kwargs", "advice"), STEP_REFUSALS, ids=[c[0] for c in STEP_REFUSALS])
def test_the_local_runs_summary_shows_the_steps_refusal_as_the_step_worded_it(what, kwargs, advice, tmp_path, monkeypatch, capsys):
    printed = run_time_error(train_job, tmp_path, monkeypatch, capsys, **kwargs)
    lines = [line for line in printed.splitlines() if line.strip()]
    block = failure_block(kfp_error("train-job"), {"train-job": ["    " + line for line in lines]})
    assert advice in printed and advice in block, block
    for line in lines:
        assert line.replace("[kfp-trainer] ", "") in block, (line, block)
    for secret in (HF, "secret-value-1234", "wJalrXUtnFEMI1K7MDENGbPxRfiCYEXAMPLEKEY"):
        assert secret not in block


def test_the_summary_still_masks_secrets_in_a_failed_jobs_diagnosis_and_log():
    lines = [
        "    [kfp-trainer] error: TrainJob team/x-1 failed: BackoffLimitExceeded",
        "    pod x-node-0-0: exit code 1",
        f"    last log lines: HF_TOKEN={HF[:12]} and s3://user:pw@bucket",
        "    note: DB_PASSWORD=hunter2hunter2",
    ]
    block = failure_block(kfp_error("train"), {"train": lines})
    assert HF[:12] not in block and "user:pw" not in block and "hunter2" not in block
    assert "HF_TOKEN=***" in block and "DB_PASSWORD=***" in block


@pytest.mark.parametrize(
    ("text", "shown"),
    [("note: HF_TOKEN=abcdef123", "note: HF_TOKEN=***"), ("env: DB_PASSWORD=hunter2x", "env: DB_PASSWORD=***"),
     ("map {'hf_token': 'HF_TOKEN'}", "map {'hf_token': 'HF_TOKEN'}"), ("HF_TOKEN=HF_TOKEN_X", "HF_TOKEN=***")],
)  # fmt: skip
def test_an_assignment_is_masked_after_a_harmless_name_and_a_name_mapped_to_itself_is_not(text, shown):
    assert redact_text(text) == shown


def test_a_refused_local_run_prints_the_advice_whole_and_no_secret(tmp_path):
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "pipeline.py").write_text(
        "from kfp import dsl\n"
        "from kfp_trainer.components import train_job\n\n\n"
        '@dsl.pipeline(name="creds")\n'
        f'def pipeline(data: str = "{S3}"):\n'
        '    train_job(command=["python", "-c", "print(1)"], dataset_uri=data)\n'
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, "PYTHONPATH": str(REPO)}
    args = [sys.executable, "-m", "kfp_trainer.cli", "run", str(tmp_path / "creds"), "--local", "-o", str(tmp_path / "out")]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == EXIT_JOB_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    assert "expected a URI without credentials -- name a Secret holding them in dataset_secret" in done.stderr, done.stderr
    assert "***" not in done.stderr.split("expected", 1)[1] and "wJalr" not in done.stderr
