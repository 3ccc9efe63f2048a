"""HTTP/1.1 connections for ``d3d serve``: h11 parses and frames, this file bounds.

Every request is answered with a status, and a client cannot hold the server:

- a request (head and body) must arrive within ``Limits.read_seconds`` of its first byte (a whole-request
  deadline, not a per-read one: a byte every 100 s does not keep it alive), else 408; a connection
  waiting for its next request is closed after ``Limits.idle_seconds``;
- the body's size comes from a Content-Length h11 has checked (negative, not a number, two that
  differ: 400); a POST without one is 411 (chunked bodies included), one over ``Limits.max_body`` 413,
  a head over 64 KiB 431, before any of the body is read;
- after any answer that leaves request bytes unread the connection is closed (a body is never read
  as the next request), lingering to read and drop what the client still sends for up to
  ``LINGER_SECONDS`` so that it sees the answer and not a reset;
- a client that reads nothing for ``Limits.write_seconds`` is dropped, as is one that hangs up.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

try:
    import h11
except ImportError:  # an optional dependency: the server's only one
    raise ImportError("d3d serve needs h11 for HTTP/1.1: pip install 'd3d[serve]' (or h11)") from None

MAX_HEAD = 64 << 10  # bytes of a request line and headers
LINGER_SECONDS = 2.0  # reading and dropping a refused request's rest before closing
REASONS = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           411: "Length Required", 413: "Content Too Large", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


@dataclass
class Limits:
    max_body: int = 16 << 20  # bytes of a request body
    read_seconds: float = 30.0  # a whole request, from its first byte
    idle_seconds: float = 15.0  # a kept-alive connection waiting for its next request
    write_seconds: float = 30.0  # a client that reads nothing this long is gone


class HttpError(Exception):
    """A request answered with ``status`` and an OpenAI-style error body; the connection then closes."""

    def __init__(self, status: int, message: str, headers: list | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []


class Gone(Exception):
    """The client hung up, or stopped reading."""


@dataclass
class Incoming:
    """One request, whole: ``headers`` by lower-case name (repeated ones joined with ", ")."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


def error_body(status: int, message: str) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


