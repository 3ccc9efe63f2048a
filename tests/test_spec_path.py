"""The spec's path to a round (docs/design.md §6): from the CLI's command and from an HTTP request, the files
whose functions are handed the spec, in the order they are called, each file once (issue 48)."""

import argparse
import http.client
import inspect
import json
import re
import sys
import threading
from pathlib import Path

import pytest

import d3d
from d3d.__main__ import main
from d3d.assets import BUNDLED_DRAFTER, models_dir
from d3d.decode.config import MODES, SpecConfig

pytestmark = pytest.mark.skipif(not (models_dir() / BUNDLED_DRAFTER / "config.json").exists(),
                                reason="bundled drafter not trained yet")

PACKAGE = Path(d3d.__file__).resolve().parent
DESIGN = PACKAGE.parent / "docs" / "design.md"
STARTS = ("cmd_generate", "D3DServer.complete")  # the command, the route
CLI = ["d3d/__main__.py", "d3d/draft/pick.py", "d3d/decode/engines.py", "d3d/decode/config.py",
       "d3d/decode/speculative.py"]
HTTP = ["d3d/serve/server.py", "d3d/serve/protocol.py", "d3d/draft/pick.py", "d3d/serve/scheduler.py",
        "d3d/decode/config.py", "d3d/decode/speculative.py"]


def handed_the_spec(value) -> bool:
    """The spec in one of its forms: the parsed flags, a mode, a checked request, a SpecConfig."""
    from d3d.serve.protocol import Request

    if isinstance(value, tuple):
        return any(handed_the_spec(v) for v in value)
    return (isinstance(value, (SpecConfig, Request)) or (isinstance(value, str) and value in MODES)
            or (isinstance(value, argparse.Namespace) and hasattr(value, "spec")))


class PathRecorder:
    """A profile hook (every thread): from a start on, the d3d functions called with the spec or returning
    it, until the first ``SpeculativeDecoder.step``. Resumed coroutines are not new calls."""

    def __init__(self):
        self.calls, self.open, self.seen = [], {}, {}
        self.started, self.done = threading.Event(), threading.Event()

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if self.done.is_set() or not code.co_filename.startswith(str(PACKAGE)):
            return
        if event == "return" and id(frame) in self.open:
            call = self.open.pop(id(frame))
            call[2] = call[2] or handed_the_spec(arg)
        if event != "call":
            return
        if code.co_flags & inspect.CO_COROUTINE:
            if id(frame) in self.seen:  # resumed
                return
            self.seen[id(frame)] = frame  # kept: no other frame takes its id
        if code.co_qualname in STARTS:
            self.started.set()
        if self.started.is_set():
            args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
            end = code.co_qualname == "SpeculativeDecoder.step"
            call = [Path(code.co_filename).relative_to(PACKAGE.parent).as_posix(), code.co_qualname,
                    end or code.co_qualname in STARTS or any(map(handed_the_spec, args))]
            self.calls.append(call)
            self.open[id(frame)] = call
            if end:
                self.done.set()

    def path(self) -> list[str]:
        return [f"{file} {name}" for file, name, handed in self.calls if handed]

    def files(self) -> list[str]:
        """The files of the path, a file again only when the path comes back to it."""
        out = []
        for file, _, handed in self.calls:
            if handed and (not out or out[-1] != file):
                out.append(file)
        return out


def recording(fn):
    rec = PathRecorder()
    sys.setprofile(rec)
    threading.setprofile(rec)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert rec.done.is_set(), "no SpeculativeDecoder.step was reached"
    return rec


def documented(label: str) -> list[str]:
    """The files design.md lists, in order, on the path item that starts with ``label``."""
    item = re.search(rf"^- `{re.escape(label)}`:(.*?)(?=^- |^$)", DESIGN.read_text(), re.M | re.S).group(1)
    return re.findall(r"`(d3d/[\w/]+\.py)`", item)


def test_cli_spec_reaches_the_round_through_five_files_once(capsys):
    rec = recording(lambda: main(["generate", "--prompt", "def f():", "--max-new-tokens", "4", "--json",
                                  "--spec", "sync lookup=0", "--leaves", "1"]))
    assert json.loads(capsys.readouterr().out)["spec"] == "sync lookup=0 leaves=1"
    assert rec.files() == CLI == documented("python -m d3d generate"), rec.path()


def test_http_spec_reaches_the_round_through_six_files_once():
    pytest.importorskip("h11", reason="d3d serve's HTTP layer is in the serve extra (and the test extra)")
    from helpers import bundled_server

    box = {}

    def request():
        box["server"] = server = bundled_server()[0]  # profiled from its start: its threads are
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=120)
        body = {"messages": [{"role": "user", "content": "def f():"}], "max_tokens": 4, "d3d_mode": "sync"}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        box["status"] = conn.getresponse().status

    try:
        rec = recording(request)
    finally:
        if "server" in box:
            box["server"].drain(timeout=60)
    assert box["status"] == 200
    assert rec.files() == HTTP == documented("POST /v1/chat/completions"), rec.path()
