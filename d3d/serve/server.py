"""``python -m d3d serve``: an OpenAI-compatible HTTP server over ``d3d.generate``.

    POST /v1/chat/completions   messages, max_tokens, temperature, top_p, stop, seed, stream
    POST /v1/completions        prompt, the same fields
    GET  /v1/models, /health

    GET  /                      a page that shows each round (``page.html``)

Requests decode together in one decoding loop (``d3d.serve.scheduler``), joining and leaving between
rounds, each with the server's speculative mode or the one its ``d3d_mode`` field asks for (top_p < 1
at T > 0 falls back to ar: speculative sampling is lossless at T, not at a truncation), each row
sampling as its request asks. A streamed answer is sent as server-sent events in OpenAI's chunk format
as tokens are committed. A client that goes away, streamed or not, frees its row at the next round.
``"d3d": true`` in a request adds, to each streamed chunk, what the round that committed its tokens did
(draft, accepted, rejected, each token's text and origin, tau so far).

HTTP is h11's (``d3d.serve.http`` bounds it) on one asyncio loop, so an idle or slow connection costs
no thread: at most ``MAX_CONNECTIONS`` are open (past it the one waiting longest for its request is
closed, or with none waiting the newcomer gets a 503 with Retry-After), at most ``MAX_REQUESTS`` are in
flight (past it a 503 with Retry-After), and a body is at most what a prompt of the context can need
(``largest_body``: 413 before it is read). Requests are checked and tokenized on a thread of their own,
off the decoding loop and the HTTP loop (``d3d.serve.protocol``). Only who should reach it: a request
whose Host is not the bound address or localhost (any Host where it binds 0.0.0.0 or ::), or whose
Origin, when sent, is not one of those hosts nor the Host itself, gets a 403 unless ``--allow-origin``
names that origin: a web page the user opens elsewhere cannot drive it, nor read it by DNS rebinding.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from ..decode.config import SpecConfig
from .http import Connection, Gone, HttpError, Incoming, Limits
from .prompt import PromptEncoder
from .protocol import ApiError, chunk, parse, response, usage
from .scheduler import Job, Scheduler

PAGE = Path(__file__).with_name("page.html")
MAX_CONNECTIONS = 512  # open connections (idle ones cost a few KiB, no thread)
MAX_REQUESTS = 256  # requests being checked, waiting or decoding
RETRY_AFTER = [("Retry-After", "1")]
ROUTES = {"/v1/chat/completions": True, "/v1/completions": False}  # POST: chat or not
PAGES = ("/", "/index.html", "/health", "/v1/models")
LOCAL = {"localhost", "127.0.0.1", "::1"}


class Access:
    """Who may use the server: the Host and Origin checks of the module docstring."""

    def __init__(self, host: str, origins: tuple[str, ...] = ()):
        self.hosts = None if host in ("0.0.0.0", "::", "") else LOCAL | {host.strip("[]").lower()}
        self.origins = set(origins)

    def refusal(self, headers: dict[str, str]) -> str | None:
        """Why a request with these headers is refused (None: it is not)."""
        host = headers.get("host", "")
        if self.hosts is not None and hostname(host) not in self.hosts:
            return f"Host: {host}: this server answers requests to {', '.join(sorted(self.hosts))} only (--host)"
        origin = headers.get("origin")
        if origin is None or "*" in self.origins or origin in self.origins:
            return None
        if hostname(urlsplit(origin).netloc) in (self.hosts or LOCAL) or urlsplit(origin).netloc == host:
            return None
        return f"Origin: {origin}: not allowed; start the server with --allow-origin {origin} to allow it"

    def cors(self, headers: dict[str, str]) -> list[tuple[str, str]]:
        """The CORS headers for an allowed cross-origin request (none for a same-origin one)."""
        origin = headers.get("origin")
        if origin is None or not ("*" in self.origins or origin in self.origins):
            return []
        return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]


def hostname(host: str) -> str | None:
    """``host[:port]`` -> the host, lower case, without brackets (None: not a host)."""
    try:
        return urlsplit("//" + host).hostname
    except ValueError:
        return None


class Events:
    """A job's events, from the decoding loop to the answer's coroutine on the HTTP loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop, self.queue = loop, asyncio.Queue()

    def put(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is gone
            pass


class D3DServer:
    """The HTTP side: ``serve_forever`` runs its loop (on a thread of its own), ``drain`` ends it."""

    def __init__(self, address: tuple[str, int], scheduler: Scheduler, model_name: str, quiet: bool = False,
                 allow_origins: tuple[str, ...] = (), limits: Limits | None = None):
        self.scheduler, self.model_name, self.quiet = scheduler, model_name, quiet
        self.prompts = PromptEncoder(scheduler.tok, scheduler.context)
        self.limits, self.access, self.page = limits or Limits(), Access(address[0], allow_origins), PAGE.read_bytes()
        self.limits.max_body = min(self.limits.max_body, largest_body(self.prompts.max_bytes, scheduler.context))
        self.max_connections, self.max_requests = MAX_CONNECTIONS, MAX_REQUESTS
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.create_server(address, family=family, backlog=128)
        self.server_address = self.sock.getsockname()
        self.in_flight, self.idle = 0, threading.Condition()
        self.connections: dict[Connection, asyncio.Task] = {}
        self.loop = asyncio.new_event_loop()
        self.parser = ThreadPoolExecutor(1, thread_name_prefix="d3d-parse")  # checks and tokenizing, one at a time
        self.thread: threading.Thread | None = None
        self.stopping: asyncio.Event | None = None
        self.listener: asyncio.AbstractServer | None = None

    # ------------------------------------------------------------ the loop

    def serve_forever(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self.stopping = asyncio.Event()
        self.listener = await asyncio.start_server(self._connection, sock=self.sock)
        await self.stopping.wait()
        self.listener.close()
        tasks = list(self.connections.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def drain(self, timeout: float | None = None) -> None:
        """Stop accepting, let the decoding loop finish every request in flight, wait until each answer has
        been written out, then close every connection and end the HTTP loop and its thread."""
        if self.listener is not None:
            self.loop.call_soon_threadsafe(self.listener.close)
        self.scheduler.close()
        with self.idle:
            self.idle.wait_for(lambda: self.in_flight == 0, timeout)
        if self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        if self.thread is not None:
            self.thread.join(timeout)
        self.parser.shutdown(wait=False)
        self.sock.close()

    def track(self, delta: int) -> None:
        with self.idle:
            self.in_flight += delta
            self.idle.notify_all()

    # ------------------------------------------------------------ connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer, self.limits)
        if len(self.connections) >= self.max_connections and not self._evict():
            return await conn.refuse(HttpError(503, f"the server holds {len(self.connections)} connections, its "
                                                    "most; try again", RETRY_AFTER))
        self.connections[conn] = asyncio.current_task()
        try:
            while (req := await conn.request()) is not None:
                await self.answer(conn, req)
                if not conn.next_cycle():
                    break
            await conn.close()
        except HttpError as e:
            self.log(conn, "-", "-", e.status)
            await conn.refuse(e)
        except Gone:
            writer.close()
        except asyncio.CancelledError:
            if conn.evicted and conn.started:  # a request begun, never finished: say why
                await conn.refuse(HttpError(503, "the server is at its connection limit; try again", RETRY_AFTER))
            writer.close()
        except Exception as e:  # noqa: BLE001 - a bug: answered with a 500 naming it, the server goes on
            traceback.print_exc()
            await conn.refuse(HttpError(500, f"{type(e).__name__}: {e}"))
        finally:
            self.connections.pop(conn, None)

    def _evict(self) -> bool:
        """Close the connection that has waited longest for its request (False: every one is answering)."""
        waiting = [c for c in self.connections if not c.busy]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: (c.started, c.waiting_since))  # one that sent nothing first
        victim.evicted = True
        self.connections.pop(victim).cancel()
        return True

    # ------------------------------------------------------------ routes

    async def answer(self, conn: Connection, req: Incoming) -> None:
        refusal = self.access.refusal(req.headers)
        if refusal:
            raise HttpError(403, refusal)
        path, cors = req.path.split("?")[0], self.access.cors(req.headers)
        if req.method == "OPTIONS" and cors:  # a CORS preflight of an allowed origin
            asked = req.headers.get("access-control-request-headers", "Content-Type, Authorization")
            await self.send(conn, req, 204, "text/plain", b"", cors + [
                ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"), ("Access-Control-Allow-Headers", asked)])
        elif req.method == "GET" and path in PAGES:
            await self.get(conn, req, path, cors)
        elif req.method == "POST" and path in ROUTES:
            await self.complete(conn, req, ROUTES[path], cors)
        elif path in PAGES or path in ROUTES:
            allow = "POST" if path in ROUTES else "GET"
            await self.send_json(conn, req, 405, ApiError(405, f"{req.method} {path}: use {allow}").body(),
                                 [("Allow", allow)] + cors)
        else:
            await self.send_json(conn, req, 404, ApiError(404, f"no route {req.method} {path}").body(), cors)

    async def get(self, conn: Connection, req: Incoming, path: str, cors: list) -> None:
        if path in ("/", "/index.html"):
            return await self.send(conn, req, 200, "text/html; charset=utf-8", self.page, cors)
        if path == "/health":
            return await self.send_json(conn, req, 200, {"status": "ok"}, cors)
        await self.send_json(conn, req, 200, {"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "d3d"}]}, cors)

    async def complete(self, conn: Connection, req: Incoming, chat: bool, cors: list) -> None:
        """A completion: checked and tokenized off both loops, decoded, answered whole or streamed."""
        if self.in_flight >= self.max_requests:
            return await self.send_json(conn, req, 503, ApiError(503, f"{self.in_flight} requests in flight, this "
                                        "server's most; try again", kind="server_error").body(), RETRY_AFTER + cors)
        self.track(+1)
        try:
            s = self.scheduler
            try:
                request = await self.loop.run_in_executor(self.parser, parse, req.body, chat, self.model_name,
                                                          self.prompts, s.context, s.modes, s.spec.mode)
            except ApiError as e:
                return await self.send_json(conn, req, e.status, e.body(), cors)
            events = Events(self.loop)
            job = s.submit(request, events)
            watcher = asyncio.ensure_future(self.hangup(conn, job, events))
            try:
                await (self.stream_answer if request.stream else self.whole_answer)(conn, req, job, events, cors)
            except Gone:
                job.cancelled.set()  # its generation ends at the next round
                raise
            finally:
                watcher.cancel()
        finally:
            self.track(-1)

    async def hangup(self, conn: Connection, job: Job, events: Events) -> None:
        """Cancel ``job`` as soon as its client hangs up (streamed or not)."""
        await conn.watch()
        job.cancelled.set()
        events.queue.put_nowait(("gone",))

    async def whole_answer(self, conn: Connection, req: Incoming, job: Job, events: Events, cors: list) -> None:
        parts = []
        while True:
            kind, *rest = await events.queue.get()
            if kind == "text":
                parts.append(rest[0])
            elif kind == "gone":
                raise Gone("the client hung up")
            elif kind == "error":
                return await self.send_json(conn, req, rest[1], ApiError(rest[1], rest[0], kind="server_error").body(),
                                            cors)
            else:
                return await self.send_json(conn, req, 200, response(job.req, self.model_name, "".join(parts), *rest),
                                            cors)

    async def stream_answer(self, conn: Connection, req: Incoming, job: Job, events: Events, cors: list) -> None:
        name, r = self.model_name, job.req
        await conn.start_stream([("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")] + cors)
        self.log(conn, req.method, req.path, 200)
        await conn.stream_part(sse(chunk(r, name, None, first=True)))
        while True:
            kind, *rest = await events.queue.get()
            if kind == "text":
                await conn.stream_part(sse(chunk(r, name, rest[0], extra=rest[1] if r.explain else None)))
                continue
            if kind == "gone":
                raise Gone("the client hung up")
            if kind == "error":
                await conn.stream_part(sse({"error": ApiError(rest[1], rest[0], kind="server_error").body()["error"]}))
            else:
                last = chunk(r, name, None, finish=rest[0])
                last["usage"] = usage(r, rest[1])
                await conn.stream_part(sse(last))
            break
        await conn.stream_part(b"data: [DONE]\n\n")
        await conn.end_stream()

    async def send_json(self, conn: Connection, req: Incoming, status: int, obj: dict, headers: list) -> None:
        await self.send(conn, req, status, "application/json", json.dumps(obj).encode(), headers)

    async def send(self, conn: Connection, req: Incoming, status: int, content_type: str, body: bytes,
                   headers: list) -> None:
        self.log(conn, req.method, req.path, status)
        await conn.send(status, content_type, body, headers)

    def log(self, conn: Connection, method: str, path: str, status: int) -> None:
        """One line per answer on stderr, unless quiet."""
        if not self.quiet:
            peer = conn.writer.get_extra_info("peername") or ("-",)
            print(f'{peer[0]} "{method} {path[:200]}" {status}', file=sys.stderr, flush=True)


def largest_body(prompt_bytes: int, context: int) -> int:
    """The most bytes a request to this server can need: its prompt's text at 6 bytes of JSON a byte
    (``\\u0001``), 64 bytes of JSON a message (each message costs a token or more), 64 KiB besides.
    A larger body is refused (413) before it is read."""
    return 6 * prompt_bytes + 64 * context + (64 << 10)


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def serve(target, tok, drafter, spec: SpecConfig, model_name: str, host: str = "127.0.0.1", port: int = 8000,
          quiet: bool = False, slots: int = 16, context: int = 2048, decode_thread: bool = True,
          allow_origins: tuple[str, ...] = ()) -> D3DServer:
    """A started server (HTTP on its own thread); ``drain()`` ends it. ``slots``: requests decoded together
    per mode; ``context``: the longest prompt + answer (cut to what the models allow).
    ``decode_thread``: decode on a thread of its own; False: the caller runs ``server.scheduler.run()``
    (``run_forever`` does, on the main thread: see ``Scheduler.run`` for why). ``allow_origins``: web
    origins (or "*") whose pages may call it (``Access``)."""
    scheduler = Scheduler(target, tok, drafter, spec, slots, context)
    server = D3DServer((host, port), scheduler.start() if decode_thread else scheduler, model_name, quiet,
                       allow_origins)
    server.thread = threading.Thread(target=server.serve_forever, name="d3d-http", daemon=True)
    server.thread.start()
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


__all__ = ["serve", "run_forever", "D3DServer", "Access", "model_name", "PAGE", "MAX_CONNECTIONS", "MAX_REQUESTS"]
