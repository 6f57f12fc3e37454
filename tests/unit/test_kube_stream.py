"""Streamed bodies (a followed log): lines as they come, a broken or quiet stream a TransportError, the connection reusable."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from kfp_trainer.backends.kube.apierrors import TransportError
from kfp_trainer.backends.kube.bodylines import batches, each_line
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import Credentials
from kfp_trainer.backends.kube.logs import NodeLogFollower, _Cursor
from kfp_trainer.metrics import MetricSeries
from kfp_trainer.relay import Printer
from tests.tcp_server import ThreadedServer


def encode(body: bytes, rng: random.Random) -> bytes:
    out, at = [], 0
    while at < len(body):
        size = rng.choice([1, 2, 7, 100, 5000])
        extension = rng.choice([b"", b";name=value", b" "])
        out.append(b"%x%s\r\n%s\r\n" % (len(body[at : at + size]), extension, body[at : at + size]))
        at += size
    return b"".join(out) + b"0\r\n" + rng.choice([b"", b"Trailer: x\r\n"]) + b"\r\n"



class ChunkServer(ThreadedServer):
    """Serves each GET the next scripted answer: (head, list of (pause, bytes)) written as they come.

    A pause is seconds, or an event to wait for; ``None`` as bytes cuts the connection.
    """

    def __init__(self) -> None:
        self.answers: list[tuple[bytes, list[tuple[float | threading.Event, bytes | None]]]] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                data = data.split(b"\r\n\r\n", 1)[1]
                head, parts = self.answers.pop(0)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + head + b"\r\n")
                for pause, part in parts:
                    if isinstance(pause, threading.Event):
                        pause.wait(10)
                    else:
                        time.sleep(pause)
                    if part is None:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    conn.sendall(part)


@pytest.fixture
def server():
    s = ChunkServer()
    yield s
    s.close()


def test_a_followed_log_comes_line_by_line_as_it_is_written_and_the_connection_serves_again(server):
    rng = random.Random(4)
    lines = [b"2026-05-01T10:00:01.%09dZ step=%d loss=0.5" % (i, i) for i in range(2000)]
    wire = encode(b"".join(line + b"\n" for line in lines), rng)
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, wire[:30]), (0.05, wire[30:1000]), (0.0, wire[1000:])]),
                      (b"Content-Length: 2\r\n", [(0.0, b"ok")])]  # fmt: skip
    api = Client(Credentials(server.url))
    stream = api.request("GET", "/api/v1/namespaces/ns/pods/p/log", stream=True)
    got = [line for batch in batches(stream) for line in batch]
    stream.close()
    assert got == lines and stream.finished
    assert api.request("GET", "/x") == "ok" and server.connections == 1  # the same connection, ready for the next request


def test_a_log_cut_mid_chunk_is_a_transport_error(server):
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"6\r\nline 1\r\n1\r\n\n\r\n9\r\nline"), (0.05, None)])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    got = []
    with pytest.raises(TransportError, match="the stream broke off"):
        for batch in batches(stream):
            got.extend(batch)
    stream.close()
    assert got == [b"line 1"]


def test_a_stream_quiet_for_longer_than_its_read_timeout_is_a_transport_error(server):
    quiet = threading.Event()
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"7\r\nline 1\n\r\n"), (quiet, b"0\r\n\r\n")])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True, timeout=(5, 0.3))
    got = []
    with pytest.raises(TransportError, match="timed out"):
        for batch in batches(stream):
            got.extend(batch)
    stream.close()
    quiet.set()
    assert got == [b"line 1"]


def test_a_body_of_known_length_gives_its_lines(server):
    server.answers = [(b"Content-Length: 13\r\n", [(0.0, b"line 1\nline 2")])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    assert list(each_line(stream)) == [b"line 1", b"line 2"]
    stream.close()


class Log:
    """The step's log: what was flushed to it."""

    def __init__(self) -> None:
        self.pending, self.flushed = "", ""

    def write(self, text: str) -> int:
        self.pending += text
        return len(text)

    def flush(self) -> None:
        self.flushed, self.pending = self.flushed + self.pending, ""


