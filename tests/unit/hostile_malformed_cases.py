"""Hostile shapes: malformed env items that hold a secret, numbers in other scripts' digits, fractional quantities.

A malformed env item (extra keys, a list, a value that is not text, a control character)
is refused without showing any of its values; a number is read only from ASCII digits
(Python's ``int('١٢')`` is 12, the API server's is an error); a quantity given as a
number is read as the API server reads it (``0.1`` is ``"100m"``), but a fraction of a byte or
of a device is refused with the string to use.
"""

from __future__ import annotations

from hostile_common import HF, PLAIN, Case, CliCase, sidecar, trainer

ARABIC_12, FULLWIDTH_12 = "\u0661\u0662", "\uff11\uff12"  # '١٢', '１２': int() reads both as 12
DATA = {"dataset_uri": "hf://org/data"}
REF = {"secretKeyRef": {"name": "hf", "key": "token"}}

MALFORMED_CASES: list[Case] = [
    # ------------------------------------------------------------------ env items holding a secret
    Case("env-item-extra-key", {"env": [{"name": "HF_TOKEN", "value": PLAIN, "extra": 1}]}, "env[0]"),
    Case("env-item-extra-key-innocent-name", {"env": [{"name": "NOTES", "value": PLAIN, "x": "y"}]}, "env[0]"),
    Case("env-item-key-instead-of-name", {"env": [{"key": "HF_TOKEN", "value": PLAIN}]}, "env[0]"),
    Case("env-item-capitalised-keys", {"env": [{"Name": "HF_TOKEN", "Value": PLAIN}]}, "env[0]"),
    Case("env-item-value-a-list", {"env": [{"name": "HF_TOKEN", "value": [PLAIN]}]}, "env[0].value"),
    Case("env-item-value-a-map", {"env": [{"name": "HF_TOKEN", "value": {"v": PLAIN}}]}, "env[0].value"),
    Case("env-item-value-a-long-number", {"env": [{"name": "DB_PASSWORD", "value": 7305917730591}]}, "env[0].value"),
    Case("env-item-value-control-character", {"env": [{"name": "HF_TOKEN", "value": PLAIN + "\x01"}]}, "env[0].value"),
    Case("env-map-value-control-character", {"env": {"HF_TOKEN": PLAIN + "\x1b"}}, "env[0].value"),
    Case("env-item-value-and-value-from", {"env": [{"name": "HF_TOKEN", "value": PLAIN, "valueFrom": REF}]}, "env[0]"),
    Case("env-item-value-from-text", {"env": [{"name": "HF_TOKEN", "valueFrom": PLAIN}]}, "env[0].valueFrom"),
    Case("env-item-value-from-value", {"env": [{"name": "HF_TOKEN", "valueFrom": {"value": PLAIN}}]}, "env[0].valueFrom"),
    Case("env-item-a-list", {"env": [["HF_TOKEN", PLAIN]]}, "env[0]"),
    Case("env-item-an-assignment", {"env": [f"HF_TOKEN={PLAIN}"]}, "env[0]"),
    Case("env-a-plain-text", {"env": PLAIN}, "env"),
    Case("dataset-env-item-extra-key", {**DATA, "dataset_env": [{"name": "HF_TOKEN", "value": PLAIN, "x": 1}]}, "dataset_env[0]"),
    Case("dataset-env-item-control-character", {**DATA, "dataset_env": {"HF_TOKEN": PLAIN + "\x00"}}, "dataset_env[0].value"),
    Case("model-env-item-a-list", {"model_uri": "hf://org/model", "model_env": [["HF_TOKEN", HF]]}, "model_env[0]"),
    Case("patch-env-item-extra-key", {"patch": {"spec": {"trainer": {"env": [{"name": "HF_TOKEN", "value": PLAIN, "x": 1}]}}}},
         "patch.spec.trainer.env[0]"),  # fmt: skip
    Case("patch-env-item-control-character", {"patch": {"spec": {"trainer": {"env": [{"name": "HF_TOKEN", "value": PLAIN + "\x07"}]}}}},
         "patch.spec.trainer.env[0].value"),  # fmt: skip
    Case("patch-env-item-value-from-value", {"patch": {"spec": {"trainer": {"env": [{"name": "A", "valueFrom": {"value": PLAIN}}]}}}},
         "patch.spec.trainer.env[0].valueFrom"),  # fmt: skip
    Case("patch-sidecar-env-item-extra-key", {"patch": sidecar(env=[{"name": "HF_TOKEN", "value": PLAIN, "x": 1}])}, "patch.spec"),
    Case("patch-initializer-env-item-a-list",
         {**DATA, "patch": {"spec": {"initializer": {"dataset": {"env": [["HF_TOKEN", PLAIN]]}}}}}, "patch.spec.initializer"),  # fmt: skip
    # ------------------------------------------------------------------ numbers: ASCII digits only
    Case("num-nodes-arabic-indic-digits", {"num_nodes": ARABIC_12}, "num_nodes"),
    Case("num-nodes-fullwidth-digits", {"num_nodes": FULLWIDTH_12}, "num_nodes"),
    Case("num-proc-per-node-fullwidth-digits", {"num_proc_per_node": FULLWIDTH_12}, "num_proc_per_node"),
    Case("deadline-arabic-indic-digits", {"active_deadline_seconds": ARABIC_12}, "active_deadline_seconds"),
    Case("grace-fullwidth-digits", {"termination_grace_period_seconds": FULLWIDTH_12}, "termination_grace_period_seconds"),
    Case("cpu-arabic-indic-digits", {"resources_per_node": {"limits": {"cpu": ARABIC_12}}}, "resources_per_node.limits['cpu']"),
    Case("memory-fullwidth-digits", {"resources_per_node": {"limits": {"memory": FULLWIDTH_12 + "Gi"}}},
         "resources_per_node.limits['memory']"),  # fmt: skip
    # ------------------------------------------------------------------ quantities as numbers, fractions
    Case("cpu-finer-than-a-nanocore", {"resources_per_node": {"limits": {"cpu": 1e-10}}}, "resources_per_node.limits['cpu']"),
    Case("memory-a-fractional-number", {"resources_per_node": {"requests": {"memory": 1.5}}}, "resources_per_node.requests['memory']"),
    Case("memory-a-fraction-of-a-byte", {"resources_per_node": {"limits": {"memory": "1500m"}}}, "resources_per_node.limits['memory']"),
    Case("gpu-a-fraction", {"resources_per_node": {"limits": {"nvidia.com/gpu": 0.5}}}, "resources_per_node.limits['nvidia.com/gpu']"),
    Case("patch-memory-a-fractional-number", {"patch": {"spec": {"trainer": {"resourcesPerNode": {"limits": {"memory": 1.5}}}}}},
         "patch.spec.trainer.resourcesPerNode.limits['memory']"),  # fmt: skip
    Case(
        "quantities-as-numbers-rendered-as-the-api-server-stores-them",
        {"resources_per_node": {"limits": {"cpu": 2.0, "memory": 17179869184.0, "nvidia.com/gpu": 1.0}, "requests": {"cpu": 0.1}}},
        check=lambda m: trainer(m)["resourcesPerNode"]
        == {"limits": {"cpu": "2", "memory": "17179869184", "nvidia.com/gpu": "1"}, "requests": {"cpu": "100m"}},
    ),
]

