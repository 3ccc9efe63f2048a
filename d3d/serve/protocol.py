"""The OpenAI chat/completions wire format: requests checked field by field, responses and stream chunks.

Every malformed request becomes an ``ApiError`` (a 4xx with an OpenAI-style error body that names
the field), never a 500, and is refused before anything costly: JSON that is not JSON, nests deeper
than ``MAX_DEPTH`` or holds NaN/Infinity; numbers out of range (a 400-digit integer is a number out of
range, not an overflow); text that is not valid Unicode (a lone surrogate such as ``"\\ud800"``); an
unknown model; missing or mistyped fields; ``max_tokens`` <= 0 or past the context; more than
``MAX_STOPS`` stop strings or one longer than ``MAX_STOP_CHARS``; a prompt of more bytes than the
context can hold (checked before tokenizing: ``d3d.serve.prompt``), then of more tokens. A temperature
in (0, ``TEMPERATURE_FLOOR``) is decoded at the floor (below it ``logits / T`` overflows float32; vLLM
clamps the same way). Fields this server does not implement are refused when set to anything but their
neutral value (``n``, ``best_of``, ``echo``, ``logprobs``, ...: ``UNSUPPORTED``), never ignored; other
unknown fields are ignored, as OpenAI's servers do with fields they do not use.
"""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field

from ..decode.config import Sampling
from ..draft.pick import decide_mode

MAX_BODY = 16 << 20  # bytes of a request body
MAX_DEPTH = 32  # nesting of the request's JSON
MAX_STOPS, MAX_STOP_CHARS = 4, 256  # OpenAI's limit of stop strings; the length of each
TEMPERATURE_FLOOR = 0.01  # 0 < T < this decodes at this
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # OpenAI's seed is an int64
# fields OpenAI defines that this server does not implement, with the values that ask for nothing
UNSUPPORTED = {"n": (1,), "best_of": (1,), "echo": (False,), "logprobs": (False, None), "top_logprobs": (0, None),
               "logit_bias": ({},), "presence_penalty": (0,), "frequency_penalty": (0,), "suffix": ("", None),
               "tools": ([],), "functions": ([],), "response_format": ({"type": "text"},)}


class ApiError(Exception):
    """A request the server refuses: ``status`` and an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass
class Request:
    """One checked request: what to decode and how to answer."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    explain: bool = False  # the ``d3d`` extension: per-round information on the stream
    mode: str = "ar"  # what it decodes in: its ``d3d_mode`` (ar, sync, async), else the server's (``decide_mode``)
    id: str = field(default_factory=lambda: "d3d-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse(body: bytes, chat: bool, model_name: str, prompts, max_positions: int,
          modes=("ar", "sync", "async"), server_mode: str = "ar") -> Request:
    """``body`` of a POST to /v1/chat/completions (``chat``) or /v1/completions, checked; ``prompts``: a
    ``d3d.serve.prompt.PromptEncoder``; ``max_positions``: the server's context (prompt + answer);
    ``modes``: what ``d3d_mode`` may ask for; ``server_mode``: the mode of a request that asks for none.
    Every check comes before tokenizing; the request's mode is decided here (``decide_mode``: ar for a
    truncated sampling)."""
    raw = loads(body)
    model = _text(raw, "model", required=False)
    if model is not None and model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model",
                       "model_not_found")
    for name, neutral in UNSUPPORTED.items():
        value = raw.get(name)
        if value is not None and not any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral):
            raise ApiError(400, f"{name}={_show(value)}: not supported by d3d serve (one choice per request, "
                           f"no log-probabilities, echo or penalties); leave it out", name)
    messages = _messages(raw) if chat else None
    prompt = None if chat else _text(raw, "prompt", required=True)
    if prompt == "":
        raise ApiError(400, "prompt: must not be empty", "prompt")
    limit = "max_completion_tokens" if "max_completion_tokens" in raw else "max_tokens"
    max_tokens = _number(raw, limit, 1, max_positions - 1, 256, integer=True)
    temperature = _number(raw, "temperature", 0, 2, 0.0)
    top_p = _number(raw, "top_p", 0, 1, 1.0, open_low=True)
    seed = _number(raw, "seed", *SEED_RANGE, None, integer=True)
    seed = secrets.randbits(63) if seed is None else seed  # no seed: a sample of its own, as OpenAI's
    stop = _stops(raw)
    mode = _text(raw, "d3d_mode", required=False)
    if mode is not None and mode not in modes:
        raise ApiError(400, f"d3d_mode={mode!r}: this server decodes {', '.join(modes)}", "d3d_mode")
    stream = bool(_get(raw, "stream", bool, required=False, default=False))
    explain = bool(_get(raw, "d3d", bool, required=False, default=False))
    ids = _prompt_ids(prompts, messages, prompt, max_positions)
    if len(ids) + max_tokens > max_positions:
        raise ApiError(400, f"{limit}={max_tokens} with a prompt of {len(ids)} tokens exceeds the context of "
                       f"{max_positions} tokens", limit)
    if 0 < temperature < TEMPERATURE_FLOOR:
        temperature = TEMPERATURE_FLOOR
    sampling = Sampling(float(temperature), None, None if top_p == 1 else float(top_p), seed)
    mode = decide_mode(mode, default=server_mode, sampling=sampling)
    return Request(chat, ids, max_tokens, sampling, stop, stream, explain, mode=mode)


