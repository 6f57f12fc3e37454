"""The pod scripting contract (hack/k8s/testcluster/scripting.py) and the KWOK stages that
read it agree; no cluster needed."""

from __future__ import annotations

import json
import re

import pytest
from testcluster import PodScript, format_gates, kwok, parse_gates, scripting


def test_every_annotation_the_stages_read_is_part_of_the_contract():
    text = json.dumps(kwok.stages())
    assert "@" not in "".join(re.findall(r"@[a-z_]+@", text)), "a jq macro was left unexpanded"
    used = set(re.findall(r"script\.kfp-trainer\.test/[a-z-]+", text))
    constants = [v for k, v in vars(scripting).items() if k.isupper() and isinstance(v, str)]
    known = {v for v in constants if v.startswith(scripting.PREFIX) and v != scripting.PREFIX}
    assert used and used <= known, used - known
    # Every behaviour a test can script reaches the stages (the log itself is the pod scripting process's).
    assert known - used == {scripting.LOG, scripting.LINE_DELAY, scripting.CRASH_AFTER}


def test_stages_cover_a_pods_whole_life():
    names = [s["metadata"]["name"] for s in kwok.stages() if s["spec"]["resourceRef"]["kind"] == "Pod"]
    assert names == ["pod-create", "pod-start", "pod-exit", "pod-fail", "pod-crash", "pod-restart", "pod-delete"]


def test_a_script_becomes_annotations_and_back():
    script = PodScript(lines=["a", "b", "c"], line_delay=0.25, crashes=2, crash_after=[1, 2], exit_code=3, exit_delay=float("inf"))
    ann = script.annotations()
    assert ann[scripting.EXIT_DELAY] == "never" and ann[scripting.CRASHES] == "2" and ann[scripting.EXIT_CODE] == "3"
    assert [scripting.instance_log(ann, i).lines for i in range(3)] == [["a"], ["a", "b"], ["a", "b", "c"]]
    assert scripting.instance_log(ann, 0).line_delay == 0.25
    assert PodScript(crashes=-1).annotations()[scripting.CRASHES] == "always"
    assert PodScript().annotations() == {}
    with pytest.raises(ValueError, match="negative"):
        PodScript(start_delay=-1).annotations()


def test_feature_gates_parse_and_format():
    assert parse_gates(format_gates({"TrainJobStatus": True})) == {"TrainJobStatus": True}
    with pytest.raises(ValueError, match="Name=true"):
        parse_gates("TrainJobStatus")
