"""The log relay's own path, without a cluster: HTTP response in, the launcher's stdout out.

``python -m bench.relay_path`` serves the log of :mod:`bench.relay` (``log_lines``, with the
timestamps a kubelet adds for ``timestamps=true``) from a small HTTP server in a child process,
as a chunked response cut either into one chunk per line (a kubelet flushes each line) or into
blocks cut anywhere (an API server copies its kubelet's stream 32 KiB at a time). In turn,
``--rounds`` times, three readers fetch it over one client of the Kubernetes backend
(:class:`kfp_trainer.backends.kube.client.Client`):

* ``urllib3``: a plain loop over urllib3's reads of the response (a chunk at a time, as the
  raw reader of :mod:`bench.relay`, the kubeflow SDK and ours read it) that only counts
  newlines -- the ceiling of this path;
* ``sdk``: the kubeflow SDK's way (``get_job_logs(follow=True)`` reads the log without
  timestamps through the ``kubernetes`` library's ``iter_resp_lines``) with each line printed;
* ``ours``: the launcher's path -- :class:`~kfp_trainer.backends.kube.logs.NodeLogFollower`
  reading one container's log into a :class:`~kfp_trainer.relay.Printer` that writes to a
  pipe (its text layer set up as ``sys.stdout`` is when a pipe is the step's log), drained by
  a thread; the pipe's bytes must equal the log's lines.

A rate is the lines divided by the time from the request to the last byte through the pipe
(the plain loops: to the last byte read); the CPU time per line is this process's (all its
threads; not the server's), steadier than the rate on a busy machine. ``--profile`` runs
``ours`` once more under cProfile and prints where its time went.
"""

from __future__ import annotations

import argparse
import cProfile
import http.server
import io
import multiprocessing
import os
import pstats
import statistics
import threading
import time
from typing import Any

from bench.relay import cri, log_lines
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import Credentials
from kfp_trainer.backends.kube.logs import NodeLogFollower, _Cursor
from kfp_trainer.metrics import MetricSeries
from kfp_trainer.relay import Printer

POD = "relay-0"
PATH = f"/api/v1/namespaces/bench/pods/{POD}/log"


def served_log(lines: list[str]) -> bytes:
    """``lines`` as the API server returns them with ``timestamps=true``: ``<RFC 3339, 9 digits>Z <text>``."""
    out = []
    for record in cri(lines, time.time()).split(b"\n")[:-1]:
        stamp, _stream, _tag, text = record.split(b" ", 3)
        out.append(stamp + b" " + text + b"\n")
    return b"".join(out)


def chunked(body: bytes, block: int) -> bytes:
    """``body`` as a chunked transfer encoding: one chunk per line (``block`` 0) or per ``block`` bytes."""
    if block:
        pieces = [body[i : i + block] for i in range(0, len(body), block)]
    else:
        pieces = body.splitlines(keepends=True)
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def _serve(ready: Any, stamped: bytes, plain: bytes) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(stamped if "timestamps=true" in self.path else plain)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ready.send(server.server_address[1])
    server.serve_forever()


class Drain:
    """A pipe whose reading end a thread empties into memory; the writing end as a text stream like ``sys.stdout``."""

    def __init__(self) -> None:
        read, write = os.pipe()
        self.data = bytearray()
        self.out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write, "w")), encoding="utf-8", errors="strict")
        self._thread = threading.Thread(target=self._drain, args=(read,), daemon=True)
        self._thread.start()

    def _drain(self, fd: int) -> None:
        while chunk := os.read(fd, 1 << 20):
            self.data += chunk
        os.close(fd)

    def finish(self) -> bytes:
        """Close the writing end and wait until all of it was read."""
        self.out.close()
        self._thread.join()
        return bytes(self.data)


def plain(api: Client, n: int) -> tuple[float, float]:
    """Lines/s of a loop that only counts the newlines of the streamed response, and its CPU microseconds per line."""
    start, cpu = time.perf_counter(), time.process_time()
    stream = api.request("GET", PATH, query=[("container", "node"), ("follow", "true"), ("timestamps", "true")], stream=True)
    count = 0
    for chunk in stream.response.stream(None):
        count += chunk.count(b"\n")
    stream.close()
    if count != n:
        raise RuntimeError(f"the plain loop counted {count} lines, expected {n}")
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n * 1e6