def test_a_line_is_in_the_step_log_while_the_trainer_has_not_written_the_next(server):
    seen = threading.Event()
    first = b"2026-05-01T10:00:01.000000001Z epoch 1: loss=0.5\n"
    rest = b"2026-05-01T10:00:02.000000001Z epoch 2: loss=0.25\n"
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"%x\r\n%s\r\n" % (len(first), first)),
                                                        (seen, b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))])]  # fmt: skip
    log = Log()
    printer = Printer(log, MetricSeries(), False, lambda: None)
    follower = NodeLogFollower(Client(Credentials(server.url)), namespace="ns", job="tj", replicated_job="node", index=0,
                               sink=printer, stop=threading.Event(), source="node-0")  # fmt: skip
    reading = threading.Thread(target=follower._read, args=("p", _Cursor()), kwargs={"follow": True}, daemon=True)
    reading.start()
    deadline = time.monotonic() + 10
    while log.flushed != "epoch 1: loss=0.5\n" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.flushed == "epoch 1: loss=0.5\n"  # the trainer is quiet: the line does not wait for the next
    seen.set()
    reading.join(10)
    deadline = time.monotonic() + 10
    while log.flushed != "epoch 1: loss=0.5\nepoch 2: loss=0.25\n" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.flushed == "epoch 1: loss=0.5\nepoch 2: loss=0.25\n" and printer.metrics.final() == {"loss": 0.25}


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stream-read"]


def test_lines_that_arrive_while_a_batch_is_handled_come_together_in_the_next(server):
    lines = [b"2026-05-01T10:00:01.%09dZ step=%d" % (i, i) for i in range(50)]
    got_first = threading.Event()
    parts = [(0.0, b"%x\r\n%s\n\r\n" % (len(lines[0]) + 1, lines[0])), (got_first, b"")]
    parts += [(0.001, b"%x\r\n%s\n\r\n" % (len(line) + 1, line)) for line in lines[1:]] + [(0.0, b"0\r\n\r\n")]
    server.answers = [(b"Transfer-Encoding: chunked\r\n", parts)]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    got = []
    for batch in batches(stream):
        got.append(batch)
        if len(got) == 1:
            got_first.set()
            time.sleep(0.5)  # handling the first batch takes a while: the others arrive meanwhile
    stream.close()
    assert got == [lines[:1], lines[1:]] and stream.finished and not _readers()


def test_a_caller_that_stops_early_ends_the_reading_thread_and_drops_the_connection(server):
    quiet = threading.Event()
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"7\r\nline 1\n\r\n"), (quiet, b"0\r\n\r\n")])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    arrived = batches(stream)
    assert next(arrived) == [b"line 1"] and len(_readers()) == 1
    arrived.close()  # as when the caller's loop raised
    stream.close()
    quiet.set()
    assert not _readers() and not stream.finished


def test_a_read_shut_down_from_another_thread_is_a_transport_error_in_the_callers(server):
    quiet = threading.Event()
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"7\r\nline 1\n\r\n"), (quiet, b"0\r\n\r\n")])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    got = []
    threading.Timer(0.3, stream.shutdown).start()
    with pytest.raises(TransportError, match="the stream broke off"):
        for batch in batches(stream):
            got.extend(batch)
    stream.close()
    quiet.set()
    assert got == [b"line 1"] and not _readers()


def test_a_stream_closed_while_its_reading_thread_waits_ends_that_thread(server):
    quiet = threading.Event()
    server.answers = [(b"Transfer-Encoding: chunked\r\n", [(0.0, b"7\r\nline 1\n\r\n"), (quiet, b"0\r\n\r\n")])]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    arrived = batches(stream)
    assert next(arrived) == [b"line 1"]
    started = time.monotonic()
    stream.close()  # before the batches are closed: as when the caller's loop raised and its cleanup came first
    wait_until(lambda: not _readers(), 3)  # not held until the server sends more (10 s here)
    assert time.monotonic() - started < 3
    arrived.close()
    quiet.set()


def test_a_caller_that_takes_its_time_holds_up_the_read_once_a_few_megabytes_wait(server):
    lines = [b"line %04d %s" % (i, b"x" * 90) for i in range(100)]  # 100 bytes each with the newline
    parts = [(0.0, b"%x\r\n%s\n\r\n" % (len(line) + 1, line)) for line in lines] + [(0.0, b"0\r\n\r\n")]
    server.answers = [(b"Transfer-Encoding: chunked\r\n", parts)]
    stream = Client(Credentials(server.url)).request("GET", "/log", stream=True)
    body = Counted(stream)
    got = []
    for batch in batches(body, read_ahead=1000):
        time.sleep(0.2)  # the whole body is there by now: only the limit keeps it out of memory
        got.append(batch)
        taken = 101 * sum(map(len, got))  # 100 bytes and a newline a line
        assert body.read - taken <= 1000 + 101  # the limit, and the piece that went over it
    stream.close()
    assert [line for batch in got for line in batch] == lines and len(got) >= 9 and stream.finished


class Counted:
    """A body whose bytes read so far are counted."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.read = 0

    def chunks(self):
        for chunk in self.stream.chunks():
            self.read += len(chunk)
            yield chunk

    def shutdown(self) -> None:
        self.stream.shutdown()


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