def loads(body: bytes) -> dict:
    """The request's JSON object: numbers too large for their digits become floats (then out of range,
    never an overflow), NaN and Infinity floats a field check refuses, nesting bounded."""
    try:
        raw = json.loads(body or b"", parse_constant=float, parse_int=lambda s: int(s) if len(s) <= 20 else float(s))
    except RecursionError:
        raise ApiError(400, f"the request body nests too deep; at most {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _depth(raw) > MAX_DEPTH:
        raise ApiError(400, f"the request body nests too deep; at most {MAX_DEPTH} levels")
    return raw


def _depth(value, level: int = 1) -> int:
    """How deep ``value`` nests, counted up to just past ``MAX_DEPTH``."""
    if level > MAX_DEPTH or not isinstance(value, (dict, list)):
        return level - (not isinstance(value, (dict, list)))
    items = value.values() if isinstance(value, dict) else value
    return max((_depth(v, level + 1) for v in items), default=level)


def _prompt_ids(prompts, messages: list[dict] | None, prompt: str | None, max_positions: int) -> list[int]:
    """The prompt's ids: its size checked in bytes (before tokenizing), then in tokens."""
    name = "messages" if messages is not None else "prompt"
    size = sum(len(m["content"].encode()) for m in messages) if messages is not None else len(prompt.encode())
    if size > prompts.max_bytes:
        raise ApiError(400, f"{name}: {size} bytes of text; {max_positions} tokens (this server's context) hold at "
                       f"most {prompts.max_bytes}", name)
    ids = prompts.chat(messages) if messages is not None else prompts.text(prompt)
    if len(ids) >= max_positions:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this server's context is {max_positions}", name)
    return ids


def _messages(raw: dict) -> list[dict]:
    messages = _get(raw, "messages", list, required=True)
    if not messages:
        raise ApiError(400, "messages: must hold at least one message", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ApiError(400, f"messages[{i}]: expected an object with role system, user or assistant",
                           f"messages[{i}].role")
        content, name = m.get("content"), f"messages[{i}].content"
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"{name}: only text parts are supported", name)
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"{name}: expected a string", name)
        out.append({"role": m["role"], "content": _unicode(content, name)})
    return out


def _stops(raw: dict) -> list[str]:
    stop = raw.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOPS:
        raise ApiError(400, f"stop: must be a non-empty string or a list of up to {MAX_STOPS} of them", "stop")
    for s in stop:
        if len(s) > MAX_STOP_CHARS:
            raise ApiError(400, f"stop: a stop string of {len(s)} characters; at most {MAX_STOP_CHARS}", "stop")
        _unicode(s, "stop")
    return stop


def _get(raw: dict, name: str, kind, required: bool, default=None):
    if name not in raw or raw[name] is None:
        if required:
            raise ApiError(400, f"{name}: this field is required", name)
        return default
    value = raw[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ApiError(400, f"{name}: expected {names}, got {type(value).__name__}", name)
    return value


def _number(raw: dict, name: str, lo, hi, default, integer: bool = False, open_low: bool = False):
    """Field ``name``: a finite number in [lo, hi] ((lo, hi] with ``open_low``), an integer if ``integer``."""
    value = _get(raw, name, int if integer else (int, float), required=False, default=default)
    if value is None:
        return None
    if not math.isfinite(value) or not (lo < value if open_low else lo <= value) or value > hi:
        what = "an integer" if integer else "a number"
        raise ApiError(400, f"{name}={_show(value)}: must be {what} in {'(' if open_low else '['}{lo}, {hi}]", name)
    return value


def _text(raw: dict, name: str, required: bool) -> str | None:
    value = _get(raw, name, str, required=required)
    return None if value is None else _unicode(value, name)


def _unicode(text: str, name: str) -> str:
    """``text`` if it is valid Unicode (JSON's escapes can spell a lone surrogate, which is not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(400, f"{name}: not valid Unicode ({e.reason} at character {e.start})", name) from None
    return text


def _show(value) -> str:
    """A field's value for an error message, cut short."""
    text = json.dumps(value, ensure_ascii=True) if isinstance(value, (dict, list, str)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def response(req: Request, model: str, text: str, finish: str, completion_tokens: int) -> dict:
    """The non-streamed answer."""
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
              if req.chat else {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
    return {"id": req.id, "object": "chat.completion" if req.chat else "text_completion", "created": req.created,
            "model": model, "choices": [choice], "usage": usage(req, completion_tokens)}


def chunk(req: Request, model: str, text: str | None, finish: str | None = None, extra: dict | None = None,
          first: bool = False) -> dict:
    """One server-sent event of a streamed answer (``extra``: the ``d3d`` extension field)."""
    if req.chat:
        delta = ({"role": "assistant", "content": ""} if first else {}) | ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
    out = {"id": req.id, "object": "chat.completion.chunk" if req.chat else "text_completion", "created": req.created,
           "model": model, "choices": [choice]}
    if extra is not None:
        out["d3d"] = extra
    return out


def usage(req: Request, completion_tokens: int) -> dict:
    return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": completion_tokens,
            "total_tokens": len(req.prompt_ids) + completion_tokens}


__all__ = ["ApiError", "Request", "parse", "response", "chunk", "usage"]
