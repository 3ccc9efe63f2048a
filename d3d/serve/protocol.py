"""The OpenAI chat/completions wire format: requests checked field by field, responses and stream chunks.

Every malformed request becomes an ``ApiError`` (a 4xx with an OpenAI-style error body that names
the field), never a 500: wrong JSON, unknown model, missing or mistyped fields, ``max_tokens`` <= 0
or past the context, a prompt longer than the context. Unknown fields are ignored, as OpenAI's
servers do with fields they do not use.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..decode.config import Sampling


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
    mode: str | None = None  # the ``d3d_mode`` extension: ar, sync or async (None: the server's)
    id: str = field(default_factory=lambda: "d3d-" + uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def parse(body: bytes, chat: bool, model_name: str, tok, max_positions: int, modes=("ar", "sync", "async")) -> Request:
    """``body`` of a POST to /v1/chat/completions (``chat``) or /v1/completions, checked; ``max_positions``:
    the server's context (prompt + answer), ``modes``: what ``d3d_mode`` may ask for."""
    try:
        raw = json.loads(body or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = _get(raw, "model", str, required=False)
    if model is not None and model != model_name:
        raise ApiError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model",
                       "model_not_found")
    if chat:
        ids = tok.encode_chat(_messages(raw))
    else:
        prompt = _get(raw, "prompt", str, required=True)
        if not prompt:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        ids = tok.encode(prompt)
    max_tokens = _get(raw, "max_completion_tokens" if "max_completion_tokens" in raw else "max_tokens", int,
                      required=False, default=256)
    if max_tokens <= 0:
        raise ApiError(400, f"max_tokens={max_tokens}: must be at least 1", "max_tokens")
    if len(ids) >= max_positions:
        raise ApiError(400, f"the prompt has {len(ids)} tokens; this server's context is {max_positions}",
                       "messages" if chat else "prompt")
    if len(ids) + max_tokens > max_positions:
        raise ApiError(400, f"max_tokens={max_tokens} with a prompt of {len(ids)} tokens exceeds the context of "
                       f"{max_positions} tokens", "max_tokens")
    temperature = float(_get(raw, "temperature", (int, float), required=False, default=0.0))
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"temperature={temperature}: must be in [0, 2]", "temperature")
    top_p = _get(raw, "top_p", (int, float), required=False, default=1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"top_p={top_p}: must be in (0, 1]", "top_p")
    seed = _get(raw, "seed", int, required=False, default=0)
    stop = raw.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise ApiError(400, "stop: must be a non-empty string or a list of up to 4 of them", "stop")
    mode = _get(raw, "d3d_mode", str, required=False)
    if mode is not None and mode not in modes:
        raise ApiError(400, f"d3d_mode={mode!r}: this server decodes {', '.join(modes)}", "d3d_mode")
    return Request(chat, ids, max_tokens, Sampling(temperature, None, None if top_p == 1 else float(top_p), seed),
                   stop, bool(_get(raw, "stream", bool, required=False, default=False)),
                   bool(_get(raw, "d3d", bool, required=False, default=False)), mode=mode)


def _messages(raw: dict) -> list[dict]:
    messages = _get(raw, "messages", list, required=True)
    if not messages:
        raise ApiError(400, "messages: must hold at least one message", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ApiError(400, f"messages[{i}]: expected an object with role system, user or assistant",
                           f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: expected a string", f"messages[{i}].content")
        out.append({"role": m["role"], "content": content})
    return out


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
