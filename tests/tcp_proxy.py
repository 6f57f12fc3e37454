"""A loopback TCP proxy whose connections a test can cut (watch/log disconnects), slow down, or hold unanswered.

``delay`` is latency, not a bandwidth limit: every chunk is passed on ``delay`` seconds after
it arrived, in order, in both directions, so a request and its answer each take that much
longer, as behind a slow link or an overloaded API server. It may be changed at any time.
While the proxy is :meth:`~TcpProxy.hang`-ed, new connections are accepted and then held, not
passed on, until :meth:`~TcpProxy.answer`: the client sees a server that takes its request and
never replies, as a stuck one does.
"""

from __future__ import annotations

import queue
import socket
import threading
import time


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; :meth:`sever` drops every open connection."""

    def __init__(self, target_host: str, target_port: int, delay: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.severed = 0
        self.closed = False
        self.url = f"http://127.0.0.1:{self.port}"
        self._open = threading.Event()  # set: new connections go through
        self._open.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def hang(self) -> None:
        """From now on, connections are accepted and held without an answer."""
        self._open.clear()

    def answer(self) -> None:
        """Held and new connections go through again."""
        self._open.set()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._open.is_set():
                self._connect(client)
            else:
                threading.Thread(target=self._connect, args=(client, True), daemon=True).start()

    def _connect(self, client: socket.socket, held: bool = False) -> None:
        if held:
            self._open.wait()
        if self.closed:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self.lock:
            self.connections += [client, upstream]
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        pending: queue.Queue[tuple[float, bytes]] = queue.Queue()
        sender = threading.Thread(target=self._send, args=(pending, dst), daemon=True)
        sender.start()
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                pending.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        finally:
            pending.put((0.0, b""))
            sender.join()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @staticmethod
    def _send(pending: queue.Queue[tuple[float, bytes]], dst: socket.socket) -> None:
        try:
            while True:
                due, data = pending.get()
                if not data:
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)
        except OSError:
            while pending.get()[1]:  # the peer is gone: drain until the reader stops
                pass

    def sever(self) -> int:
        """Reset every open connection (as a network blip would); returns how many."""
        with self.lock:
            conns, self.connections = self.connections, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.severed += len(conns) // 2
        return len(conns) // 2

    def close(self) -> None:
        self.closed = True
        self._open.set()
        self.listener.close()
        self.sever()
