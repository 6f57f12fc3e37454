"""Hostile inputs of the train_job component's own options and of the command line's files and flags."""

from __future__ import annotations

from hostile_common import HF, PLAIN, Case, CliCase, patch_node, trainer

# ---------------------------------------------------------------------- the component's own inputs
# Inputs of the train_job component that are not TrainJob inputs (launch options), and a
# hostile input that only the runtime can judge, with {dataset} to stage: nothing may be
# copied to the shared volume before it is refused ("workspace": the harness connects a
# dataset and a workspace volume and counts the files staged there as writes).
COMPONENT = ("component",)
COMPONENT_CASES: list[Case] = [
    Case("start-timeout-nan", {"start_timeout": float("nan")}, "start_timeout", layers=COMPONENT),
    Case("run-timeout-negative", {"run_timeout": -1.0}, "run_timeout", layers=COMPONENT),
    Case("run-timeout-text", {"run_timeout": "forever"}, "run_timeout", layers=COMPONENT),
    Case("queue-timeout-infinite", {"queue_timeout": float("inf")}, "queue_timeout", layers=COMPONENT),
    Case("queue-timeout-boolean", {"queue_timeout": True}, "queue_timeout", layers=COMPONENT),
    Case("logs-shell", {"logs": "0; rm -rf /"}, "logs", layers=COMPONENT),
    Case("backend-unknown", {"backend": "docker"}, "backend", layers=COMPONENT),
    Case("workspace-path-escape", {"workspace_path": "/kfp-workspace/../etc"}, "workspace_path", layers=COMPONENT),
    Case("delete-after-success-text", {"delete_after_success": "yes"}, "delete_after_success", layers=COMPONENT),
    Case(
        "staging-waits-for-the-host-access-verdict",
        {"args": ["--data", "{dataset}"], "patch": patch_node({}, hostNetwork=True)},
        "patch.spec.runtimePatches",
        layers=COMPONENT,
        setup="workspace",
    ),
    Case(
        "staging-waits-for-the-trainer-version-verdict",
        {"args": ["--data", "{dataset}"], "active_deadline_seconds": 60},
        "active_deadline_seconds",
        layers=COMPONENT,
        api_version="v2.1",
        setup="workspace",
    ),
    Case(
        "task-config-merge-with-a-wrong-type",
        {"env": f"HF_TOKEN={HF}", "volumes": "data"},
        "env",
        layers=COMPONENT,
        setup="workspace",
    ),
    Case(
        "staged-and-submitted-when-valid",
        {"args": ["--data", "{dataset}"]},
        check=lambda m: trainer(m)["args"][1].endswith("/dataset") and ".kfp-trainer" in trainer(m)["args"][1],
        layers=COMPONENT,
        setup="workspace",
    ),
]

# ---------------------------------------------------------------------- the command line's own inputs
MAP_FLAGS = ("resources-per-node", "labels", "annotations", "pod-labels", "pod-annotations", "node-selector", "affinity", "patch")
LIST_FLAGS = ("volumes", "volume-mounts", "tolerations")
ENV_FLAGS = ("dataset-env", "model-env")


