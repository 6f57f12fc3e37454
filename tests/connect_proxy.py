"""An HTTP CONNECT proxy on 127.0.0.1 for tests: every tunnel goes to one target port, and each is recorded.

A test points a kubeconfig's ``proxy-url`` (or ``HTTPS_PROXY``) at it and counts the tunnels:
requests that went through it, and the host each asked for (a name only the proxy "resolves").
"""

from __future__ import annotations

import socket
import threading

from tests.tcp_server import ThreadedServer


class ConnectProxy(ThreadedServer):
    """An HTTP CONNECT proxy on 127.0.0.1 that sends every tunnel to ``target`` and records what each asked for."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.tunnels: list[dict[str, str]] = []
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.decode().split("\r\n")
        method, where, _ = lines[0].split(" ", 2)
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.tunnels.append({"method": method, "target": where, "auth": headers.get("proxy-authorization", "")})
        upstream = socket.create_connection(("127.0.0.1", self.target))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
