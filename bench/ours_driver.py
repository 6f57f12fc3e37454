"""Many of our launchers in one process, one thread each (the concurrency rounds of the bench).

Each thread runs what ``kfp-trainer launch`` runs -- a :class:`~kfp_trainer.launcher.Launcher`
on a :class:`~kfp_trainer.backends.kubernetes.KubernetesBackend` of its own, from the
identity's kubeconfig -- so the requests each job costs are those of one launcher process;
only the memory of hundreds of interpreters is saved.

    python -m bench.ours_driver SPEC_JSON

The spec: ``{"namespace", "logs", "annotations", "kubeconfigs": {identity: path}}``. Prints
``BENCH done <identity> <name> <unix time> <phase>`` per thread (``BENCH failed ...``).
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


class _Discard:
    """A launcher's stdout that keeps nothing (its lines are not what is measured here)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from kfp_trainer.backends.kubernetes import KubernetesBackend
    from kfp_trainer.launcher import Launcher, LaunchOptions
    from kfp_trainer.prepare import prepare
    from kfp_trainer.spec import TrainJobInputs

    with open(argv[1]) as f:
        spec = json.load(f)

    def one(identity: str, kubeconfig: str) -> None:
        try:
            backend = KubernetesBackend.from_config(kubeconfig, namespace=spec["namespace"])
            inputs = TrainJobInputs(
                runtime="torch-distributed",
                image="python:3.11",
                run_id=f"bench-{identity}",
                task_name="train",
                namespace=spec["namespace"],
                pod_annotations=spec["annotations"],
            )
            outcome = Launcher(backend, LaunchOptions(logs=spec["logs"]), out=_Discard()).run(prepare(backend, inputs))
            emit(f"BENCH done {identity} {outcome.ref.name} {time.time():.6f} {outcome.phase.value}")
        except Exception as e:  # reported, counted as a failed launch
            emit(f"BENCH failed {identity} {type(e).__name__}: {str(e)[:200]!r}")

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in spec["kubeconfigs"].items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