def sdk(api: Client, n: int, expected: bytes) -> tuple[float, float]:
    """Lines/s and CPU microseconds per line of the SDK's reading, each line printed to a pipe; checks the bytes."""
    from kubernetes.watch.watch import iter_resp_lines

    def log_stream(response: Any) -> Any:  # Watch.stream hands a log's lines on as they come
        yield from iter_resp_lines(response)

    drain = Drain()
    start, cpu = time.perf_counter(), time.process_time()
    stream = api.request("GET", PATH, query=[("container", "node"), ("follow", "true")], stream=True)
    for line in log_stream(stream.response):
        print(line, file=drain.out)
    stream.close()
    got = drain.finish()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if got != expected:
        raise RuntimeError(f"the SDK's way is not byte-exact: {len(got)} bytes, expected {len(expected)}")
    return n / seconds, cpu / n * 1e6


def ours(api: Client, n: int, expected: bytes) -> tuple[float, float, float]:
    """Lines/s of the launcher's path (the log follower into the printer into a pipe), CPU microseconds per line; checks the bytes.

    The third figure is the CPU microseconds per line that parsing the metrics costs afterwards,
    when the points are first read (as a step does once its job ended).
    """
    drain = Drain()
    printer = Printer(drain.out, MetricSeries(), prefix=False, on_first=lambda: None)
    follower = NodeLogFollower(api, namespace="bench", job="relay", replicated_job="node", index=0, sink=printer,
                               stop=threading.Event(), source="node-0")  # fmt: skip
    start, cpu = time.perf_counter(), time.process_time()
    follower._read(POD, _Cursor(), follow=True)
    printer.close()
    got = drain.finish()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected)))
        raise RuntimeError(f"ours is not byte-exact: {len(got)} bytes, expected {len(expected)}; first difference at {at}")
    parse = time.process_time()
    points = len(printer.metrics.points)
    parse = time.process_time() - parse
    if printer.count != n or points == 0:
        raise RuntimeError(f"ours relayed {printer.count} lines ({points} metric points), expected {n}")
    return n / seconds, cpu / n * 1e6, parse / n * 1e6


def main(argv: list[str] | None = None) -> None:
    """Measure, print lines/s (median of the rounds) per chunking and side; optionally profile ours."""
    parser = argparse.ArgumentParser(prog="python -m bench.relay_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", default="32768,0", help="chunk sizes to serve, comma-separated; 0: one chunk per line")
    parser.add_argument("--profile", type=int, default=None, metavar="CHUNK", help="profile ours once with this chunking")
    parser.add_argument("--top", type=int, default=18, help="profile entries shown")
    args = parser.parse_args(argv)
    lines = log_lines(args.lines)
    expected = ("\n".join(lines) + "\n").encode()
    body = served_log(lines)
    blocks = [int(c) for c in args.chunks.split(",") if c.strip()]
    if args.profile is not None and args.profile not in blocks:
        blocks.append(args.profile)
    context = multiprocessing.get_context("fork")
    for block in blocks:
        recv, send = context.Pipe(duplex=False)
        server = context.Process(target=_serve, args=(send, chunked(body, block), chunked(expected, block)), daemon=True)
        server.start()
        port = recv.recv()
        what = "one chunk per line" if block == 0 else f"{block}-byte chunks"
        try:
            with Client(Credentials(host=f"http://127.0.0.1:{port}")) as api:
                if args.rounds:
                    runs: dict[str, list[tuple[float, ...]]] = {"urllib3": [], "sdk": [], "ours": []}
                    for _ in range(args.rounds):
                        runs["urllib3"].append(plain(api, args.lines))
                        runs["sdk"].append(sdk(api, args.lines, expected))
                        runs["ours"].append(ours(api, args.lines, expected))
                    print(f"{args.lines} lines, {len(body)} bytes, {what}, {args.rounds} rounds "
                          "(median lines/s, median CPU microseconds per line of this process; runs):")  # fmt: skip
                    for side, values in runs.items():
                        rates, cpus = [v[0] for v in values], [v[1] for v in values]
                        each = " ".join(f"{v / 1000:.1f}k" for v in rates)
                        print(f"  {side:8} {statistics.median(rates) / 1000:8.1f}k  {statistics.median(cpus):6.2f} us   ({each})")
                    parse = statistics.median(v[2] for v in runs["ours"])
                    print(f"  ours, afterwards: {parse:.2f} us per line to parse the metrics when the points are first read")
                if block == args.profile:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    ours(api, args.lines, expected)
                    profiler.disable()
                    print(f"profile of ours, {what} (tottime, top {args.top}):")
                    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        finally:
            server.terminate()
            server.join()


if __name__ == "__main__":
    main()
