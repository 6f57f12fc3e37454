"""The bench's results as one table: each figure, the peer's, how they compare, the goal, whether it is met.

:func:`rows` reads ``results.json``'s measurements; :func:`markdown` writes ``results.md``.

Example:
    >>> compare(2.0, 8.0, lower=True), compare(300.0, 100.0, lower=False), compare(0, 5, lower=True)
    ('4.0× fewer', '3.0× more', '0 vs 5')
"""

from __future__ import annotations

from typing import Any


def compare(ours: float | None, peer: float | None, *, lower: bool) -> str:
    """How ours compares with the peer, in words a reader takes in at once."""
    if ours is None or peer is None:
        return "n/a"
    if ours == 0 or peer == 0:
        return f"{_num(ours)} vs {_num(peer)}"
    if lower:
        return f"{peer / ours:.1f}× fewer" if ours <= peer else f"{ours / peer:.1f}× more (worse)"
    return f"{ours / peer:.1f}× more" if ours >= peer else f"{peer / ours:.1f}× less (worse)"


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if unit == "s":
        return f"{x:.3f} s"
    if abs(x) >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.1f}" if x != int(x) else f"{int(x)}"


def _row(figure: str, ours: str, peer: str, vs: str, goal: str, met: bool | None) -> dict[str, Any]:
    return {"figure": figure, "ours": ours, "peer": peer, "vs": vs, "goal": goal, "met": met}


def _lat(g: dict[str, Any]) -> str:
    s = g["completion_to_return_s"]
    return f"{_num(s['median'], 's')} ({_num(s['p95'], 's')})"


def rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's rows from the measurements in ``r`` (what run.py writes to results.json)."""
    out: list[dict[str, Any]] = []
    long, seq = r.get("long") or {}, r.get("sequential") or {}
    for logs, label in (("logs", "logs on"), ("none", "logs none")):
        o, p = long.get(f"ours-{logs}"), long.get(f"sdk-{logs}")
        if o and p:
            a, b = o["per_minute_after_start"], p["per_minute_after_start"]
            out.append(_row(f"requests per job-minute while waiting, after start ({label}; {o['after_start_window_s']:.0f} s window)",
                            _num(a), _num(b), compare(a, b, lower=True), "≤ 1", a is not None and a <= 1))  # fmt: skip
            a, b = o["per_minute"], p["per_minute"]
            out.append(_row(f"requests per job-minute, whole wait ({label}; {o['wait_s']:.0f} s job)", _num(a), _num(b),
                            compare(a, b, lower=True), "fewer than the SDK", a is not None and b is not None and a < b))  # fmt: skip
    for logs, label in (("logs", "logs on"), ("none", "logs none")):
        o, p = seq.get(f"ours-{logs}"), seq.get(f"sdk-{logs}")
        if o and p:
            a, b = o["requests_per_job"]["median"], p["requests_per_job"]["median"]
            out.append(_row(f"requests per whole job, short job ({label}; median of {o['launches']})", _num(a), _num(b),
                            compare(a, b, lower=True), "≤ 8", a is not None and a <= 8))  # fmt: skip
            o95, p95 = o["completion_to_return_s"]["p95"], p["completion_to_return_s"]["p95"]
            out.append(_row(f"completion → launcher returns, median (p95), {label}", _lat(o), _lat(p),
                            compare(o95, p95, lower=True) + " (p95)", "p95 ≤ 0.05 s", o95 is not None and o95 <= 0.05))  # fmt: skip
    spawned = seq.get("spawn_to_created", {})
    pod, o, p = spawned.get("ours-pod"), spawned.get("ours"), spawned.get("sdk")
    if pod and pod.get("n") and p:
        out.append(_row(f"process spawn → TrainJob created in a pod (the service account, as in a KFP step), median (p95) of {pod['n']}",
                        f"{_num(pod['median'], 's')} ({_num(pod['p95'], 's')})", f"{_num(p['median'], 's')} ({_num(p['p95'], 's')})",
                        compare(pod["median"], p["median"], lower=True), "≤ 0.3 s",
                        pod["median"] is not None and pod["median"] <= 0.3))  # fmt: skip
    if o and p:
        out.append(_row(f"process spawn → TrainJob created with a kubeconfig, median (p95) of {o['n']}",
                        f"{_num(o['median'], 's')} ({_num(o['p95'], 's')})", f"{_num(p['median'], 's')} ({_num(p['p95'], 's')})",
                        compare(o["median"], p["median"], lower=True), "below the SDK's",
                        o["median"] is not None and p["median"] is not None and o["median"] < p["median"]))  # fmt: skip
    for logs, label in (("logs", "logs on"), ("none", "logs none")):
        o, p = seq.get(f"ours-{logs}"), seq.get(f"sdk-{logs}")
        if o and p and o.get("launcher_cpu_s", {}).get("median") is not None:
            a, b = o["launcher_cpu_s"]["median"], p["launcher_cpu_s"]["median"]
            out.append(_row(f"launcher process CPU-seconds per short job, spawn to exit ({label}; median)", _num(a, "s"), _num(b, "s"),
                            compare(a, b, lower=True), "below the SDK's", a < b))  # fmt: skip
    imports = r.get("imports") or {}
    sdk = (imports.get("sdk") or {}).get("median_s")
    kfp = (imports.get("kfp") or {}).get("median_s")
    for key, label, goal in (
        ("launcher", "import kfp_trainer.launcher", None),
        ("launch_cli", "import of what `kfp-trainer launch` loads (cli, launcher, kubernetes backend)", None),
        ("components", f"import kfp_trainer.components (kfp alone: {_num(kfp, 's')})", 0.3),
    ):
        x = (imports.get(key) or {}).get("median_s")
        if x is not None:
            out.append(_row(label, _num(x, "s"), _num(sdk, "s") + " (TrainerClient)", compare(x, sdk, lower=True),
                            f"≤ {goal} s" if goal else "below the SDK's", x <= goal if goal else sdk is not None and x < sdk))  # fmt: skip
    relay = r.get("relay") or {}
    if relay:
        a, b = relay["ours"]["lines_per_s"], relay["sdk"]["lines_per_s"]
        ceiling, untimed = relay["raw"]["lines_per_s"], (relay.get("raw_untimed") or {}).get("lines_per_s")
        exact = f"exact: ours {'yes' if relay['ours']['exact'] else 'NO'}, SDK {'yes' if relay['sdk']['exact'] else 'NO'}"
        out.append(_row(f"log relay, lines/s ({relay['lines']} lines, median of {relay['rounds']}; a bare reader that only counts "
                        f"lines: {_num(ceiling)} with timestamps as ours reads, {_num(untimed)} without as the SDK reads; {exact})",
                        _num(a), _num(b), compare(a, b, lower=False), "above the SDK's and ≥ 0.9× the bare reader's",
                        a is not None and b is not None and ceiling is not None and a > b and a >= 0.9 * ceiling
                        and relay["ours"]["exact"]))  # fmt: skip
        a, b = relay["ours"].get("cpu_us_per_line"), relay["sdk"].get("cpu_us_per_line")
        if a is not None and b is not None:
            out.append(_row("log relay, reader process CPU per line, first to last line (µs, median)", _num(a), _num(b),
                            compare(a, b, lower=True), "below the SDK's", a < b))  # fmt: skip
    conc = r.get("concurrency") or {}
    levels = sorted({int(k.split("-")[0]) for k in conc})
    base = (conc.get(f"{levels[0]}-ours") or {}).get("requests_per_job", {}).get("median") if levels else None
    for n in levels:
        o, p = conc.get(f"{n}-ours"), conc.get(f"{n}-sdk")
        if o and p:
            a, b = o["requests_per_job"]["median"], p["requests_per_job"]["median"]
            flat = a is not None and base is not None and a <= base * 1.1
            out.append(_row(f"{n} concurrent launchers ({o['logs']}): requests per job, median (max); failed {o['failed']} / {p['failed']}",
                            f"{_num(a)} ({_num(o['requests_per_job']['max'])})", f"{_num(b)} ({_num(p['requests_per_job']['max'])})",
                            compare(a, b, lower=True), f"flat: ≤ 1.1 × the 1-launcher figure ({_num(base)})", flat))  # fmt: skip
            out.append(_row(f"{n} concurrent launchers: completion → return, median (p95)", _lat(o), _lat(p),
                            compare(o["completion_to_return_s"]["p95"], p["completion_to_return_s"]["p95"], lower=True) + " (p95)",
                            "below the SDK's", None))  # fmt: skip
            a, b = o["apiserver_cpu_s_per_job"], p["apiserver_cpu_s_per_job"]
            total = f"{o['apiserver_cpu_s']:.1f} / {p['apiserver_cpu_s']:.1f} s in all"
            out.append(_row(f"{n} concurrent launchers: API server CPU-seconds per job ({total})", _num(a, "s"), _num(b, "s"),
                            compare(a, b, lower=True), "below the SDK's", a is not None and b is not None and a < b))  # fmt: skip
    cpu = r.get("apiserver_cpu") or {}
    if cpu:
        out.append(_row("API server CPU during the run (idle cluster, per second)", f"{cpu['total_s']:.0f} s in all",
                        f"idle: {cpu['idle_cores']:.3f} cores", "", "", None))  # fmt: skip
    local = r.get("local") or {}
    if local:
        out.append(_row(f"local backend vs raw torchrun, median wall of {local['rounds']} (2-process DDP, {local['steps']} steps)",
                        f"{_num(local['ours_median_s'], 's')} ({local['ratio']:.3f}×, +{local['extra_s']:.2f} s)",
                        f"torchrun {_num(local['torchrun_median_s'], 's')}", "", "≤ 1.03× torchrun", local["ratio"] <= 1.03))  # fmt: skip
    return out


