"""A caching PyPI mirror on 127.0.0.1 for the duration of a build: each file is downloaded once.

pip's own HTTP cache stores a response only when the server says it may be cached
(Cache-Control, ETag); behind a proxy that drops those headers nothing is ever stored, and
torch's wheels (about 3 GB with the CUDA libraries) would be downloaded at every cold build.
This mirror serves ``/simple/<project>/`` from pypi.org with the file links pointed at itself
and ``/files/<path>`` from a directory of this machine, filling it from files.pythonhosted.org
the first time (streamed to pip while it is written). Index pages are kept too, so a build
whose files are all here works offline. A build sees it through a pip configuration given as a
build secret (hack/k8s/images.py), only while the image is built; nothing of it ends up in an image.
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path

INDEX = "https://pypi.org/simple/"
FILES = "https://files.pythonhosted.org/"
_SAFE = re.compile(r"^[A-Za-z0-9._/+-]+$")


def _context() -> ssl.SSLContext:
    bundle = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    return ssl.create_default_context(cafile=bundle if Path(bundle).exists() else None)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Mirror

    def log_message(self, format, *args):  # noqa: A002 - the base class' name
        pass

    def do_GET(self):  # noqa: N802 - the base class' name
        path = self.path.split("?", 1)[0].lstrip("/")
        if ".." in path.split("/") or not _SAFE.match(path):
            self.send_error(400, "bad path")
        elif path.startswith("simple/"):
            self._index(path[len("simple/"):].strip("/"))
        elif path.startswith("files/"):
            self._file(path[len("files/"):])
        else:
            self.send_error(404)

    def _index(self, project: str) -> None:
        cached = self.server.root / "simple" / project / "index.html"
        try:
            request = urllib.request.Request(f"{INDEX}{project}/", headers={"Accept": "text/html"})
            with urllib.request.urlopen(request, timeout=60, context=self.server.ssl) as response:
                page = response.read()
            page = page.replace(FILES.encode(), f"http://{self.server.address}/files/".encode())
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{threading.get_ident()}")
            tmp.write_bytes(page)
            tmp.replace(cached)
        except urllib.error.HTTPError as e:
            self.send_error(e.code)
            return
        except OSError:
            if not cached.exists():  # offline, and never seen: nothing to serve
                self.send_error(502, "index unreachable")
                return
            page = cached.read_bytes()
        self._send(page, "text/html")

    def _file(self, rel: str) -> None:
        target = self.server.root / "files" / rel
        if target.exists():
            with open(target, "rb") as f:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(target.stat().st_size))
                self.end_headers()
                shutil.copyfileobj(f, self.wfile, 1 << 20)
            return
        try:
            upstream = urllib.request.urlopen(FILES + rel, timeout=120, context=self.server.ssl)
        except urllib.error.HTTPError as e:
            self.send_error(e.code)
            return
        except OSError:
            self.send_error(502, "files unreachable")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{threading.get_ident()}")
        with upstream, open(tmp, "wb") as out:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            length = upstream.headers.get("Content-Length")
            if length:
                self.send_header("Content-Length", length)
            self.end_headers()
            size = 0
            while chunk := upstream.read(1 << 20):
                out.write(chunk)
                self.wfile.write(chunk)
                size += len(chunk)
        if length is None or size == int(length):
            tmp.replace(target)
            self.server.downloaded += size
        else:
            tmp.unlink(missing_ok=True)

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Mirror(http.server.ThreadingHTTPServer):
    """The mirror, serving from (and filling) ``root``; use as a context manager."""

    daemon_threads = True

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.ssl = _context()
        self.downloaded = 0
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """host:port it listens on."""
        return f"127.0.0.1:{self.server_address[1]}"

    @property
    def index_url(self) -> str:
        """What pip's ``--index-url`` should be."""
        return f"http://{self.address}/simple/"

    def __enter__(self) -> Mirror:
        self._thread = threading.Thread(target=self.serve_forever, name="pypi-mirror", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
