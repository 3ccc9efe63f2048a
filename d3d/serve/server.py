"""``python -m d3d serve``: an OpenAI-compatible HTTP server over ``d3d.generate``, standard library only.

    POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, stream
    POST /v1/completions        prompt, the same fields
    GET  /v1/models, /health

    GET  /                      a page that shows each round (``page.html``)

Requests decode together in one decoding thread (``d3d.serve.scheduler``), joining and leaving between
rounds, each with the server's speculative mode or the one its ``d3d_mode`` field asks for (top_p < 1
at T > 0 falls back to ar: speculative sampling is lossless at T, not at a truncation). A streamed
answer is sent as server-sent events in OpenAI's chunk format as tokens are committed; a client that
goes away mid-stream frees its row at the next round. ``"d3d": true`` in a request adds, to each
streamed chunk, what the round that committed its tokens did (draft, accepted, rejected, each
token's text and origin, tau so far).
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..decode.config import SpecConfig
from .protocol import ApiError, chunk, parse, response, usage
from .scheduler import Job, Scheduler

PAGE = Path(__file__).with_name("page.html")


class Handler(BaseHTTPRequestHandler):
    server: "D3DServer"
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection is closed after this many seconds

    def log_message(self, fmt, *args) -> None:  # one line per request on stderr, as http.server does, unless quiet
        if not self.server.quiet:
            super().log_message(fmt, *args)

    def do_GET(self) -> None:
        if self.path.split("?")[0] in ("/", "/index.html"):
            return self.send_body(200, "text/html; charset=utf-8", self.server.page)
        if self.path == "/health":
            return self.send_json(200, {"status": "ok"})
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [
                {"id": self.server.model_name, "object": "model", "created": 0, "owned_by": "d3d"}]})
        self.send_json(404, ApiError(404, f"no route GET {self.path}").body())

    def do_POST(self) -> None:
        routes = {"/v1/chat/completions": True, "/v1/completions": False}
        if self.path not in routes:
            return self.send_json(404, ApiError(404, f"no route POST {self.path}").body())
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 1 << 24:
                raise ApiError(413, f"the request body is {length} bytes; at most 16 MiB")
            s = self.server
            req = parse(self.rfile.read(length), routes[self.path], s.model_name, s.scheduler.tok,
                        s.scheduler.context, s.scheduler.modes)
        except ApiError as e:
            return self.send_json(e.status, e.body())
        except ValueError:
            return self.send_json(400, ApiError(400, "Content-Length: not a number").body())
        self.server.track(+1)
        try:
            job = self.server.scheduler.submit(req)
            if req.stream:
                self.stream_answer(job)
            else:
                self.whole_answer(job)
        finally:
            self.server.track(-1)

    def whole_answer(self, job: Job) -> None:
        parts = []
        while True:
            kind, *rest = job.events.get()
            if kind == "text":
                parts.append(rest[0])
            elif kind == "error":
                return self.send_json(rest[1], ApiError(rest[1], rest[0], kind="server_error").body())
            else:
                return self.send_json(200, response(job.req, self.server.model_name, "".join(parts), rest[0], rest[1]))

    def stream_answer(self, job: Job) -> None:
        name, req = self.server.model_name, job.req
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.event(chunk(req, name, None, first=True))
            while True:
                kind, *rest = job.events.get()
                if kind == "text":
                    self.event(chunk(req, name, rest[0], extra=rest[1] if req.explain else None))
                elif kind == "error":
                    self.event({"error": ApiError(rest[1], rest[0], kind="server_error").body()["error"]})
                    break
                else:
                    last = chunk(req, name, None, finish=rest[0])
                    last["usage"] = usage(req, rest[1])
                    self.event(last)
                    break
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            job.cancelled.set()  # its generation ends at the next committed tokens

    def event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def send_json(self, status: int, obj: dict) -> None:
        self.send_body(status, "application/json", json.dumps(obj).encode())

    def send_body(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class D3DServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold the exit; answers in flight: ``drain``
    request_queue_size = 128  # the listen backlog (http.server's 5 reset connections when 32 clients came at once)

    def __init__(self, address: tuple[str, int], scheduler: Scheduler, model_name: str, quiet: bool = False):
        super().__init__(address, Handler)
        self.scheduler, self.model_name, self.quiet = scheduler, model_name, quiet
        self.page = PAGE.read_bytes()  # the page at /, read once
        self.in_flight, self.idle = 0, threading.Condition()
        self.connections: dict[threading.Thread, socket.socket] = {}  # open connections and their threads

    def process_request_thread(self, request, client_address):
        with self.idle:
            self.connections[threading.current_thread()] = request
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.idle:
                self.connections.pop(threading.current_thread(), None)

    def track(self, delta: int) -> None:
        with self.idle:
            self.in_flight += delta
            self.idle.notify_all()

    def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let the decoding thread finish every request in flight, and wait until each
        answer has been written out."""
        self.shutdown()
        self.scheduler.close()
        with self.idle:
            self.idle.wait_for(lambda: self.in_flight == 0, timeout)
            open_now = dict(self.connections)
        for sock in open_now.values():  # idle keep-alive connections: wake their threads, which then end
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in open_now:  # no thread may outlive the server (one ending with the process aborted it)
            thread.join(timeout)
        self.server_close()


def serve(target, tok, drafter, spec: SpecConfig, model_name: str, host: str = "127.0.0.1", port: int = 8000,
          quiet: bool = False, slots: int = 16, context: int = 2048, decode_thread: bool = True) -> D3DServer:
    """A started server (HTTP on its own thread); ``drain()`` ends it. ``slots``: requests decoded together
    per decoding setting; ``context``: the longest prompt + answer (cut to what the models allow).
    ``decode_thread``: decode on a thread of its own; False: the caller runs ``server.scheduler.run()``
    (``run_forever`` does, on the main thread: see ``Scheduler.run`` for why)."""
    scheduler = Scheduler(target, tok, drafter, spec, slots, context)
    server = D3DServer((host, port), scheduler.start() if decode_thread else scheduler, model_name, quiet)
    threading.Thread(target=server.serve_forever, name="d3d-http", daemon=True).start()
    return server


def run_forever(server: D3DServer) -> int:
    """Decode on this (the main) thread until SIGINT/SIGTERM; then finish the requests in flight, refuse
    new ones (503), stop accepting, exit 0. ``server`` was started with ``decode_thread=False``."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: server.scheduler.stop.set())  # the decoding loop looks at it between rounds
    host, port = server.server_address[:2]
    sch = server.scheduler
    print(f"d3d serve: {server.model_name} on http://{host}:{port}/v1 (spec: {sch.spec}; {sch.slots} requests "
          f"at a time, context {sch.context}); the page: http://{host}:{port}/ ; Ctrl-C to stop", file=sys.stderr,
          flush=True)
    sch.run()
    print("d3d serve: stopped: every request in flight was answered", file=sys.stderr, flush=True)
    server.drain()
    return 0


def model_name(path: Path) -> str:
    return path.resolve().name


__all__ = ["serve", "run_forever", "D3DServer", "model_name", "PAGE"]
