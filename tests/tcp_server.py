"""A TCP server on 127.0.0.1 for tests: each connection handled by a thread of its own, until closed."""

from __future__ import annotations

import socket
import threading


class ThreadedServer:
    """Listens on a free port of 127.0.0.1; a subclass's :meth:`handle` serves each connection in a thread.

    Attributes:
        port: The port it listens on.
        url: ``http://127.0.0.1:<port>``.
        connections: How many connections it accepted.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.connections += 1
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        """Serve one connection (in its own thread)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop accepting connections."""
        self.listener.close()
