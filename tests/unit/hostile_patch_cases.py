"""Hostile patches: the launcher's own fields, values the inputs would refuse, host access, and what a patch may do."""

from __future__ import annotations

from hostile_common import AWS_ID, BIG, HF, PLAIN, Case, deep, patch_node, pod, sidecar, trainer

PATCH_CASES: list[Case] = [
    # ------------------------------------------------------------------ the patch: launcher-owned fields
    Case("patch-namespace", {"patch": {"metadata": {"namespace": "kube-system"}}}, "patch.metadata.namespace"),
    Case("patch-name", {"patch": {"metadata": {"name": "someone-elses-job"}}}, "patch.metadata.name"),
    Case("patch-run-label", {"patch": {"metadata": {"labels": {"kfp-trainer.kubeflow.org/run-id": "x"}}}}, "patch.metadata.labels"),
    Case(
        "patch-digest-label-deleted",
        {"patch": {"metadata": {"labels": {"kfp-trainer.kubeflow.org/inputs-digest": None}}}},
        "patch.metadata.labels",
    ),
    Case("patch-managed-by-label", {"patch": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}}, "patch.metadata.labels"),
    Case("patch-new-lineage-label", {"patch": {"metadata": {"labels": {"kfp-trainer.kubeflow.org/owner": "me"}}}}, "patch.metadata.labels"),
    Case(
        "patch-task-annotation",
        {"patch": {"metadata": {"annotations": {"kfp-trainer.kubeflow.org/task": "x"}}}},
        "patch.metadata.annotations",
    ),
    Case("patch-finalizers", {"patch": {"metadata": {"finalizers": ["example.com/never"]}}}, "patch.metadata.finalizers"),
    Case(
        "patch-owner-references",
        {"patch": {"metadata": {"ownerReferences": [{"kind": "Pod", "name": "x", "uid": "1", "apiVersion": "v1"}]}}},
        "patch.metadata.ownerReferences",
    ),
    Case("patch-generate-name", {"patch": {"metadata": {"generateName": "x-"}}}, "patch.metadata.generateName"),
    Case("patch-runtime-ref", {"patch": {"spec": {"runtimeRef": {"name": "privileged-runtime"}}}}, "patch.spec.runtimeRef"),
    Case("patch-managed-by-multikueue", {"patch": {"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}}, "patch.spec.managedBy"),
    Case("patch-api-version", {"patch": {"apiVersion": "v1", "kind": "Pod"}}, "patch.apiVersion"),
    Case("patch-status", {"patch": {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}}, "patch.status"),
    Case("patch-unknown-spec-field", {"patch": {"spec": {"podSpecOverrides": []}}}, "patch.spec.podSpecOverrides"),
    Case(
        "patch-v21-overrides-on-v22",
        {"patch": {"spec": {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}]}]}}},
        "patch.spec.podTemplateOverrides",
    ),
    # ------------------------------------------------------------------ the patch: values
    Case("patch-num-nodes-million", {"patch": {"spec": {"trainer": {"numNodes": 1_000_000}}}}, "patch.spec.trainer.numNodes"),
    Case("patch-num-nodes-boolean", {"patch": {"spec": {"trainer": {"numNodes": True}}}}, "patch.spec.trainer.numNodes"),
    Case("patch-num-nodes-text", {"patch": {"spec": {"trainer": {"numNodes": "3"}}}}, "patch.spec.trainer.numNodes"),
    Case("patch-procs-zero", {"patch": {"spec": {"trainer": {"numProcPerNode": 0}}}}, "patch.spec.trainer.numProcPerNode"),
    Case("patch-deadline-zero", {"patch": {"spec": {"activeDeadlineSeconds": 0}}}, "patch.spec.activeDeadlineSeconds"),
    Case("patch-suspend-text", {"patch": {"spec": {"suspend": "yes"}}}, "patch.spec.suspend"),
    Case("patch-image-newline", {"patch": {"spec": {"trainer": {"image": "evil:1\n"}}}}, "patch.spec.trainer.image"),
    Case(
        "patch-env-hf-token",
        {"patch": {"spec": {"trainer": {"env": [{"name": "HF_TOKEN", "value": HF}]}}}},
        "patch.spec.trainer.env[0].value",
    ),
    Case(
        "patch-env-reserved",
        {"patch": {"spec": {"trainer": {"env": [{"name": "PET_NNODES", "value": "9"}]}}}},
        "patch.spec.trainer.env[0].name",
    ),
    Case("patch-args-secret", {"patch": {"spec": {"trainer": {"args": ["--token", PLAIN]}}}}, "patch.spec.trainer.args[1]"),
    Case(
        "patch-initializer-env-secret",
        {"dataset_uri": "hf://org/d", "patch": {"spec": {"initializer": {"dataset": {"env": [{"name": "ACCESS_TOKEN", "value": HF}]}}}}},
        "patch.spec.initializer.dataset.env[0].value",
    ),
    Case(
        "patch-initializer-uri-traversal",
        {"dataset_uri": "hf://org/d", "patch": {"spec": {"initializer": {"dataset": {"storageUri": "s3://b/../../etc"}}}}},
        "patch.spec.initializer.dataset.storageUri",
    ),
    Case("patch-sidecar-env-secret", {"patch": sidecar(env=[{"name": "DB_PASSWORD", "value": PLAIN}])}, "patch.spec.runtimePatches"),
    Case("patch-sidecar-args-token", {"patch": sidecar(args=["--key", AWS_ID])}, "patch.spec.runtimePatches"),
    Case(
        "patch-node-container-env",
        {"patch": patch_node({}, containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])},
        "patch.spec.runtimePatches",
    ),
    Case("patch-nan", {"patch": {"spec": {"trainer": {"numNodes": float("nan")}}}}, "patch.spec.trainer.numNodes"),
    Case("patch-infinity-deep", {"patch": {"metadata": {"labels": {"a": float("inf")}}}}, "patch.metadata.labels"),
    Case("patch-int-over-64-bits", {"patch": {"spec": {"activeDeadlineSeconds": 2**70}}}, "patch.spec.activeDeadlineSeconds"),
    Case("patch-nested-too-deep", {"patch": {"spec": {"trainer": deep(100)}}}, "patch"),
    Case("patch-control-in-key", {"patch": {"metadata": {"labels": {"a\x00": "b"}}}}, "patch.metadata.labels"),
    Case(
        "patch-value-over-128-kib", {"patch": {"metadata": {"annotations": {"example.com/big": "x" * BIG}}}}, "patch.metadata.annotations"
    ),
    Case("patch-job-over-512-kib", {"patch": {"spec": {"trainer": {"args": ["a" * 100_000] * 6}}}}, "patch.spec.trainer.args"),
    Case("patch-not-a-map", {"patch": ["spec"]}, "patch"),
    # ------------------------------------------------------------------ the patch: host access
    Case("patch-host-path", {"patch": patch_node({}, volumes=[{"name": "root", "hostPath": {"path": "/"}}])}, "patch.spec.runtimePatches"),
    Case("patch-privileged", {"patch": sidecar("node", securityContext={"privileged": True})}, "patch.spec.runtimePatches"),
    Case("patch-privilege-escalation", {"patch": sidecar(securityContext={"allowPrivilegeEscalation": True})}, "patch.spec.runtimePatches"),
    Case("patch-capabilities", {"patch": sidecar(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})}, "patch.spec.runtimePatches"),
    Case("patch-host-network", {"patch": patch_node({}, hostNetwork=True)}, "patch.spec.runtimePatches"),
    Case("patch-host-pid", {"patch": patch_node({}, hostPID=True)}, "patch.spec.runtimePatches"),
    Case("patch-host-ipc", {"patch": patch_node({}, hostIPC=True)}, "patch.spec.runtimePatches"),
    Case("patch-host-port", {"patch": sidecar(ports=[{"containerPort": 80, "hostPort": 80}])}, "patch.spec.runtimePatches"),
    Case("patch-unmasked-proc", {"patch": sidecar("node", securityContext={"procMount": "Unmasked"})}, "patch.spec.runtimePatches"),
    Case(
        "patch-seccomp-unconfined",
        {"patch": sidecar(securityContext={"seccompProfile": {"type": "Unconfined"}})},
        "patch.spec.runtimePatches",
    ),
    Case(
        "patch-init-container-privileged",
        {"patch": patch_node({}, initContainers=[{"name": "init", "securityContext": {"privileged": True}}])},
        "patch.spec.runtimePatches",
    ),
    Case(
        "patch-privileged-allowed-by-admin",
        {"patch": sidecar("node", securityContext={"privileged": True})},
        check=lambda m: pod(m)["containers"][0] == {"name": "node", "securityContext": {"privileged": True}},
        allow_host_access=True,
    ),
    Case(
        "patch-host-path-allowed-by-admin",
        {"patch": patch_node({}, volumes=[{"name": "dev", "hostPath": {"path": "/dev/shm"}}])},
        check=lambda m: pod(m)["volumes"] == [{"name": "dev", "hostPath": {"path": "/dev/shm"}}],
        allow_host_access=True,
    ),
    # ------------------------------------------------------------------ the patch: accepted
    Case(
        "patch-more-nodes-and-suspend",
        {"num_nodes": 2, "patch": {"spec": {"trainer": {"numNodes": 3}, "suspend": True}}},
        check=lambda m: trainer(m)["numNodes"] == 3 and m["spec"]["suspend"] is True,
    ),
    Case(
        "patch-default-managed-by",
        {"patch": {"spec": {"managedBy": "trainer.kubeflow.org/trainjob-controller"}}},
        check=lambda m: m["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller",
    ),
    Case(
        "patch-own-labels-and-annotations",
        {"patch": {"metadata": {"labels": {"team": "nlp"}, "annotations": {"example.com/ticket": "ML-1"}}}},
        check=lambda m: (
            m["metadata"]["labels"]["team"] == "nlp"
            and m["metadata"]["labels"]["kfp-trainer.kubeflow.org/run-id"] == "run-1"
            and m["metadata"]["annotations"]["example.com/ticket"] == "ML-1"
        ),
    ),
    Case(
        "patch-sidecar-by-reference",
        {"patch": sidecar(env=[{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}])},
        check=lambda m: pod(m)["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "pw"},
    ),
    Case(
        "patch-removes-runtime-patches",
        {"patch": {"spec": {"runtimePatches": None}}},
        check=lambda m: "runtimePatches" not in m["spec"] and m["metadata"]["labels"]["kfp-trainer.kubeflow.org/task"] == "train",
    ),
    Case(
        "patch-v21-overrides",
        {"patch": {"spec": {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"a": "b"}}}]}}},
        check=lambda m: m["spec"]["podTemplateOverrides"][0]["spec"] == {"nodeSelector": {"a": "b"}},
        api_version="v2.1",
    ),
]
