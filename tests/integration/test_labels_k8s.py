"""The ``labels`` input labels the TrainJob the API server stores: ``kubectl get trainjobs -l team=a`` finds it.

They used to reach only the JobSet (through ``runtimePatches`` or v2.1's ``spec.labels``), so a
label selector on TrainJobs found nothing. Run against each Trainer release by
``test_trainer_versions`` too (the test is marked ``trainer_versions``).
"""

from __future__ import annotations

import pytest
from kubernetes import client
from test_launcher_k8s import inputs, launch

from kfp_trainer import spec

pytestmark = pytest.mark.timeout(180)


@pytest.mark.trainer_versions
def test_a_label_selector_finds_the_trainjob_the_launcher_created(kube_client, api_client, namespace):
    outcome, _ = launch(kube_client, inputs(namespace, labels={"team": "a", "example.com/cost-center": "ml"}))
    assert outcome.succeeded
    trainjobs = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, label_selector="team=a,example.com/cost-center=ml"
    )["items"]
    assert [job["metadata"]["name"] for job in trainjobs] == [outcome.ref.name]
    others = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, label_selector="team=b"
    )["items"]
    assert others == []
    jobsets = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", label_selector="team=a"
    )["items"]
    assert [j["metadata"]["name"] for j in jobsets] == [outcome.ref.name]  # the JobSet keeps them too