def _laughs(levels: int = 30) -> bytes:
    lines = ["run_id: r", "patch:", '  l0: &l0 ["ha", "ha"]']
    lines += [f"  l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


R = ("render", "--run-id", "r")
CLI_CASES: list[CliCase] = [
    CliCase("file-missing", ("render", "--inputs-file", "{dir}/missing.yaml"), "cannot read it"),
    CliCase("file-is-a-folder", ("render", "--inputs-file", "{dir}"), "cannot read it"),
    CliCase(
        "file-python-object-tag",
        ("render", "--inputs-file", "{dir}/f.yaml"),
        "python/object/apply:os.system",
        (("f.yaml", b'runtime: !!python/object/apply:os.system ["touch /tmp/pwned"]\n'),),
    ),  # fmt: skip
    CliCase(
        "file-python-name-tag",
        ("render", "--inputs-file", "{dir}/f.yaml"),
        "python/name:os.system",
        (("f.yaml", b"runtime: !!python/name:os.system\n"),),
    ),  # fmt: skip
    CliCase("file-not-utf8", ("render", "--inputs-file", "{dir}/f.yaml"), "not UTF-8", (("f.yaml", b"run_id: \xff\xfe\n"),)),
    CliCase("file-binary", ("render", "--inputs-file", "{dir}/f.bin"), "not a text file", (("f.bin", b"\x7fELF\x00\x01\x02"),)),
    CliCase("file-a-list", ("render", "--inputs-file", "{dir}/f.yaml"), "expected a map", (("f.yaml", b"- a\n- b\n"),)),
    CliCase("file-number-keys", ("render", "--inputs-file", "{dir}/f.yaml"), "keys must be input names", (("f.yaml", b"1: 2\n"),)),
    CliCase("file-empty", ("render", "--inputs-file", "{dir}/f.yaml"), "run_id", (("f.yaml", b""),)),
    CliCase("file-bad-yaml", ("render", "--inputs-file", "{dir}/f.yaml"), "not valid YAML", (("f.yaml", f"run_id: [{PLAIN}\n".encode()),)),
    CliCase(
        "file-self-reference", ("render", "--inputs-file", "{dir}/f.yaml"), "patch", (("f.yaml", b"run_id: r\npatch: {x: &a [*a]}\n"),)
    ),
    CliCase("file-billion-laughs", ("render", "--inputs-file", "{dir}/f.yaml"), "patch", (("f.yaml", _laughs()),)),
    CliCase("file-too-large", ("render", "--inputs-file", "{dir}/f.yaml"), "larger than", (("f.yaml", b"#" * (9 * 2**20)),)),
    CliCase(
        "file-secret-in-unknown-key",
        ("render", "--inputs-file", "{dir}/f.yaml"),
        "hf_token",
        (("f.yaml", f"run_id: r\nhf_token: {HF}\n".encode()),),
    ),  # fmt: skip
    CliCase(
        "file-env-list-and-env-flag",
        ("render", "--inputs-file", "{dir}/f.yaml", "--env", "A=1"),
        "--env",
        (("f.yaml", b"run_id: r\nenv: [{name: B, value: '2'}]\n"),),
    ),  # fmt: skip
    *[CliCase(f"flag-{flag}-not-json", (*R, f"--{flag}", "{bad"), f"--{flag}") for flag in MAP_FLAGS + LIST_FLAGS + ENV_FLAGS],
    *[CliCase(f"flag-{flag}-a-list", (*R, f"--{flag}", "[1, 2]"), flag.replace("-", "_")) for flag in MAP_FLAGS],
    *[CliCase(f"flag-{flag}-a-map", (*R, f"--{flag}", '{"a": 1}'), flag.replace("-", "_")) for flag in LIST_FLAGS],
    *[CliCase(f"flag-{flag}-a-number", (*R, f"--{flag}", "5"), flag.replace("-", "_")) for flag in ENV_FLAGS],
    CliCase("flag-num-nodes-text", (*R, "--num-nodes", "two"), "--num-nodes"),
    CliCase("flag-num-nodes-exponent", (*R, "--num-nodes", "1e3"), "--num-nodes"),
    CliCase("flag-deadline-text", (*R, "--active-deadline-seconds", "soon"), "--active-deadline-seconds"),
    CliCase("flag-procs-superscript", (*R, "--num-proc-per-node", "²"), "num_proc_per_node"),
    CliCase("flag-command-bad-json", (*R, "--command", "[1,"), "--command"),
    CliCase("flag-command-objects", (*R, "--command", '[{"a": 1}]'), "--command"),
    CliCase("flag-args-secret", (*R, f"--args=--hf-token,{HF}"), "args[1]"),
    CliCase("flag-env-without-value", (*R, "--env", "NOEQUALS"), "NAME=VALUE"),
    CliCase("flag-env-secret", (*R, "--env", f"HF_TOKEN={HF}"), "env[0].value"),
    CliCase("flag-env-secret-without-equals", (*R, "--env", HF), "NAME=VALUE"),
    CliCase("flag-patch-nan", (*R, "--patch", '{"spec": {"trainer": {"numNodes": NaN}}}'), "patch.spec.trainer.numNodes"),
    CliCase("flag-resources-infinity", (*R, "--resources-per-node", '{"limits": {"cpu": Infinity}}'), "resources_per_node"),
    CliCase("flag-image-pull-secrets-bad", (*R, "--image-pull-secrets", "Reg_Cred"), "image_pull_secrets[0]"),
    CliCase("flag-launch-start-timeout-nan", ("launch", "--run-id", "r", "--start-timeout", "nan"), "start_timeout"),
    CliCase("flag-launch-logs-bad", ("launch", "--run-id", "r", "--logs", "node-0; rm -rf /"), "logs"),
]
