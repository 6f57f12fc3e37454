#!/usr/bin/env python3
"""A small HTTPS front for the kwok controller's kubelet endpoints.

The API server reaches a node's "kubelet" at the node's InternalIP and
``daemonEndpoints.kubeletEndpoint.Port``.  In this control plane that port is
this front (127.0.0.1 only); it forwards every request to the kwok controller's
server and adds the one kubelet behaviour kwok lacks for container logs:

* ``follow=true`` on a running container ends when that container instance
  stops (terminated, restarted, pod deleted) - kwok's log reader never ends a
  follow stream by itself.  Whatever the file holds when the container stops is
  still delivered (the stream ends after a short quiet period).
* ``follow=true`` on a container that is not running any more is answered like
  ``follow=false`` (the log, then the end), as a kubelet does.
* a container that has not started yet gets 400 ``container "<c>" in pod "<p>"
  is waiting to start: <reason>`` like from a kubelet; the API server passes that on.

Everything else (previous logs, tailLines, limitBytes, timestamps) is kwok's.

    logfront.py --listen-port P --upstream-port K --kubeconfig F --cert C --key K
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import queue
import socket
import ssl
import sys
import threading
import time
import urllib.parse

QUIET_AFTER_STOP = 0.6  # seconds without new data before a stopped container's stream ends
POLL = 0.25


class Front:
    def __init__(self, upstream_port: int, kubeconfig: str):
        from kubernetes import client, config

        self.upstream_port = upstream_port
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE

    def upstream(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.upstream_port, context=self.ctx, timeout=30)

    def container_state(self, ns: str, pod: str, container: str):
        """(state, container_id, reason) of the container; state in running|waiting|terminated|gone."""
        from kubernetes.client.rest import ApiException

        try:
            p = self.core.read_namespaced_pod(pod, ns)
        except ApiException as e:
            if e.status == 404:
                return "gone", None, "pod not found"
            raise
        if p.metadata.deletion_timestamp is not None:
            return "gone", None, "pod terminating"
        for cs in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
            if cs.name != container:
                continue
            st = cs.state
            if st and st.running:
                return "running", cs.container_id, None
            if st and st.terminated:
                return "terminated", cs.container_id, st.terminated.reason
            if st and st.waiting:
                # Waiting after a crash (CrashLoopBackOff): the crashed instance has a log.
                last = cs.last_state.terminated if cs.last_state else None
                return "waiting", last.container_id if last else None, st.waiting.reason or "ContainerCreating"
            return "waiting", None, "ContainerCreating"
        return "waiting", None, "ContainerCreating"


def make_handler(front: Front):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet
            pass

        # -------------------------------------------------------------- plain proxy
        def _proxy(self, path: str, method: str = "GET", stop=None) -> None:
            conn = front.upstream()
            body = None
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                body = self.rfile.read(n)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
            except OSError as e:
                self._error(502, f"kubelet front: upstream error: {e}")
                conn.close()
                return
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() in ("transfer-encoding", "content-length", "connection"):
                    continue
                self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            q: queue.Queue = queue.Queue(maxsize=64)

            def pump():
                try:
                    while True:
                        data = resp.read1(65536)
                        q.put(data)
                        if not data:
                            return
                except Exception:  # noqa: BLE001 - upstream closed under us
                    q.put(b"")

            threading.Thread(target=pump, daemon=True).start()
            stopped_at = None
            try:
                while True:
                    if stop is not None and stopped_at is None and stop.is_set():
                        stopped_at = time.monotonic()
                    try:
                        data = q.get(timeout=0.1)
                    except queue.Empty:
                        if stopped_at is not None and time.monotonic() - stopped_at > QUIET_AFTER_STOP:
                            break
                        continue
                    if not data:
                        break
                    if stopped_at is not None:
                        stopped_at = time.monotonic()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass  # the API server (client) went away
            finally:
                if stop is not None:
                    stop.set()
                try:
                    conn.sock and conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()
            self.close_connection = True

        def _error(self, code: int, msg: str) -> None:
            data = msg.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        # -------------------------------------------------------------- logs
        def do_GET(self):  # noqa: N802
            u = urllib.parse.urlsplit(self.path)
            parts = u.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                return self._proxy(self.path)
            _, ns, pod, container = (urllib.parse.unquote(p) for p in parts)
            q = urllib.parse.parse_qs(u.query)
            follow = q.get("follow", ["false"])[0] in ("true", "1")
            previous = q.get("previous", ["false"])[0] in ("true", "1")
            if previous:
                return self._proxy(self.path)
            try:
                state, cid, reason = front.container_state(ns, pod, container)
            except Exception as e:  # noqa: BLE001
                return self._error(500, f"kubelet front: {e}")
            if state == "waiting" and cid is None:
                return self._error(400, f'container "{container}" in pod "{pod}" is waiting to start: {reason}')
            if state == "waiting":
                # Between a crash and the restart a kubelet serves the crashed instance's log,
                # which the log files keep as the previous one by then.
                q.pop("follow", None)
                q["previous"] = ["true"]
                return self._proxy(u.path + "?" + urllib.parse.urlencode(q, doseq=True))
            if not follow or state != "running":
                q.pop("follow", None)
                path = u.path + ("?" + urllib.parse.urlencode(q, doseq=True) if q else "")
                return self._proxy(path)
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    time.sleep(POLL)
                    try:
                        s, c, _ = front.container_state(ns, pod, container)
                    except Exception:  # noqa: BLE001
                        continue
                    if s != "running" or c != cid:
                        stop.set()
                        return

            threading.Thread(target=watch, daemon=True).start()
            self._proxy(self.path, stop=stop)

        def do_POST(self):  # noqa: N802
            self._proxy(self.path, "POST")

    return Handler


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen-port", type=int, required=True)
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    args = ap.parse_args(argv)
    front = Front(args.upstream_port, args.kubeconfig)
    srv = Server(("127.0.0.1", args.listen_port), make_handler(front))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print(json.dumps({"listening": f"127.0.0.1:{args.listen_port}"}), flush=True)
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