def markdown(r: dict[str, Any]) -> str:
    """``results.md``: the context of the run, the table, and what a typical job's requests are."""
    m = r.get("machine") or {}
    load = r.get("load") or {}
    lines = [
        "# kfp-trainer vs the kubeflow SDK " + str(r.get("peer_version", "")),
        "",
        f"`{r.get('command', 'make bench')}` on {r.get('date', '?')}: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, "
        f"{m.get('memory_gb', '?')} GB; load average during the run {load.get('min', '?')}–{load.get('max', '?')} "
        f"(mean {load.get('mean', '?')}); {r.get('duration_s', 0):.0f} s in all. Requests are counted in the API server's audit "
        "log, per launcher (each runs as a service account of its own); times compare the API server's audit timestamps with "
        "the bench's clock on the same host.",
        "",
        "| figure | ours | SDK | ours vs SDK | goal | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in r.get("table") or rows(r):
        met = {True: "yes", False: "**no**", None: ""}[row["met"]]
        lines.append(f"| {row['figure']} | {row['ours']} | {row['peer']} | {row['vs']} | {row['goal']} | {met} |")
    seq = r.get("sequential") or {}
    kinds = {k: v.get("typical_kinds") for k, v in seq.items() if isinstance(v, dict) and "typical_kinds" in v}
    if kinds:
        lines += ["", "Requests of a typical short job (the median one), by kind:", ""]
        for key, counts in kinds.items():
            lines.append(f"- {key}: " + ", ".join(f"{k} ×{n}" for k, n in (counts or {}).items()))
    for note in r.get("notes") or []:
        lines += ["", note]
    return "\n".join(lines) + "\n"
