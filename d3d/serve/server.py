"""``python -m d3d serve``: an OpenAI-compatible HTTP server over ``d3d.generate``, standard library only.

    POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, stream
    POST /v1/completions        prompt, the same fields
    GET  /v1/models, /health

Requests go to one decoding thread that answers them one at a time, in arrival order, each with the
speculative mode the server was started with (top_p < 1 at T > 0 falls back to ar: speculative
sampling is lossless at T, not at a truncation). A streamed answer is sent as server-sent events in
OpenAI's chunk format as tokens are committed; a client that goes away mid-stream ends its
generation at the next round. ``"d3d": true`` in a request adds, to each streamed chunk, what the
round that committed its tokens did (draft, accepted, bonus, where the draft came from). Not yet:
decoding concurrent requests together (they queue), the page that shows rounds.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..decode.config import SpecConfig
from ..decode.engines import generate
from .protocol import ApiError, Request, chunk, parse, response, usage


class Cancelled(Exception):
    """Raised inside the stream callback to end a generation early (stop string, client gone)."""


class Job:
    """One request in flight: its events (("text", delta, info) ..., then ("done", finish, n) or
    ("error", message)) and whether its client has gone."""

    def __init__(self, req: Request):
        self.req, self.events, self.cancelled = req, queue.Queue(), threading.Event()


class Worker:
    """The decoding thread: takes jobs in arrival order and decodes each with ``spec``."""

    def __init__(self, target, tok, drafter, spec: SpecConfig):
        self.target, self.tok, self.drafter, self.spec = target, tok, drafter, spec
        self.stop_ids = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.abandoned = 0  # generations ended early because their client went away
        self.thread = threading.Thread(target=self.loop, name="d3d-decode", daemon=True)
        self.thread.start()

    def submit(self, req: Request) -> Job:
        job = Job(req)
        self.jobs.put(job)
        return job

    def close(self) -> None:
        """Finish the jobs already queued, then end the thread."""
        self.jobs.put(None)
        self.thread.join()

    def loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.cancelled.is_set():
                continue
            try:
                self.decode(job)
            except Exception as e:  # a bug must not kill the server: the request gets a 500, the rest go on
                job.events.put(("error", f"{type(e).__name__}: {e}"))

    def decode(self, job: Job) -> None:
        req, text = job.req, TextStream(self.tok, job.req.stop)
        spec = self.spec
        if req.sampling.top_p is not None and req.sampling.temperature > 0:
            spec = SpecConfig("ar")
        rounds = []

        def stream(_seq: int, new: list[int]) -> None:
            if job.cancelled.is_set():
                raise Cancelled
            delta = text.add(new)
            info = rounds[-1] if (req.explain and rounds) else None
            if delta or info:
                job.events.put(("text", delta, info))
            if text.stopped:
                raise Cancelled

        def on_round(r) -> None:
            rounds.append({"round": r.round, "draft": r.draft, "accepted": r.accepted, "bonus": r.bonus,
                           "leaf": r.leaf, "source": "hypothesis" if r.successor_used else "datastore" if r.stored
                           else "copy" if r.copied else "drafter", "hypothesis_hit": r.hit})

        try:
            out = generate(self.target, req.prompt_ids, max_new_tokens=req.max_tokens, spec=spec, drafter=self.drafter,
                           sampling=req.sampling, stop_ids=self.stop_ids, stream=stream,
                           on_round=on_round if req.explain and spec.mode != "ar" else None)
            stopped, n = out.stats.stopped[0], len(out.tokens[0])
        except Cancelled:
            stopped, n = True, text.count
            self.abandoned += job.cancelled.is_set()
        if not job.cancelled.is_set():
            tail = text.flush()
            if tail:
                job.events.put(("text", tail, None))
            job.events.put(("done", "stop" if stopped else "length", n))


class TextStream:
    """Token ids -> text deltas: holds back an incomplete UTF-8 character and anything that may be the
    start of a stop string; ``stopped`` once a stop string appears (the text ends before it)."""

    def __init__(self, tok, stop: list[str]):
        self.tok, self.stop, self.ids, self.sent, self.stopped, self.count = tok, stop, [], 0, False, 0

    def add(self, new: list[int]) -> str:
        self.ids.extend(new)
        self.count += len(new)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        hits = [i for s in self.stop if (i := text.find(s, self.sent)) >= 0]  # held back: none starts earlier
        if hits:
            self.stopped = True
            return self._emit(text[:min(hits)])
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return self._emit(text[:len(text) - hold])

    def flush(self) -> str:
        if self.stopped:
            return ""
        return self._emit(self.tok.decode(self.ids, skip_special_tokens=True))

    def _emit(self, upto: str) -> str:
        delta = upto[self.sent:]
        self.sent = max(self.sent, len(upto))
        return delta


class Handler(BaseHTTPRequestHandler):
    server: "D3DServer"
    protocol_version = "HTTP/1.1"
    timeout = 120  # an idle keep-alive connection is closed after this many seconds

    def log_message(self, fmt, *args) -> None:  # one line per request on stderr, as http.server does, unless quiet
        if not self.server.quiet:
            super().log_message(fmt, *args)

    def do_GET(self) -> None:
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
            req = parse(self.rfile.read(length), routes[self.path], s.model_name, s.worker.tok,
                        s.worker.target.cfg.max_position_embeddings)
        except ApiError as e:
            return self.send_json(e.status, e.body())
        except ValueError:
            return self.send_json(400, ApiError(400, "Content-Length: not a number").body())
        self.server.track(+1)
        try:
            job = self.server.worker.submit(req)
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
                return self.send_json(500, ApiError(500, rest[0], kind="server_error").body())
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
                    self.event({"error": ApiError(500, rest[0], kind="server_error").body()["error"]})
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
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class D3DServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold the exit; answers in flight: ``drain``

    def __init__(self, address: tuple[str, int], worker: Worker, model_name: str, quiet: bool = False):
        super().__init__(address, Handler)
        self.worker, self.model_name, self.quiet = worker, model_name, quiet
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
        """Stop accepting, let the decoding thread finish every queued request, and wait until each
        answer has been written out."""
        self.shutdown()
        self.worker.close()
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
          quiet: bool = False) -> D3DServer:
    """A started server (its own thread); ``drain()`` ends it."""
    server = D3DServer((host, port), Worker(target, tok, drafter, spec), model_name, quiet)
    threading.Thread(target=server.serve_forever, name="d3d-http", daemon=True).start()
    return server


def run_forever(server: D3DServer) -> int:
    """Until SIGINT/SIGTERM: then stop accepting, finish the requests in flight, exit 0."""
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    host, port = server.server_address[:2]
    print(f"d3d serve: {server.model_name} on http://{host}:{port}/v1 (spec: {server.worker.spec}); "
          "Ctrl-C to stop", file=sys.stderr, flush=True)
    while not done.wait(0.5):  # a timed wait: a signal delivered to another thread still runs its handler
        pass
    print("d3d serve: stopping: finishing the requests in flight", file=sys.stderr, flush=True)
    server.drain()
    return 0


def model_name(path: Path) -> str:
    return path.resolve().name


__all__ = ["serve", "run_forever", "Worker", "TextStream", "D3DServer", "model_name"]
