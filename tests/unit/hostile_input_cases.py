"""Hostile values for every TrainJob input: identity, runtime, trainer, env, counts, initializers, metadata, pods, lifecycle."""

from __future__ import annotations

from hostile_common import AWS_ID, AWS_KEY, BIG, GH, HF, PLAIN, PVC, Case, at, deep, pod, trainer

NO_COMPONENT = ("render", "launcher", "cli")  # the component reads 0 as "the runtime's default"

INPUT_CASES: list[Case] = [
    # ------------------------------------------------------------------ identity
    Case("name-trailing-newline", {"name": "train-1\n"}, "name"),
    Case("name-upper-case", {"name": "Train"}, "name"),
    Case("name-too-long", {"name": "a" * 64}, "name"),
    Case("name-nul", {"name": "tr\x00ain"}, "name"),
    Case("name-path", {"name": "../etc"}, "name"),
    Case("name-prefix-newline", {"name_prefix": "train\n"}, "name_prefix"),
    Case("name-prefix-too-long", {"name_prefix": "p" * 40}, "name_prefix"),
    Case("namespace-trailing-newline", {"namespace": "team-a\n"}, "namespace"),
    Case("namespace-underscore", {"namespace": "kube_system"}, "namespace"),
    Case("namespace-traversal", {"namespace": "a/../kube-system"}, "namespace"),
    Case("run-id-nul", {"run_id": "run\x00-1"}, "run_id"),
    Case("run-id-escape-sequence", {"run_id": "run-1\x1b[2J"}, "run_id"),
    Case("run-id-too-long", {"run_id": "r" * 2000}, "run_id"),
    Case("task-name-bell", {"task_name": "train\x07"}, "task_name"),
    Case("pipeline-name-nul", {"pipeline_name": "p\x00"}, "pipeline_name"),
    Case("task-id-nul", {"task_id": "t\x00"}, "task_id"),
    Case(
        "run-id-free-text-is-sanitised",
        {"run_id": "Run #1 (retry)", "task_name": "Train Job"},
        check=lambda m: (
            m["metadata"]["labels"]["kfp-trainer.kubeflow.org/run-id"] == "Run-1-retry"
            and m["metadata"]["annotations"]["kfp-trainer.kubeflow.org/run-id"] == "Run #1 (retry)"
            and m["metadata"]["name"].startswith("train-job-")
        ),
    ),
    Case("unknown-input-hides-its-value", {"hf_token": HF}, "hf_token", layers=("render", "launcher", "cli")),
    # ------------------------------------------------------------------ runtime
    Case("runtime-trailing-newline", {"runtime": "torch-distributed\n"}, "runtime"),
    Case("runtime-traversal", {"runtime": "../secrets"}, "runtime"),
    Case("runtime-empty", {"runtime": ""}, "runtime"),
    Case("runtime-kind-newline", {"runtime_kind": "ClusterTrainingRuntime\n"}, "runtime_kind"),
    Case("runtime-kind-other", {"runtime_kind": "Pod"}, "runtime_kind"),
    Case("runtime-not-text", {"runtime": ["torch-distributed"]}, "runtime"),
    # ------------------------------------------------------------------ image, command, args
    Case("image-trailing-newline", {"image": "trainer:1\n"}, "image"),
    Case("image-space", {"image": "my image:1"}, "image"),
    Case("image-shell", {"image": "trainer:1;rm -rf /"}, "image"),
    Case("image-credentials", {"image": f"user:{PLAIN}@registry.example.com/trainer:1"}, "image"),
    Case("image-bytes", {"image": b"trainer:1"}, "image"),
    Case(
        "image-with-digest",
        {"image": "ghcr.io/example/trainer:1.0@sha256:" + "a" * 64},
        check=lambda m: trainer(m)["image"].endswith("a" * 64),
    ),
    Case("command-nul", {"command": ["python", "train\x00.py"]}, "command[1]"),
    Case("command-too-many", {"command": ["x"] * 129}, "command"),
    Case("command-not-strings", {"command": ["python", {"a": 1}]}, "command"),
    Case("args-token-after-flag", {"args": ["--hf-token", HF]}, "args[1]"),
    Case("resume-args-token-after-flag", {"resume_args": ["--hf-token", HF]}, "resume_args[1]", layers=("render", "launcher")),
    Case("args-password-assignment", {"args": [f"--password={PLAIN}"]}, "args[0]"),
    Case("args-api-key-after-flag", {"args": ["--api-key", PLAIN]}, "args[1]"),
    Case("args-env-assignment", {"args": ["env", f"HF_TOKEN={PLAIN}", "python", "t.py"]}, "args[1]"),
    Case("args-shell-export", {"args": ["-c", f"export AWS_SECRET_ACCESS_KEY={AWS_KEY}; python t.py"]}, "args[1]"),
    Case("args-uri-credentials", {"args": ["--data", f"s3://{AWS_ID}:{AWS_KEY}@bucket/x"]}, "args[1]"),
    Case("args-github-token", {"args": ["--push", GH]}, "args[1]"),
    Case("args-bearer", {"args": ["-H", f"Authorization: Bearer {PLAIN}"]}, "args[1]"),
    Case("args-escape", {"args": ["\x1b]0;owned\x07"]}, "args[0]"),
    Case("args-over-128-kib", {"args": ["x" * BIG]}, "args[0]"),
    Case(
        "args-trailing-newline-is-free-text",
        {"args": ["--greeting", "hello\n"]},
        check=lambda m: trainer(m)["args"] == ["--greeting", "hello\n"],
    ),
    Case(
        "args-secret-by-reference",
        {
            "args": ["--hf-token=$(HF_TOKEN)"],
            "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        },
        check=lambda m: trainer(m)["args"] == ["--hf-token=$(HF_TOKEN)"] and "value" not in trainer(m)["env"][0],
    ),
    Case(
        "args-unicode-and-uris-without-credentials",
        {"args": ["--prompt", "日本語 ✓", "--data", "s3://bucket/data", "--max-tokens", "512"]},
        check=lambda m: trainer(m)["args"][1] == "日本語 ✓" and trainer(m)["args"][3] == "s3://bucket/data",
    ),
    Case(
        "args-password-file-is-a-path",
        {"args": ["--password-file", "/run/secrets/db/password", "--use-auth-token", "true"]},
        check=lambda m: trainer(m)["args"][1] == "/run/secrets/db/password",
    ),
    # ------------------------------------------------------------------ env
    Case("env-hf-token", {"env": {"HF_TOKEN": HF}}, "env[0].value"),
    Case("env-hf-dash-token", {"env": {"HF-TOKEN": PLAIN}}, "env[0].value"),
    Case("env-hftoken", {"env": {"HFTOKEN": PLAIN}}, "env[0].value"),
    Case("env-hf-dot-token", {"env": {"hf.token": PLAIN}}, "env[0].value"),
    Case("env-camel-token", {"env": {"hfToken": PLAIN}}, "env[0].value"),
    Case("env-token-qualified", {"env": {"HF_TOKEN_READ": PLAIN}}, "env[0].value"),
    Case("env-aws-secret", {"env": {"AWS_SECRET_ACCESS_KEY": AWS_KEY}}, "env[0].value"),
    Case("env-aws-key-id", {"env": {"AWS_ACCESS_KEY_ID": AWS_ID}}, "env[0].value"),
    Case("env-aws-session", {"env": {"AWS_SESSION_TOKEN": PLAIN}}, "env[0].value"),
    Case("env-azure-client-secret", {"env": {"AZURE_CLIENT_SECRET": PLAIN}}, "env[0].value"),
    Case("env-azure-connection-string", {"env": {"AZURE_STORAGE_CONNECTION_STRING": f"AccountKey={PLAIN}"}}, "env[0].value"),
    Case("env-google-api-key", {"env": {"GOOGLE_API_KEY": PLAIN}}, "env[0].value"),
    Case("env-gcp-credentials-json", {"env": {"GOOGLE_CREDENTIALS": '{"private_key": "' + PLAIN + '"}'}}, "env[0].value"),
    Case("env-db-password", {"env": {"DB_PASSWORD_2": PLAIN}}, "env[0].value"),
    Case("env-wandb", {"env": {"WANDB_API_KEY": PLAIN}}, "env[0].value"),
    Case("env-token-under-innocent-name", {"env": {"NOTES": f"use {HF}"}}, "env[0].value"),
    Case("env-uri-credentials-under-innocent-name", {"env": {"DATA_URL": f"https://bob:{PLAIN}@example.com/d"}}, "env[0].value"),
    Case("env-list-secret", {"env": [{"name": "GITHUB_TOKEN", "value": GH}]}, "env[0].value"),
    Case("env-type-error-hides-value", {"env": {"HF_TOKEN": [PLAIN]}}, "env"),
    Case("env-nul", {"env": {"A": "x\x00y"}}, "env[0].value"),
    Case("env-escape", {"env": {"A": "x\x1b[31m"}}, "env[0].value"),
    Case("env-two-mib", {"env": {"BIG": "x" * (2 * 2**20)}}, "env[0].value"),
    Case("env-reserved-pet", {"env": {"PET_NNODES": "64"}}, "env[0].name"),
    Case("env-reserved-lower-case", {"env": {"pet_master_addr": "evil"}}, "env[0].name"),
    Case("env-reserved-ompi", {"env": {"OMPI_MCA_plm": "x"}}, "env[0].name"),
    Case("env-name-newline", {"env": [{"name": "A\n", "value": "1"}]}, "env[0].name"),
    Case("env-duplicate", {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env[1].name"),
    Case("env-number-value", {"env": [{"name": "A", "value": 5}]}, "env[0].value"),
    Case("env-bad-value-from", {"env": [{"name": "A", "valueFrom": {"secretRef": {"name": "s"}}}]}, "env[0].valueFrom"),
    Case("env-extra-key", {"env": [{"name": "A", "value": "1", "command": ["sh"]}]}, "env[0]"),
    Case("env-as-text", {"env": f"HF_TOKEN={HF}"}, "env"),
    Case(
        "env-secret-by-reference-and-config",
        {
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                {"name": "PAD_TOKEN", "value": "<pad>"},
                {"name": "MAX_TOKENS", "value": "512"},
                {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/secrets/google/key.json"},
                {"name": "CONFIG", "value": "a: 1\n\tb: 2\n"},
            ]
        },
        check=lambda m: (
            [e.get("value") for e in trainer(m)["env"]] == [None, "<pad>", "512", "/var/secrets/google/key.json", "a: 1\n\tb: 2\n"]
        ),
    ),
    # ------------------------------------------------------------------ node counts and resources
    Case("num-nodes-zero", {"num_nodes": 0}, "num_nodes", layers=NO_COMPONENT),
    Case("num-nodes-negative", {"num_nodes": -3}, "num_nodes"),
    Case("num-nodes-million", {"num_nodes": 1_000_000}, "num_nodes"),
    Case("num-nodes-huge", {"num_nodes": 10**30}, "num_nodes"),
    Case("num-nodes-boolean", {"num_nodes": True}, "num_nodes"),
    Case("num-nodes-fraction", {"num_nodes": 2.5}, "num_nodes"),
    Case("num-nodes-nan", {"num_nodes": float("nan")}, "num_nodes"),
    Case("num-nodes-text", {"num_nodes": "two"}, "num_nodes"),
    Case("num-nodes-at-the-limit", {"num_nodes": 1024}, check=lambda m: trainer(m)["numNodes"] == 1024),
    Case("procs-zero", {"num_proc_per_node": 0}, "num_proc_per_node"),
    Case("procs-auto-on-v22", {"num_proc_per_node": "auto"}, "num_proc_per_node"),
    Case("procs-superscript", {"num_proc_per_node": "²"}, "num_proc_per_node"),
    Case("procs-newline", {"num_proc_per_node": "4\n"}, "num_proc_per_node"),
    Case("procs-huge", {"num_proc_per_node": 10**6}, "num_proc_per_node"),
    Case("procs-boolean", {"num_proc_per_node": True}, "num_proc_per_node"),
    Case("procs-auto-on-v21", {"num_proc_per_node": "auto"}, check=lambda m: trainer(m)["numProcPerNode"] == "auto", api_version="v2.1"),
    Case("cpu-nan", {"resources_per_node": {"limits": {"cpu": float("nan")}}}, "resources_per_node.limits['cpu']"),
    Case("cpu-nan-text", {"resources_per_node": {"limits": {"cpu": "NaN"}}}, "resources_per_node.limits['cpu']"),
    Case("cpu-infinity", {"resources_per_node": {"limits": {"cpu": float("inf")}}}, "resources_per_node.limits['cpu']"),
    Case("cpu-huge-exponent", {"resources_per_node": {"limits": {"cpu": "1e99999"}}}, "resources_per_node.limits['cpu']"),
    Case("memory-over-64-bits", {"resources_per_node": {"limits": {"memory": "9Ei"}}}, "resources_per_node.limits['memory']"),
    Case("memory-trailing-newline", {"resources_per_node": {"limits": {"memory": "16Gi\n"}}}, "resources_per_node.limits['memory']"),
    Case("gpu-boolean", {"resources_per_node": {"limits": {"nvidia.com/gpu": True}}}, "resources_per_node.limits['nvidia.com/gpu']"),
    Case(
        "requests-over-limits",
        {"resources_per_node": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}},
        "resources_per_node.requests['cpu']",
    ),
    Case("limits-not-a-map", {"resources_per_node": {"limits": ["cpu"]}}, "resources_per_node.limits"),
    Case(
        "resources-at-the-limits",
        {"resources_per_node": {"limits": {"memory": "7Ei", "cpu": "0", "nvidia.com/gpu": 8}}},
        check=lambda m: trainer(m)["resourcesPerNode"]["limits"] == {"memory": "7Ei", "cpu": "0", "nvidia.com/gpu": "8"},
    ),
    # ------------------------------------------------------------------ initializers
    Case("dataset-s3-traversal", {"dataset_uri": "s3://bucket/../../etc"}, "dataset_uri"),
    Case("dataset-s3-encoded-traversal", {"dataset_uri": "s3://bucket/%2e%2e/%2E%2E/etc"}, "dataset_uri"),
    Case("dataset-s3-credentials", {"dataset_uri": f"s3://{AWS_ID}:{AWS_KEY}@bucket/data"}, "dataset_uri"),
    Case("dataset-https-credentials", {"dataset_uri": f"https://user:{PLAIN}@example.com/data"}, "dataset_uri"),
    Case("dataset-trailing-newline", {"dataset_uri": "hf://org/data\n"}, "dataset_uri"),
    Case("dataset-file-on-cluster", {"dataset_uri": "file:///etc/passwd"}, "dataset_uri"),
    Case("dataset-cache-traversal", {"dataset_uri": "cache://../x"}, "dataset_uri"),
    Case("dataset-bad-bucket", {"dataset_uri": "s3://-/x"}, "dataset_uri"),
    Case("dataset-secret-bad-name", {"dataset_uri": "hf://org/d", "dataset_secret": "HF_Token\n"}, "dataset_secret"),
    Case("dataset-env-secret", {"dataset_uri": "hf://org/d", "dataset_env": {"ACCESS_TOKEN": HF}}, "dataset_env[0].value"),
    Case("dataset-env-nul", {"dataset_uri": "hf://org/d", "dataset_env": {"A": "\x00"}}, "dataset_env[0].value"),
    Case("model-hf-traversal", {"model_uri": "hf://../../x"}, "model_uri"),
    Case("model-hf-token-as-user", {"model_uri": f"hf://{HF}@org/model"}, "model_uri"),
    Case("model-hf-user-password", {"model_uri": f"hf://me:{PLAIN}@org/model"}, "model_uri"),
    Case("model-too-long", {"model_uri": "s3://bucket/" + "k" * 3000}, "model_uri"),
    Case("model-secret-without-uri", {"model_secret": "s3-creds"}, "model_uri"),
    Case("model-env-secret", {"model_uri": "s3://b/m", "model_env": {"SECRET_ACCESS_KEY": AWS_KEY}}, "model_env[0].value"),
    Case(
        "initializers-by-reference",
        # a runtime with initializer jobs: the Trainer webhook refuses initializers on one without
        {"runtime": "torchtune-qwen2.5-1.5b", "dataset_uri": "hf://tatsu-lab/alpaca@main", "dataset_secret": "hf-token", "model_uri": "s3://models/v1.2/qwen"},
        check=lambda m: (
            m["spec"]["initializer"]
            == {
                "dataset": {"storageUri": "hf://tatsu-lab/alpaca@main", "secretRef": {"name": "hf-token"}},
                "model": {"storageUri": "s3://models/v1.2/qwen"},
            }
        ),
    ),
    # ------------------------------------------------------------------ labels and annotations
    Case("label-value-newline", {"labels": {"team": "nlp\n"}}, "labels['team']"),
    Case("label-key-bad", {"labels": {"bad key!": "v"}}, "labels['bad key!']"),
    Case("label-lineage-key", {"labels": {"kfp-trainer.kubeflow.org/run-id": "other-run"}}, "labels['kfp-trainer.kubeflow.org/run-id']"),
    Case("pod-label-managed-by", {"pod_labels": {"app.kubernetes.io/managed-by": "me"}}, "pod_labels['app.kubernetes.io/managed-by']"),
    Case("pod-label-too-long", {"pod_labels": {"a": "x" * 64}}, "pod_labels['a']"),
    Case("annotation-nul", {"annotations": {"example.com/note": "a\x00b"}}, "annotations['example.com/note']"),
    Case("annotation-secret-key", {"annotations": {"example.com/api-token": PLAIN}}, "annotations['example.com/api-token']"),
    Case("annotation-aws-key-value", {"annotations": {"example.com/note": AWS_ID}}, "annotations['example.com/note']"),
    Case(
        "pod-annotation-secret", {"pod_annotations": {"vault.example.com/password": PLAIN}}, "pod_annotations['vault.example.com/password']"
    ),
    Case("annotations-over-256-kib", {"annotations": {f"example.com/n{i}": "x" * 100_000 for i in range(3)}}, "annotations"),
    Case(
        "annotations-free-text",
        {"annotations": {"example.com/note": "line 1\nline 2", "example.com/token-file": "/var/run/t"}},
        check=lambda m: (
            at(m, "spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "metadata", "annotations")
            == {"example.com/note": "line 1\nline 2", "example.com/token-file": "/var/run/t"}
        ),
    ),
    # ------------------------------------------------------------------ pod settings
    Case("volume-host-path", {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "volumes[0].hostPath"),
    Case(
        "volume-host-path-allowed-by-admin",
        {"volumes": [{"name": "root", "hostPath": {"path": "/data"}}], "volume_mounts": [{"name": "root", "mountPath": "/data"}]},
        check=lambda m: pod(m)["volumes"] == [{"name": "root", "hostPath": {"path": "/data"}}],
        allow_host_access=True,
    ),
    Case("volume-two-sources", {"volumes": [{"name": "v", "emptyDir": {}, "hostPath": {"path": "/"}}]}, "volumes[0]"),
    Case("volume-name-newline", {"volumes": [{"name": "v\n", "emptyDir": {}}]}, "volumes[0].name"),
    Case("volume-nan-inside", {"volumes": [{"name": "v", "emptyDir": {"sizeLimit": float("nan")}}]}, "volumes[0].emptyDir.sizeLimit"),
    Case("volume-nested-deep", {"volumes": [{"name": "v", "csi": deep(100)}]}, "volumes"),
    Case("volumes-as-map", {"volumes": {"name": "v"}}, "volumes"),
    Case(
        "mount-dot-dot", {"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "/data/../etc"}]}, "volume_mounts[0].mountPath"
    ),
    Case("mount-relative", {"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "data"}]}, "volume_mounts[0].mountPath"),
    Case(
        "mount-sub-path-escape",
        {"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "/d", "subPath": "../../x"}]},
        "volume_mounts[0].subPath",
    ),
    Case(
        "mount-bidirectional",
        {"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "/d", "mountPropagation": "Bidirectional"}]},
        "volume_mounts[0].mountPropagation",
    ),
    Case("mount-unknown-volume", {"volume_mounts": [{"name": "nope", "mountPath": "/d"}]}, "volume_mounts[0].name"),
    Case(
        "mount-with-sub-path",
        {"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "/data", "subPath": "runs/1", "readOnly": True}]},
        check=lambda m: (
            pod(m)["containers"]
            == [{"name": "node", "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "runs/1", "readOnly": True}]}]
        ),
    ),
    Case("node-selector-newline", {"node_selector": {"pool": "gpu\n"}}, "node_selector['pool']"),
    Case("toleration-operator", {"tolerations": [{"key": "k", "operator": "In"}]}, "tolerations[0].operator"),
    Case(
        "toleration-seconds-nan",
        {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": float("nan")}]},
        "tolerations[0].tolerationSeconds",
    ),
    Case(
        "tolerations-accepted",
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 60}]},
        check=lambda m: pod(m)["tolerations"][0]["tolerationSeconds"] == 60,
    ),
    Case("affinity-bad-key", {"affinity": {"nodeAfinity": {}}}, "affinity"),
    Case("affinity-infinity", {"affinity": {"nodeAffinity": {"weight": float("inf")}}}, "affinity.nodeAffinity.weight"),
    Case("service-account-newline", {"service_account": "default\n"}, "service_account"),
    Case("service-account-upper", {"service_account": "Admin"}, "service_account"),
    Case("pull-secret-bad", {"image_pull_secrets": ["Reg_Cred"]}, "image_pull_secrets[0]"),
    Case("pod-target-unknown", {"pod_targets": ["worker"]}, "pod_targets[0]"),
    Case("pod-target-newline", {"pod_targets": ["node\n"]}, "pod_targets[0]"),
    Case("gate-space", {"scheduling_gates": ["example.com/my gate"]}, "scheduling_gates[0]"),
    Case("gate-newline", {"scheduling_gates": ["example.com/gate\n"]}, "scheduling_gates[0]"),
    Case("gate-twice", {"scheduling_gates": ["g", "g"]}, "scheduling_gates[1]"),
    Case("gates-over-16", {"scheduling_gates": [f"g{i}" for i in range(17)]}, "scheduling_gates"),
    Case(
        "gates-accepted",
        {"scheduling_gates": ["example.com/quota-ready", "ready"]},
        check=lambda m: pod(m)["schedulingGates"] == [{"name": "example.com/quota-ready"}, {"name": "ready"}],
    ),
    Case("security-context-se-linux-spc", {"security_context": {"seLinuxOptions": {"type": "spc_t"}}}, "security_context.seLinuxOptions"),
    Case("security-context-unsafe-sysctl", {"security_context": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
         "security_context.sysctls[0].name"),  # fmt: skip
    Case("security-context-unconfined", {"security_context": {"seccompProfile": {"type": "Unconfined"}}},
         "security_context.seccompProfile"),  # fmt: skip
    Case("security-context-run-as-text", {"security_context": {"runAsUser": "root"}}, "security_context.runAsUser"),
    Case("security-context-unknown-key", {"security_context": {"privileged": True}}, "security_context.privileged"),
    Case("security-context-on-v21", {"security_context": {"runAsNonRoot": True}}, "security_context", api_version="v2.1"),
    Case("security-context-nan", {"security_context": {"fsGroup": float("nan")}}, "security_context.fsGroup"),
    Case(
        "security-context-accepted",
        {"security_context": {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"},
                              "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}},
        check=lambda m: pod(m)["securityContext"]["fsGroup"] == 2000 and pod(m)["securityContext"]["sysctls"][0]["value"] == "60",
    ),  # fmt: skip
    Case("container-privileged", {"container_security_context": {"privileged": True}}, "container_security_context.privileged"),
    Case("container-capabilities", {"container_security_context": {"capabilities": {"add": ["SYS_ADMIN"]}}},
         "container_security_context.capabilities"),  # fmt: skip
    Case("container-escalation", {"container_security_context": {"allowPrivilegeEscalation": True}},
         "container_security_context.allowPrivilegeEscalation"),  # fmt: skip
    Case("container-secret-in-option", {"container_security_context": {"seLinuxOptions": {"level": f"s0:{HF}"}}},
         "container_security_context"),  # fmt: skip
    Case(
        "container-privileged-allowed-by-admin",
        {"container_security_context": {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}}},
        check=lambda m: pod(m)["containers"][0]["securityContext"] == {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
        allow_host_access=True,
    ),
    Case(
        "container-hardened",
        {"container_security_context": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}}},
        check=lambda m: pod(m)["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]},
    ),  # fmt: skip
    Case("grace-negative", {"termination_grace_period_seconds": -2}, "termination_grace_period_seconds"),
    Case("grace-boolean", {"termination_grace_period_seconds": True}, "termination_grace_period_seconds"),
    Case("grace-fraction", {"termination_grace_period_seconds": 1.5}, "termination_grace_period_seconds"),
    Case("grace-on-v21", {"termination_grace_period_seconds": 30}, "termination_grace_period_seconds", api_version="v2.1"),
    Case("grace-accepted", {"termination_grace_period_seconds": 120}, check=lambda m: pod(m)["terminationGracePeriodSeconds"] == 120),
    Case("init-image", {"init_containers": [{"name": "fetch", "image": "busybox:1", "command": ["sh"]}]}, "init_containers[0]"),
    Case("init-no-name", {"init_containers": [{"env": [{"name": "A", "value": "1"}]}]}, "init_containers[0]"),
    Case("init-env-secret", {"init_containers": [{"name": "fetch", "env": [{"name": "HF_TOKEN", "value": HF}]}]},
         "init_containers[0].env[0].value"),  # fmt: skip
    Case("init-file-key-traversal",
         {"init_containers": [{"name": "fetch", "env": [{"name": "A", "valueFrom": {"fileKeyRef": {"volumeName": "cfg", "path": "../x",
                                                                                                   "key": "A"}}}]}]},
         "init_containers[0].env[0].valueFrom.fileKeyRef.path"),  # fmt: skip
    Case("init-mount-escape", {"init_containers": [{"name": "fetch", "volumeMounts": [{"name": "cfg", "mountPath": "/x/../etc"}]}]},
         "init_containers[0].volumeMounts[0].mountPath"),  # fmt: skip
    Case("init-privileged", {"init_containers": [{"name": "fetch", "securityContext": {"privileged": True}}]},
         "init_containers[0].securityContext.privileged"),  # fmt: skip
    Case("init-twice", {"init_containers": [{"name": "fetch", "env": []}, {"name": "fetch", "env": []}]}, "init_containers[1].name"),
    Case("init-security-on-v21", {"init_containers": [{"name": "fetch", "securityContext": {"runAsUser": 1}}]},
         "init_containers[0].securityContext", api_version="v2.1"),  # fmt: skip
    Case(
        "init-container-patch-with-an-env-file",
        {"init_containers": [{"name": "fetch", "securityContext": {"runAsUser": 1000},
                              "env": [{"name": "DATA_VERSION", "valueFrom": {"fileKeyRef": {"volumeName": "cfg", "path": "vars.env",
                                                                                             "key": "DATA_VERSION", "optional": True}}}],
                              "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]},
        check=lambda m: pod(m)["initContainers"][0]["env"][0]["valueFrom"]["fileKeyRef"]["key"] == "DATA_VERSION"
        and pod(m)["initContainers"][0]["volumeMounts"] == [{"name": "cfg", "mountPath": "/cfg"}],
    ),  # fmt: skip
    Case("env-file-key-on-the-trainer",
         {"env": [{"name": "A", "valueFrom": {"fileKeyRef": {"volumeName": "cfg", "path": "v.env", "key": "A"}}}]},
         "env[0].valueFrom.fileKeyRef"),  # fmt: skip
    Case("dataset-env-file-key", {"dataset_uri": "hf://org/d", "dataset_env": [{"name": "A", "valueFrom": {"fileKeyRef": {
         "volumeName": "cfg", "path": "v.env", "key": "A"}}}]}, "dataset_env[0].valueFrom.fileKeyRef"),  # fmt: skip
    # ------------------------------------------------------------------ lifecycle
    Case("deadline-zero", {"active_deadline_seconds": 0}, "active_deadline_seconds", layers=NO_COMPONENT),
    Case("deadline-negative", {"active_deadline_seconds": -5}, "active_deadline_seconds"),
    Case("deadline-boolean", {"active_deadline_seconds": True}, "active_deadline_seconds"),
    Case("deadline-over-64-bits", {"active_deadline_seconds": 2**64}, "active_deadline_seconds"),
    Case("deadline-on-v21", {"active_deadline_seconds": 60}, "active_deadline_seconds", api_version="v2.1"),
    Case("suspend-text", {"suspend": "yes"}, "suspend"),
    Case("managed-by-other", {"managed_by": "example.com/my-controller"}, "managed_by"),
    Case("managed-by-newline", {"managed_by": "kueue.x-k8s.io/multikueue\n"}, "managed_by"),
    Case("multikueue-without-queue", {"managed_by": "kueue.x-k8s.io/multikueue"}, "queue_name"),
    Case(
        "multikueue-with-queue",
        {"managed_by": "kueue.x-k8s.io/multikueue", "queue_name": "team-q"},
        check=lambda m: m["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue",
    ),
    Case("queue-newline", {"queue_name": "team-q\n"}, "queue_name"),
    Case("queue-space", {"queue_name": "team queue"}, "queue_name"),
    Case("priority-newline", {"queue_name": "team-q", "priority_class": "high\n"}, "priority_class"),
    Case("priority-label-injection", {"queue_name": "team-q", "priority_class": "high,team=x"}, "priority_class"),
    Case(
        "suspend-and-queue",
        {"suspend": True, "queue_name": "team-q", "active_deadline_seconds": 3600},
        check=lambda m: m["spec"]["suspend"] is True and m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-q",
    ),
]
