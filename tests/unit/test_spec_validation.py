"""Validation: each bad input is rejected before any API call, with a message naming the
field, the value and what is allowed."""

from __future__ import annotations

import pytest

from kfp_trainer import build_trainjob
from kfp_trainer.errors import InvalidSpecErrors, UserError
from kfp_trainer.spec import TrainJobInputs, validate

OK = {"run_id": "run-1", "task_name": "train"}
PVC = {"name": "ws", "persistentVolumeClaim": {"claimName": "c"}}

# (inputs, api_version, field named in the message, text the message must contain)
BAD = [
    ({"runtime": ""}, "v2.2", "runtime", "the name of a ClusterTrainingRuntime"),
    ({"runtime": "Torch_Distributed"}, "v2.2", "runtime", "lower-case DNS subdomain"),
    ({"runtime_kind": "Runtime"}, "v2.2", "runtime_kind", "ClusterTrainingRuntime or TrainingRuntime"),
    ({"namespace": "Team A"}, "v2.2", "namespace", "RFC-1123 label"),
    ({"namespace": "a" * 64}, "v2.2", "namespace", "<= 63 characters"),
    ({"image": "my image:1"}, "v2.2", "image", "without spaces"),
    ({"num_nodes": 0}, "v2.2", "num_nodes", "from 1 to 1024"),
    ({"num_nodes": -3}, "v2.2", "num_nodes", "from 1 to 1024"),
    ({"num_nodes": 5000}, "v2.2", "num_nodes", "from 1 to 1024"),
    ({"num_proc_per_node": 0}, "v2.2", "num_proc_per_node", "an integer >= 1"),
    ({"num_proc_per_node": "auto"}, "v2.2", "num_proc_per_node", "integers only"),
    ({"num_proc_per_node": "many"}, "v2.1", "num_proc_per_node", "auto, cpu, gpu"),
    ({"resources_per_node": {"limits": {"cpu": "2 cores"}}}, "v2.2", "resources_per_node.limits['cpu']", "Kubernetes quantity"),
    ({"resources_per_node": {"limits": {"memory": "-1Gi"}}}, "v2.2", "resources_per_node.limits['memory']", "quantity >= 0"),
    (
        {"resources_per_node": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}},
        "v2.2",
        "resources_per_node.requests['cpu']",
        "at most the limit",
    ),
    ({"resources_per_node": {"limit": {"cpu": "2"}}}, "v2.2", "resources_per_node", "limits and/or requests"),
    ({"env": {"PET_NNODES": "2"}}, "v2.2", "env[0].name", "not starting with PET_"),
    ({"env": {"DMLC_ROLE": "worker"}}, "v2.2", "env[0].name", "DMLC_"),
    ({"env": {"OMPI_MCA_x": "1"}}, "v2.2", "env[0].name", "OMPI_MCA_"),
    ({"env": {"1BAD": "x"}}, "v2.2", "env[0].name", "not starting with a digit"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "v2.2", "env[1].name", "each env var name once"),
    ({"env": {"HF_TOKEN": "hf_abc"}}, "v2.2", "env[0].value", "kfp.kubernetes.use_secret_as_env(task"),
    ({"env": [{"name": "A", "valueFrom": {"secretRef": {}}}]}, "v2.2", "env[0].valueFrom", "secretKeyRef"),
    ({"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, "v2.2", "env[0]", "not both"),
    ({"env": [{"name": "A", "vaule": "1"}]}, "v2.2", "env[0]", "name, value or valueFrom"),
    ({"dataset_uri": "ftp://host/data"}, "v2.2", "dataset_uri", "hf://, s3://, cache://"),
    ({"dataset_uri": "tatsu-lab/alpaca"}, "v2.2", "dataset_uri", "hf://"),
    ({"model_uri": "cache://x"}, "v2.2", "model_uri", "hf://, s3://"),
    ({"dataset_secret": "HF_Token"}, "v2.2", "dataset_secret", "Secret name"),
    ({"model_secret": "s3-creds"}, "v2.2", "model_uri", "a URI when model_secret"),
    ({"dataset_env": {"ACCESS_TOKEN": "abc"}, "dataset_uri": "hf://a/b"}, "v2.2", "dataset_env[0].value", "in dataset_secret"),
    ({"labels": {"bad key!": "v"}}, "v2.2", "labels['bad key!']", "[prefix/]name"),
    ({"labels": {"team": "x" * 64}}, "v2.2", "labels['team']", "label value"),
    ({"pod_labels": {"UPPER.example.com/a": "b"}}, "v2.2", "pod_labels['UPPER.example.com/a']", "prefix a DNS subdomain"),
    ({"annotations": {"-start": "v"}}, "v2.2", "annotations['-start']", "starting and ending alphanumeric"),
    ({"node_selector": {"gpu": "a100 80gb"}}, "v2.2", "node_selector['gpu']", "label value"),
    ({"tolerations": [{"key": "k", "operator": "In"}]}, "v2.2", "tolerations[0].operator", "Exists or Equal"),
    ({"tolerations": [{"key": "k", "effect": "NoRun"}]}, "v2.2", "tolerations[0].effect", "NoSchedule"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "v2.2", "tolerations[0].value", "no value with operator Exists"),
    ({"affinity": {"nodeAfinity": {}}}, "v2.2", "affinity", "nodeAffinity"),
    ({"volumes": [{"persistentVolumeClaim": {"claimName": "c"}}]}, "v2.2", "volumes[0].name", "DNS label"),
    ({"volumes": [{"name": "ws"}]}, "v2.2", "volumes[0]", "with a source"),
    ({"volumes": [PVC], "volume_mounts": [{"name": "data", "mountPath": "/data"}]}, "v2.2", "volume_mounts[0].name", "a volume in volumes"),
    ({"volumes": [PVC], "volume_mounts": [{"name": "ws", "mountPath": "data"}]}, "v2.2", "volume_mounts[0].mountPath", "absolute path"),
    ({"service_account": "Pipeline Runner"}, "v2.2", "service_account", "service account name"),
    ({"image_pull_secrets": ["Reg_Cred"]}, "v2.2", "image_pull_secrets[0]", "Secret name"),
    ({"pod_targets": ["worker"]}, "v2.2", "pod_targets[0]", "dataset-initializer"),
    ({"active_deadline_seconds": 0}, "v2.2", "active_deadline_seconds", ">= 1"),
    ({"active_deadline_seconds": 60}, "v2.1", "active_deadline_seconds", "no activeDeadlineSeconds"),
    ({"queue_name": "team queue"}, "v2.2", "queue_name", "label value"),
    ({"priority_class": "High"}, "v2.2", "priority_class", "Kueue WorkloadPriorityClass"),
    ({"priority_class": "p" * 64}, "v2.2", "priority_class", "<= 63 characters"),
    ({"name_prefix": "Train"}, "v2.2", "name_prefix", "RFC 1035"),
    ({"name_prefix": "a-very-long-prefix-for-a-train-job"}, "v2.2", "name_prefix", "at most 22 characters"),
    ({"name": "x" * 64}, "v2.2", "name", "at most 63 characters"),
    ({"name": "9lives"}, "v2.2", "name", "RFC-1035"),
    ({"run_id": ""}, "v2.2", "run_id", "the KFP run id"),
]


@pytest.mark.parametrize(("inputs", "api_version", "field", "text"), BAD, ids=[f"{i:02d}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_named_with_value_and_what_is_allowed(inputs, api_version, field, text):
    with pytest.raises(InvalidSpecErrors) as info:
        build_trainjob(api_version=api_version, **{**OK, **inputs})
    messages = [str(e) for e in info.value.errors]
    assert any(m.startswith(f"{field}: got ") and text in m for m in messages), messages


# A valid value of each input the BAD table rejects (with the inputs it needs): a rule that
# refused every value would still pass the table, but not this.
GOOD = {
    "runtime": ("torch-distributed-2", {}),
    "runtime_kind": ("TrainingRuntime", {}),
    "namespace": ("team-a", {}),
    "image": ("ghcr.io/example/trainer:1.0", {}),
    "num_nodes": (1024, {}),
    "num_proc_per_node": (8, {}),
    "resources_per_node": ({"requests": {"cpu": "2"}, "limits": {"cpu": "4", "memory": "16Gi"}}, {}),
    "env": ([{"name": "EPOCHS", "value": "3"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}], {}),
    "dataset_uri": ("hf://tatsu-lab/alpaca", {}),
    "model_uri": ("s3://models/qwen", {}),
    "dataset_secret": ("hf-token", {"dataset_uri": "hf://a/b"}),
    "model_secret": ("s3-creds", {"model_uri": "s3://b/m"}),
    "dataset_env": ({"REGION": "eu"}, {"dataset_uri": "hf://a/b"}),
    "labels": ({"team": "nlp"}, {}),
    "pod_labels": ({"example.com/a": "b"}, {}),
    "annotations": ({"example.com/note": "free text"}, {}),
    "node_selector": ({"gpu": "a100-80gb"}, {}),
    "tolerations": ([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}], {}),
    "affinity": ({"nodeAffinity": {}}, {}),
    "volumes": ([PVC], {}),
    "volume_mounts": ([{"name": "ws", "mountPath": "/data"}], {"volumes": [PVC]}),
    "service_account": ("pipeline-runner", {}),
    "image_pull_secrets": (["regcred"], {}),
    "pod_targets": (["dataset-initializer"], {}),
    "active_deadline_seconds": (60, {}),
    "queue_name": ("team-queue", {}),
    "priority_class": ("team-a.high", {"queue_name": "q"}),
    "name_prefix": ("train", {}),
    "name": ("my-job", {}),
    "run_id": ("run-2", {}),
}


def test_every_input_the_table_rejects_accepts_a_valid_value():
    rejected_inputs = {key for inputs, *_ in BAD for key in inputs}
    assert rejected_inputs - set(GOOD) == set(), "add a valid value for each input BAD covers"
    for key in sorted(rejected_inputs):
        value, needs = GOOD[key]
        manifest = build_trainjob(**{**OK, **needs, key: value})
        assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1", key


def test_all_problems_are_reported_at_once():
    with pytest.raises(InvalidSpecErrors) as info:
        build_trainjob(**OK, num_nodes=0, runtime="X", env={"PET_A": "1"})
    assert [e.field for e in info.value.errors] == ["runtime", "num_nodes", "env[0].name"]
    assert str(info.value).startswith("3 invalid input(s):")


def test_secret_values_never_appear_in_errors():
    with pytest.raises(InvalidSpecErrors) as info:
        build_trainjob(**OK, env={"WANDB_API_KEY": "super-secret-value"})
    assert "super-secret-value" not in str(info.value)


def test_type_errors_and_unknown_inputs_are_validation_errors():
    with pytest.raises(InvalidSpecErrors, match="num_nodes: got 'two'"):
        TrainJobInputs.parse(num_nodes="two")
    with pytest.raises(InvalidSpecErrors, match="nodes: got 2; expected one of the known inputs"):
        TrainJobInputs.parse(nodes=2)


def test_patch_cannot_smuggle_reserved_env_or_node_env():
    with pytest.raises(InvalidSpecErrors, match="patch.spec.trainer.env"):
        build_trainjob(**OK, patch={"spec": {"trainer": {"env": [{"name": "PET_NNODES", "value": "9"}]}}})
    node_env = {
        "spec": {
            "runtimePatches": [
                {
                    "manager": "x",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "spec": {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]}
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ]
        }
    }
    with pytest.raises(InvalidSpecErrors, match="no env patch on the node"):
        build_trainjob(**OK, patch=node_env)
    with pytest.raises(InvalidSpecErrors, match="patch.metadata.name"):
        build_trainjob(**OK, patch={"metadata": {"name": "Bad_Name"}})


@pytest.mark.parametrize("container", ["node", "dataset-initializer", "model-initializer"])
def test_a_v21_env_override_of_a_trainer_owned_container_is_refused_like_the_webhook_does(container):
    # Trainer v2.1's webhook: "must not have envs for the dataset-initializer, model-initializer, node containers".
    override = {"targetJobs": [{"name": container}], "spec": {"containers": [{"name": container, "env": [{"name": "A", "value": "1"}]}]}}
    with pytest.raises(InvalidSpecErrors, match=r"patch\.spec\.podTemplateOverrides\[0\]\.spec\.containers\[0\]\.env.*no env override"):
        build_trainjob(**OK, api_version="v2.1", patch={"spec": {"podTemplateOverrides": [override]}})
    sidecar = {"targetJobs": [{"name": "node"}], "spec": {"containers": [{"name": "sidecar", "env": [{"name": "A", "value": "1"}]}]}}
    assert build_trainjob(**OK, api_version="v2.1", patch={"spec": {"podTemplateOverrides": [sidecar]}})["spec"]["podTemplateOverrides"]


def test_errors_are_user_errors_and_value_errors():
    with pytest.raises(UserError):
        validate(TrainJobInputs(num_nodes=0, run_id="r"))
    with pytest.raises(ValueError):
        validate(TrainJobInputs(num_nodes=0, run_id="r"))


def test_version_agnostic_validation_defers_version_checks():
    validate(TrainJobInputs(run_id="r", num_proc_per_node="auto", active_deadline_seconds=5), api_version=None)