class Connection:
    """One client connection: ``request`` reads the next request within the limits, ``send`` and
    ``stream`` answer it, ``close`` ends it (lingering where request bytes may be left unread)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits):
        self.reader, self.writer, self.limits = reader, writer, limits
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.busy = False  # a request is being answered (not to be evicted)
        self.waiting_since = time.monotonic()  # when it began waiting for its current request
        self.started = False  # a byte of the current request has arrived
        self.evicted = False  # closed to make room for a newcomer

    async def request(self) -> Incoming | None:
        """The next request, whole; None when the client closed, or idled out, between requests.
        Raises ``HttpError`` for a request to refuse (answer it with ``refuse``)."""
        self.waiting_since, self.started, head, body = time.monotonic(), bool(self.h.trailing_data[0]), None, []
        while True:
            try:
                event = self.h.next_event()
            except h11.RemoteProtocolError as e:
                raise HttpError(e.error_status_hint, f"malformed HTTP request: {e}") from None
            if event is h11.NEED_DATA:
                await self._receive()
            elif isinstance(event, h11.Request):
                head = self._checked(event)
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.busy = True
                return Incoming(head[0], head[1], head[2], b"".join(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _receive(self) -> None:
        """More bytes, before the request's deadline (an idle connection's: ``idle_seconds`` from when it
        began waiting, then ``read_seconds`` from the first byte)."""
        if self.started:
            left = self.waiting_since + self.limits.read_seconds - time.monotonic()
        else:
            left = self.waiting_since + self.limits.idle_seconds - time.monotonic()
        try:
            data = await asyncio.wait_for(self.reader.read(65536), max(left, 0.0))
        except asyncio.TimeoutError:
            if self.started:
                raise HttpError(408, f"the request did not arrive whole within {self.limits.read_seconds:g} s") from None
            data = b""  # idle too long: closed as if by the client
        except ConnectionError:
            data = b""
        if data and not self.started:
            self.started, self.waiting_since = True, time.monotonic()
        self.h.receive_data(data)

    def _checked(self, event: h11.Request) -> tuple[str, str, dict[str, str]]:
        """The request head, its body's framing checked before any of the body is read."""
        headers: dict[str, str] = {}
        for name, value in event.headers:
            name, value = name.decode("latin-1"), value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        method = event.method.decode("latin-1")
        if "transfer-encoding" in headers:
            raise HttpError(411, f"Transfer-Encoding: {headers['transfer-encoding']}: not accepted; send the body "
                                 "with a Content-Length")
        length = int(headers.get("content-length", -1))  # h11 checked it: digits only
        if length < 0 and method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            raise HttpError(411, f"{method} without a Content-Length: send the body's length")
        if length > self.limits.max_body:
            raise HttpError(413, f"Content-Length: {length}: the request body may be at most {self.limits.max_body} "
                                 "bytes")
        if self.h.they_are_waiting_for_100_continue:
            self._write(h11.InformationalResponse(status_code=100, headers=[]))
        return method, event.target.decode("latin-1"), headers

    async def send(self, status: int, content_type: str, body: bytes, headers: list | None = None,
                   close: bool = False) -> None:
        """A whole answer (``close``: then the connection closes)."""
        head = [("Content-Type", content_type), ("Content-Length", str(len(body)))] + (headers or [])
        if close:
            head.append(("Connection", "close"))
        self._write(h11.Response(status_code=status, headers=head, reason=REASONS.get(status, "")))
        self._write(h11.Data(data=body))
        self._write(h11.EndOfMessage())
        await self._flush()

    async def start_stream(self, headers: list) -> None:
        """A 200 whose body follows in ``stream_part``s (chunked) until ``end_stream``."""
        self._write(h11.Response(status_code=200, headers=headers))
        await self._flush()

    async def stream_part(self, data: bytes) -> None:
        self._write(h11.Data(data=data))
        await self._flush()

    async def end_stream(self) -> None:
        self._write(h11.EndOfMessage())
        await self._flush()

    async def refuse(self, e: HttpError) -> None:
        """Answer ``e`` and close (its request, or what is left of it, unread)."""
        body = error_body(e.status, e.message)
        try:
            if self.h.their_state is not h11.IDLE and self.h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self.send(e.status, "application/json", body, e.headers, close=True)
            elif self.h.our_state is h11.IDLE:  # no request head parsed (a deadline, a full server): h11 has
                self.writer.write(raw_response(e.status, body, e.headers))  # nothing to answer; a few fixed bytes
                await self._flush()
        except Gone:
            pass
        await self.close(linger=True)

    async def watch(self) -> None:
        """Return when the client hangs up (bytes it sends meanwhile are kept for the next request, up to a
        head's worth; past that it is not read until then)."""
        while len(self.h.trailing_data[0]) < MAX_HEAD:
            try:
                data = await self.reader.read(65536)
            except ConnectionError:
                return
            if not data:
                return
            self.h.receive_data(data)
        await asyncio.Event().wait()  # never: the caller cancels this when its answer is done

    def next_cycle(self) -> bool:
        """Ready for the next request on this connection (False: it must close)."""
        self.busy = False
        if self.h.our_state is h11.DONE and self.h.their_state is h11.DONE:
            self.h.start_next_cycle()
            return True
        return False

    async def close(self, linger: bool = False) -> None:
        """Close; with ``linger``, first read and drop what the client still sends (for up to
        ``LINGER_SECONDS``), so that it reads the answer instead of a reset."""
        if linger and self.writer.can_write_eof() and not self.writer.is_closing():
            try:
                self.writer.write_eof()
                end = time.monotonic() + LINGER_SECONDS
                while time.monotonic() < end and await asyncio.wait_for(self.reader.read(1 << 16),
                                                                        end - time.monotonic()):
                    pass
            except (asyncio.TimeoutError, ConnectionError, OSError):
                pass
        self.writer.close()

    def _write(self, event) -> None:
        self.writer.write(self.h.send(event))

    async def _flush(self) -> None:
        try:
            await asyncio.wait_for(self.writer.drain(), self.limits.write_seconds)
        except (asyncio.TimeoutError, ConnectionError) as e:
            raise Gone(type(e).__name__) from None


def raw_response(status: int, body: bytes, headers: list | None = None) -> bytes:
    """A whole answer that closes the connection, for a client no request of which was parsed."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, '')}", "Content-Type: application/json",
             f"Content-Length: {len(body)}", "Connection: close"] + [f"{k}: {v}" for k, v in headers or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


__all__ = ["Connection", "Limits", "HttpError", "Gone", "Incoming", "raw_response", "error_body", "MAX_HEAD"]
