"""Hostile inputs through render, the launcher and the train_job component.

Every case of ``hostile_cases`` is either rejected before anything is written (no TrainJob
submitted or deleted, no file staged or written by the step) with the field named and exit
code 2, or accepted with what it renders asserted. Never a traceback; no secret value in
any error, log line, submitted TrainJob, output artifact or report.
"""

from __future__ import annotations

import pytest
from hostile_cases import CANARIES, CASES, COMPONENT_CASES, HF, Case
from hostile_harness import Result, problems, run

from kfp_trainer.spec import TrainJobInputs

RUNS = [(case, entry) for case in CASES + COMPONENT_CASES for entry in case.layers if entry != "cli"]


@pytest.mark.parametrize(("case", "entry"), RUNS, ids=[f"{entry}-{case.id}" for case, entry in RUNS])
def test_hostile_input_is_rejected_naming_the_field_or_rendered_safely(case: Case, entry: str, tmp_path):
    assert problems(case, run(case, entry, tmp_path)) == []


def test_every_trainjob_input_and_the_patch_has_rejected_cases_and_a_check_of_what_is_accepted():
    rejected = {key for case in CASES if not case.accepted for key in case.inputs}
    accepted = {key for case in CASES if case.accepted for key in case.inputs}
    assert set(TrainJobInputs.model_fields) - rejected == set()
    assert {"patch", "env", "args", "annotations", "volumes", "num_proc_per_node"} <= accepted
    assert all(case.check is not None for case in CASES + COMPONENT_CASES if case.accepted)


def test_every_secret_kind_is_tried_rejected_and_accepted():
    for canary in CANARIES:
        assert any(canary in case.secrets for case in CASES if not case.accepted), canary
    assert any(case.allow_host_access and case.accepted for case in CASES)


def test_the_checker_notices_leaks_tracebacks_writes_and_unnamed_fields():
    rejected = next(c for c in CASES if c.id == "env-hf-token")
    ok = Result("launcher", True, 2, "env[0].value: got '<hidden>'", ["env[0].value"])
    assert problems(rejected, ok) == []
    assert "secret exposed" in problems(rejected, Result("launcher", True, 2, f"got {HF!r}", ["env[0].value"]))[0]
    assert problems(rejected, Result("cli", True, 2, "Traceback (most recent call last)", [])) != []
    assert problems(rejected, Result("launcher", True, 2, "x", ["env[0].value"], writes=[("submit", "j")])) != []
    assert problems(rejected, Result("launcher", True, 2, "x", ["image"])) != []
    assert problems(rejected, Result("launcher", False, 0, manifest={})) != []
    accepted = next(c for c in CASES if c.id == "num-nodes-at-the-limit")
    assert problems(accepted, Result("render", False, 0, manifest={"spec": {"trainer": {"numNodes": 1024}}})) == []
    assert problems(accepted, Result("render", False, 0, manifest={"spec": {"trainer": {"numNodes": 1023}}})) != []