# The train_job component's own options (a KFP float input may reach the step as text).
MALFORMED_COMPONENT_CASES: list[Case] = [
    Case(f"{option}-arabic-indic-digits", {option: ARABIC_12}, option, layers=("component",))
    for option in ("start_timeout", "run_timeout", "queue_timeout")
] + [Case("logs-fullwidth-node-index", {"logs": FULLWIDTH_12}, "logs", layers=("component",))]

R = ("render", "--run-id", "r")
MALFORMED_CLI_CASES: list[CliCase] = [
    CliCase("flag-env-plain-secret-without-equals", (*R, "--env", PLAIN), "NAME=VALUE"),
    CliCase("flag-env-secret-with-control-character", (*R, "--env", f"HF_TOKEN={PLAIN}\x01"), "env[0].value"),
    CliCase(
        "flag-dataset-env-item-extra-key",
        (*R, "--dataset-uri", "hf://o/d", "--dataset-env", f'[{{"name": "HF_TOKEN", "value": "{PLAIN}", "x": 1}}]'),
        "dataset_env[0]",
    ),
    CliCase("flag-num-nodes-fullwidth", (*R, "--num-nodes", FULLWIDTH_12), "--num-nodes"),
    CliCase("flag-num-nodes-arabic-indic", (*R, "--num-nodes", ARABIC_12), "ASCII digits"),
    CliCase("flag-num-nodes-digit-groups", (*R, "--num-nodes", "1_0"), "--num-nodes"),
    CliCase("flag-grace-arabic-indic", (*R, "--termination-grace-period-seconds", ARABIC_12), "--termination-grace-period-seconds"),
    CliCase("flag-procs-arabic-indic", (*R, "--num-proc-per-node", ARABIC_12), "num_proc_per_node"),
    CliCase("flag-memory-fullwidth", (*R, "--resources-per-node", f'{{"limits": {{"memory": "{FULLWIDTH_12}Gi"}}}}'), "memory"),
    CliCase("flag-memory-fractional-number", (*R, "--resources-per-node", '{"limits": {"memory": 1.5}}'), "whole number of bytes"),
    *[
        CliCase(f"flag-launch-{flag}-arabic-indic", ("launch", "--run-id", "r", f"--{flag}", ARABIC_12), f"--{flag}")
        for flag in ("start-timeout", "run-timeout", "queue-timeout")
    ],
    CliCase("flag-gc-older-than-fullwidth", ("gc", "--older-than", FULLWIDTH_12 + "h"), "--older-than"),
]
