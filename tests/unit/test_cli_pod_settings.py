"""`kfp-trainer render` and `launch` take the typed pod settings, managed_by and queue_timeout as flags."""

from __future__ import annotations

import json

import pytest
import yaml

from kfp_trainer import cli


def test_render_flags_for_pod_settings_and_managed_by_reach_the_trainjob(capsys):
    code = cli.main([
        "render", "--api-version", "v2.2", "--run-id", "r1", "--task-name", "train", "--queue-name", "team-q",
        "--scheduling-gates", "example.com/a,b", "--security-context", '{"runAsNonRoot": true, "fsGroup": 100}',
        "--container-security-context", "readOnlyRootFilesystem: true", "--termination-grace-period-seconds", "90",
        "--init-containers", json.dumps([{"name": "fetch", "env": [{"name": "A", "value": "1"}]}]),
        "--managed-by", "kueue.x-k8s.io/multikueue",
    ])  # fmt: skip
    assert code == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod = pod["template"]["spec"]
    assert pod["schedulingGates"] == [{"name": "example.com/a"}, {"name": "b"}]
    assert pod["securityContext"] == {"runAsNonRoot": True, "fsGroup": 100} and pod["terminationGracePeriodSeconds"] == 90
    assert pod["containers"] == [{"name": "node", "securityContext": {"readOnlyRootFilesystem": True}}]
    assert pod["initContainers"] == [{"name": "fetch", "env": [{"name": "A", "value": "1"}]}]
    assert manifest["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--termination-grace-period-seconds", "soon"], "--termination-grace-period-seconds"),
        (["--managed-by", "me"], "managed_by"),
        (["--security-context", '{"privileged": true}'], "security_context.privileged"),
    ],
)
def test_bad_pod_setting_flags_end_in_a_clear_error(flags, named, capsys):
    assert exit_code(["render", "--api-version", "v2.2", "--run-id", "r1", *flags]) == 2
    assert named in capsys.readouterr().err


def test_launch_checks_queue_timeout_before_anything_else(capsys):
    assert exit_code(["launch", "--local", "--run-id", "r1", "--queue-timeout", "-5"]) == 2
    assert "queue_timeout: got -5.0" in capsys.readouterr().err


def exit_code(argv: list[str]) -> int | None:
    """The command's exit code, whether it returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
