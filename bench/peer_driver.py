"""The peer's side of the bench: the kubeflow SDK (0.5.0) used as its documentation shows.

Runs with the peer SDK's own Python (``hack/sdk/peer_sdk.py``); standard library and the SDK only.

    python peer_driver.py launch KUBECONFIG NAMESPACE LOGS ANNOTATIONS_JSON
        TrainerClient.train() of a container trainer on torch-distributed with the annotations on
        the trainer pods; then, LOGS=none: wait_for_job_status(); LOGS=0: wait for Running (or
        Complete), print get_job_logs(follow=True), then wait_for_job_status(). Prints
        ``BENCH created <name>`` and, when the wait returned, ``BENCH done <name> <status>``.
    python peer_driver.py relay KUBECONFIG NAMESPACE JOB
        Prints get_job_logs(JOB, follow=True), then ``BENCH done``.
    python peer_driver.py many SPEC_JSON
        One thread per identity of the spec (``{"namespace", "logs", "annotations", "kubeconfigs":
        {identity: path}}``), each doing what ``launch`` does; prints
        ``BENCH done <identity> <name> <unix time> <status>`` per thread (``BENCH failed ...``).
"""

from __future__ import annotations

import json
import sys
import threading
import time

_LOCK = threading.Lock()


def emit(text: str) -> None:
    with _LOCK:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def client_for(kubeconfig: str, namespace: str, *, shared_config: bool):
    from kubeflow.trainer import KubernetesBackendConfig, TrainerClient

    if shared_config:  # what a user writes
        return TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig))
    from kubernetes import client, config

    configuration = client.Configuration()  # one per thread: load_kube_config's default is process-wide
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return TrainerClient(KubernetesBackendConfig(namespace=namespace, client_configuration=configuration))


def patch_option(annotations: dict):
    from kubeflow.trainer.options.kubernetes import (
        JobSetSpecPatch,
        JobSetTemplatePatch,
        JobSpecPatch,
        JobTemplatePatch,
        PodTemplatePatch,
        ReplicatedJobPatch,
        RuntimePatch,
        TrainingRuntimeSpecPatch,
    )

    pod = PodTemplatePatch(metadata={"annotations": annotations})
    job = ReplicatedJobPatch(name="node", template=JobTemplatePatch(spec=JobSpecPatch(template=pod)))
    jobset = JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[job]))
    return RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(template=jobset))


def run_job(trainer_client, logs: str, annotations: dict, on_created=None, out=None) -> tuple[str, str]:
    from kubeflow.trainer import CustomTrainerContainer

    name = trainer_client.train(
        runtime="torch-distributed",
        trainer=CustomTrainerContainer(image="python:3.11", num_nodes=1),
        options=[patch_option(annotations)],
    )
    if on_created:
        on_created(name)
    if logs != "none":
        trainer_client.wait_for_job_status(name, status={"Running", "Complete"}, timeout=3600)
        for line in trainer_client.get_job_logs(name, follow=True):
            if out is not None:
                out(line)
    job = trainer_client.wait_for_job_status(name, timeout=3600)
    return name, str(job.status)


def cmd_launch(kubeconfig: str, namespace: str, logs: str, annotations: str) -> int:
    trainer_client = client_for(kubeconfig, namespace, shared_config=True)
    name, status = run_job(trainer_client, logs, json.loads(annotations), on_created=lambda n: emit(f"BENCH created {n}"), out=print)
    emit(f"BENCH done {name} {status}")
    return 0


def cmd_relay(kubeconfig: str, namespace: str, job: str) -> int:
    trainer_client = client_for(kubeconfig, namespace, shared_config=True)
    for line in trainer_client.get_job_logs(job, follow=True):
        print(line)
    emit("BENCH done")
    return 0


def cmd_many(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)

    def one(identity: str, kubeconfig: str) -> None:
        try:
            trainer_client = client_for(kubeconfig, spec["namespace"], shared_config=False)
            name, status = run_job(trainer_client, spec["logs"], spec["annotations"])
            emit(f"BENCH done {identity} {name} {time.time():.6f} {status}")
        except Exception as e:  # reported, counted as a failed launch
            emit(f"BENCH failed {identity} {type(e).__name__}: {str(e)[:200]!r}")

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in spec["kubeconfigs"].items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


def main(argv: list[str]) -> int:
    commands = {"launch": (cmd_launch, 4), "relay": (cmd_relay, 3), "many": (cmd_many, 1)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    fn, _ = commands[argv[1]]
    return fn(*argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
