"""What MLflow tracking costs a trainer that logs every step, when the server is fast, slow, hung, or gone a while.

``python -m bench.tracking_overhead`` starts a real MLflow server (``mlflow server``, SQLite) and,
in front of it, a TCP proxy that adds a delay to each request or holds every request unanswered
(``tests/tcp_proxy.py``). It trains ``builtin://models/tiny-char-lm`` on
``builtin://datasets/addition`` with the project's SFT trainer (``python -m
kfp_trainer.trainers.sft``, one process, ``--logging-steps 1``: a metrics line per step, the
worst case for a tracker) into a run of its own, in these cases, ``--rounds`` times each, in
turn:

* ``off``: no tracking (the reference);
* ``mlflow``: the server as it is;
* ``200ms``: every request answered 200 ms late;
* ``hung 10s``: every request held for the first 10 s of the run, then answered;
* ``hung``: never answered (the trainer waits ``--flush`` seconds at its exit, then says what
  it could not deliver; the other cases keep the default wait, 30 s);
* ``sync 200ms`` (the peer): one request per line on the trainer's thread, as trainers log when
  they call a tracking client directly (and as ours did before), against the 200 ms server.

For each it prints the median training time (the trainer's own ``train_runtime``: its loop),
the process's wall time (its exit included), both as ratios to ``off``, and how many of the
per-step ``loss`` points the server has at the end. The goal: tracking costs at most 2% of the
training time against the slow and the hung server, and loses no point that the server could
take.

    .venv/bin/python -m bench.tracking_overhead [--steps 600] [--rounds 3] [--flush 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CASES = ("off", "mlflow", "200ms", "hung 10s", "hung", "sync 200ms")

# The peer: a trainer that calls the tracking client itself, one request per line, on its own thread.
SYNC_LOGGER = """
import runpy, sys
from kfp_trainer.tracking import trainer
from kfp_trainer.tracking.client import MlflowClient, metric


class SyncLogger(trainer.RunLogger):
    def __init__(self):
        super().__init__(at_exit=False)
        self.sender, self.client = None, MlflowClient(self._env[trainer.settings.TRACKING_URI], env=self._env, timeout=30.0, attempts=1)

    def log_params(self, params, *, trainer=""):
        self.client.log_batch(self.run_id, params={str(k): v for k, v in params.items() if v is not None})
        return True

    def log_record(self, record):
        step, numbers = trainer.metrics_of(record)
        self.client.log_batch(self.run_id, metrics=[metric(k, v, step=step or 0) for k, v in numbers.items()])
        return True


trainer._default = SyncLogger()
sys.argv = ["sft", *sys.argv[1:]]
runpy.run_module("kfp_trainer.trainers.sft", run_name="__main__", alter_sys=True)
"""


def train(case: str, args: argparse.Namespace, inputs: tuple[Path, Path], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One training process; its own training time, the wall time and its stderr's last lines."""
    model, data = inputs
    flags = ["--model-dir", str(model), "--dataset-dir", str(data), "--output-dir", str(out), "--max-steps", str(args.steps),
             "--logging-steps", "1", "--batch-size", "16", "--num-threads", "1", "--seed", "0"]  # fmt: skip
    argv = [sys.executable, *(["-c", SYNC_LOGGER] if case.startswith("sync") else ["-m", "kfp_trainer.trainers.sft"]), *flags]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, cwd=REPO)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{case}: the trainer failed:\n{done.stderr[-3000:]}")
    summary = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{") and "train_runtime" in line][-1]
    said = [line for line in done.stderr.splitlines() if "MLflow" in line]
    return {"train_s": summary["train_runtime"], "wall_s": wall, "said": said}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per training (a metrics line each)")
    parser.add_argument("--rounds", type=int, default=3, help="trainings per case (the median is shown)")
    parser.add_argument("--flush", type=float, default=5.0, help="KFP_TRAINER_MLFLOW_FLUSH_SECONDS of the 'hung' trainers")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from kfp_trainer.trainers.builtin import materialize
    from tests import mlflow_server
    from tests.tcp_proxy import TcpProxy

    rows: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory(prefix="tracking-overhead-") as tmp:
        root = Path(tmp)
        inputs = materialize("builtin://models/tiny-char-lm", root / "model"), materialize("builtin://datasets/addition", root / "data")
        server = mlflow_server.start(root / "mlflow")
        host, port = server.url.removeprefix("http://").split(":")
        client = server.client()
        experiment = client.experiment_id("tracking-overhead")
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KFP_TRAINER_"))}
        base_env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        try:
            for round_ in range(args.rounds):
                for case in CASES:
                    delay = 0.1 if "200ms" in case else 0.0  # each way: an answer 200 ms late
                    with TcpProxy(host, int(port), delay=delay) as proxy:
                        env = dict(base_env)
                        run_id = ""
                        if case != "off":
                            run_id = client.create_run(experiment, name=f"{case} #{round_}", tags={})["run_id"]
                            env |= {"MLFLOW_TRACKING_URI": server.url if case == "mlflow" else proxy.url, "MLFLOW_RUN_ID": run_id}
                        if case == "hung":
                            env["KFP_TRAINER_MLFLOW_FLUSH_SECONDS"] = str(args.flush)  # the others wait as long as the default (30 s)
                        if case.startswith("hung"):
                            proxy.hang()
                            if case == "hung 10s":
                                threading.Timer(10.0, proxy.answer).start()
                        row = train(case, args, inputs, root / f"out-{case}-{round_}".replace(" ", "_"), env)
                        proxy.answer()
                    row["points"] = len(server.metric_history(run_id, "loss")) if run_id else args.steps
                    rows[case].append(row)
                    print(json.dumps({"case": case, "round": round_, **row}), file=sys.stderr, flush=True)
        finally:
            server.stop()

    off_train = statistics.median(r["train_s"] for r in rows["off"])
    off_wall = statistics.median(r["wall_s"] for r in rows["off"])
    print(f"SFT trainer, tiny-char-lm, {args.steps} steps, a metrics line per step, 1 thread; median of {args.rounds} "
          f"('hung' waits {args.flush:g} s at the exit)")  # fmt: skip
    print(f"{'case':<12}{'training s':>11}{'x off':>8}{'wall s':>9}{'x off':>8}{'loss points':>13}")
    for case in CASES:
        train_s = statistics.median(r["train_s"] for r in rows[case])
        wall_s = statistics.median(r["wall_s"] for r in rows[case])
        points = min(r["points"] for r in rows[case])
        print(f"{case:<12}{train_s:>11.2f}{train_s / off_train:>8.3f}{wall_s:>9.2f}{wall_s / off_wall:>8.3f}{points:>8}/{args.steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
