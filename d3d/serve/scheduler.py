"""The decoding loop of ``d3d serve``: concurrent requests decode together, joining and leaving
between rounds.

Each request is a ``Sequence`` (``d3d.decode.sequence``) made when it is submitted, in the mode its
checked request carries (``d3d.serve.protocol.parse`` asks ``d3d.draft.pick.decide_mode``). Requests
are grouped by mode alone (ar, sync, async): a group is one decoder
(``d3d.decode.speculative.SpeculativeDecoder``, its spec resolved once when the group is made, or
``d3d.decode.engines.ArDecoder``) with ``slots`` cache rows of ``context`` tokens, and each sequence
samples as its request asks (temperature, top_p, seed: its own ``Sampling``), so a greedy request never
waits behind sampled ones. The loop goes round the groups; for each it

    1 drops the rows whose client went away (streamed or not), then admits waiting requests into its
      free rows (speculative: one prefill pass for all of them; ar: read in the step's own pass),
    2 runs one round (speculative) or step (ar) over every row in flight,
    3 hands each request the tokens its sequence committed (a text delta, and with the ``d3d``
      extension what the round did), and frees the rows of requests that ended: length, stop token,
      stop string, or a client that went away.

A group with nothing to do keeps its caches for ``IDLE_SECONDS`` (allocating them per request cost 7%
of the time), then they are released. A decoding error answers that group's requests with a 500 and
drops the group; the others go on. Greedy answers equal ``d3d.generate``'s on the prompt alone (fp32;
in low precision up to near-ties, as in any batching: the batch around a row changes its last bits).
Sampled answers follow the target's distribution at each row's temperature; ``seed`` seeds the row's
own stream, which repeats an ar answer and not a speculative one (its acceptance streams are keyed by
the group's round and the batch around it).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque

from ..decode.config import SpecConfig, resolved_spec
from ..decode.engines import ArDecoder
from ..decode.sequence import Sequence
from ..decode.sources import Origin
from ..decode.speculative import SpeculativeDecoder
from .protocol import Request


IDLE_SECONDS = 30.0  # a group idle this long releases its caches (slots x context each)


class Job:
    """One request: its events (("text", delta, info) ..., then ("done", finish, n) or ("error", message, status)),
    whether its client has gone, the ``Sequence`` that decodes it, and what the loop has sent of it."""

    def __init__(self, req: Request, mode: str, seq: Sequence, tok, events=None):
        """``events``: where the events go (anything with ``put``; default a ``queue.Queue``)."""
        self.req, self.mode, self.seq, self.cancelled = req, mode, seq, threading.Event()
        self.events = queue.Queue() if events is None else events
        self.text = TextStream(tok, req.stop)
        self.sent = 0  # output tokens handed to the text stream so far
        self.before = 0  # output tokens before the current round (the round's own come after them)
        self.info: dict | None = None  # what the current round did (the d3d extension)


class Group:
    """Requests decoding with one decoder: ``jobs`` in flight by their sequence's id, and those waiting."""

    def __init__(self, decoder, slots: int):
        self.decoder, self.slots, self.jobs, self.waiting = decoder, slots, {}, deque()
        self.busy_at = time.monotonic()  # when it last had something to do

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.jobs


class Scheduler:
    """The decoding loop (``run``, or ``start`` for a thread of its own): ``submit`` a checked request, read
    its ``Job.events``."""

    def __init__(self, target, tok, drafter, spec: SpecConfig, slots: int = 16, context: int = 2048):
        """``drafter``: a D3D drafter (requests may ask for ar, sync or async) or None (ar only);
        ``context``: the longest prompt + answer, cut to what the models' positions allow."""
        from ..draft.drafter import Drafter

        if slots <= 0 or context <= 0:
            raise ValueError(f"slots={slots}, context={context}: both must be positive")
        if spec.mode not in ("ar", "sync", "async"):
            raise ValueError(f"mode={spec.mode!r}: d3d serve decodes ar, sync and async")
        if spec.mode != "ar" and not isinstance(drafter, Drafter):
            raise ValueError(f"mode={spec.mode!r} needs a D3D drafter, got {type(drafter).__name__}")
        self.modes = ("ar", "sync", "async") if isinstance(drafter, Drafter) else ("ar",)
        limit = target.cfg.max_position_embeddings
        if isinstance(drafter, Drafter):  # a round reaches up to two blocks past the committed tokens
            limit = min(limit, drafter.cfg.max_position_embeddings) - 2 * drafter.block_size - 2
        self.target, self.tok, self.drafter, self.spec, self.slots, self.context = (
            target, tok, drafter, spec, slots, min(context, limit))
        self.stop_ids = frozenset(tok.stop_token_ids()) | frozenset(target.cfg.eos_token_ids)
        self.ids = itertools.count()  # each request's Sequence id
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.groups: dict[str, Group] = {}  # by mode
        self.abandoned = 0  # requests ended early, or never begun, because their client went away
        self.peak = 0  # the most requests one round decoded together
        self.stop, self.closed, self.lock, self.thread = threading.Event(), False, threading.Lock(), None
        self.idle_seconds = IDLE_SECONDS

    def submit(self, req: Request, events=None) -> Job:
        """Queue ``req`` for decoding in its mode; its events go to ``events`` (``Job``)."""
        seq = Sequence(req.prompt_ids, req.max_tokens, req.sampling, self.stop_ids, id=next(self.ids))
        job = Job(req, req.mode, seq, self.tok, events)
        with self.lock:
            if self.closed:
                job.events.put(("error", "the server is shutting down", 503))
            else:
                self.jobs.put(job)
        return job

    def start(self) -> "Scheduler":
        """Decode on a thread of its own (``run`` decodes on the calling thread)."""
        self.thread = threading.Thread(target=self.run, name="d3d-decode", daemon=True)
        self.thread.start()
        return self

    def close(self) -> None:
        """Finish every request already submitted, then end ``run`` (and its thread)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def run(self) -> None:
        """Decode until ``stop`` is set and every request taken is answered. Run it on the thread that
        loaded the models where it matters: once two threads have run torch's OpenMP work, each op of
        the second costs several times as much on a 2-core CPU (libgomp's thread pools; docs/design.md
        §9), which is why ``d3d serve`` decodes on its main thread."""
        while not (self.stop.is_set() and self.idle() and self.jobs.empty()):
            arrived = []
            if self.idle():  # nothing in flight: wait for a request (and look at ``stop`` now and then)
                self.release_idle()
                try:
                    arrived.append(self.jobs.get(timeout=0.2))
                except queue.Empty:
                    continue
            while True:
                try:
                    arrived.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            for job in arrived:
                if job.cancelled.is_set():
                    self.abandoned += 1
                else:
                    self.group_of(job.mode).waiting.append(job)
            for group in list(self.groups.values()):
                if not group.idle:
                    self.round(group)
            self.release_idle()
        for group in self.groups.values():
            group.decoder.close()
        with self.lock:
            self.closed = True
        while not self.jobs.empty():  # submitted while the last rounds ran: refused
            self.jobs.get().events.put(("error", "the server is shutting down", 503))

    def idle(self) -> bool:
        return all(group.idle for group in self.groups.values())

    def release_idle(self) -> None:
        """Close the groups that have had nothing to do for ``idle_seconds``: their caches are freed."""
        now = time.monotonic()
        for mode in [m for m, g in self.groups.items() if g.idle and now - g.busy_at > self.idle_seconds]:
            self.groups.pop(mode).decoder.close()

    def group_of(self, mode: str) -> Group:
        """The group decoding ``mode``, made on first use."""
        if mode not in self.groups:
            self.groups[mode] = Group(self.decoder(mode), self.slots)
        return self.groups[mode]

    def decoder(self, mode: str):
        if mode == "ar":
            return ArDecoder(self.target, self.slots, self.context)

        def on_round(r) -> None:
            job = self.groups[mode].jobs[r.seq]
            if job.req.explain:
                job.info = round_info(self.tok, job, r)

        chain = self.spec.draft_model if mode == "sync" else None  # a draft model's chains are a sync source
        spec = resolved_spec(self.target, self.drafter, self.spec.replace(mode=mode, draft_model=chain))
        return SpeculativeDecoder(self.target, self.drafter, spec, self.slots, self.context, on_round=on_round)

    def round(self, group: Group) -> None:
        """Steps 1-3 of the module docstring for one group."""
        dec, group.busy_at = group.decoder, time.monotonic()
        for job in [j for j in group.jobs.values() if j.cancelled.is_set()]:
            dec.drop(job.seq)
            del group.jobs[job.seq.id]
            self.abandoned += 1
        admitted = []
        while len(group.jobs) < group.slots and group.waiting:
            job = group.waiting.popleft()
            if job.cancelled.is_set():
                self.abandoned += 1
            else:
                group.jobs[job.seq.id] = job
                admitted.append(job.seq)
        self.peak = max(self.peak, len(group.jobs))
        try:
            if admitted:
                dec.admit(admitted)
            for job in group.jobs.values():
                job.before = job.seq.num_output
            dec.step()
        except Exception as e:  # a bug must not kill the server: these requests get a 500, the others go on
            for job in list(group.jobs.values()) + list(group.waiting):
                job.events.put(("error", f"{type(e).__name__}: {e}", 500))
            self.groups = {m: g for m, g in self.groups.items() if g is not group}
            group.decoder.close()  # its caches may be half written
            return
        for job in list(group.jobs.values()):
            if self.deliver(job, dec):
                del group.jobs[job.seq.id]

    def deliver(self, job: Job, dec) -> bool:
        """Send ``job`` what its sequence committed since the last delivery; True when it has ended (its row
        is free)."""
        seq = job.seq
        new = seq.output_since(job.sent)
        if new:
            job.sent += len(new)
            delta = job.text.add(new)  # its ids now end with new
            if job.req.explain:  # each token's text and origin: "step" for the prefill's token and ar steps
                # the round's own tokens are the last; the output may end inside the round
                mine = job.info["origins"][:seq.num_output - job.before] if job.info else []
                info = job.info or {}
                origins = ["step"] * (len(new) - len(mine)) + mine
                texts = pieces(self.tok, job.text.ids, len(new))
                info["tokens"] = [{"text": t, "origin": o} for t, o in zip(texts, origins)]
                info.pop("origins", None)
                job.events.put(("text", delta, info))
            elif delta:
                job.events.put(("text", delta, None))
            job.info = None
        if job.text.stopped:
            dec.drop(seq)
        elif not seq.done:
            return False
        tail = job.text.flush()
        if tail:
            job.events.put(("text", tail, None))
        finish = "stop" if job.text.stopped or seq.stopped else "length"
        job.events.put(("done", finish, job.text.count))
        return True


def round_info(tok, job: Job, r) -> dict:
    """What the round ``r`` (a ``RoundInfo``) did for ``job``: its draft, how much of it the target
    accepted, each committed token's origin (the draft's source, ``leaf``, ``bonus``), the rejected
    rest of the draft, and the request's tau so far."""
    source = "copy" if r.origin is Origin.LOOKUP else r.origin.value if r.draft else "drafter"
    origins = [source] * (len(r.committed) - 1) + ["bonus" if r.draft else "step"]  # no draft: a plain step
    if r.leaf is not None:
        origins[-2] = "leaf"
    return {"round": r.round, "draft": [tok.decode([t]) for t in r.draft], "accepted": r.accepted, "bonus": r.bonus,
            "leaf": r.leaf, "source": source, "hypothesis_hit": r.hit, "origins": origins,
            "rejected": tok.decode(r.draft[r.accepted:], skip_special_tokens=True) if r.leaf is None else "",
            "tau": job.seq.tally.tau}


def pieces(tok, ids: list[int], n: int) -> list[str]:
    """The text each of the last ``n`` of ``ids`` adds (a character split over tokens shows at its end);
    decoded from a few tokens before them only (byte-level BPE: a character is at most 4 tokens)."""
    w = max(0, len(ids) - n - 4)
    out, before = [], tok.decode(ids[w:len(ids) - n], skip_special_tokens=True)
    for k in range(len(ids) - n + 1, len(ids) + 1):
        text = tok.decode(ids[w:k], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            out.append("")
            continue
        out.append(text[len(before):])
        before = text
    return out


class TextStream:
    """Token ids -> text deltas, in time proportional to the new tokens (plus the held-back text):
    decodes the ids from the last clean character boundary on only, holds back an incomplete UTF-8
    character and any end of the text that may begin a stop string; ``stopped`` once a stop string
    appears (the text ends before it). ``stop``: a few short strings (``protocol`` bounds them)."""

    def __init__(self, tok, stop: list[str]):
        self.tok, self.stop, self.ids, self.stopped, self.count = tok, stop, [], False, 0
        self.start = self.read = 0  # ids[:read] are in the text so far; decoding starts at ids[start]
        self.pending = ""  # decoded, not sent yet (it may begin a stop string)

    def add(self, new: list[int]) -> str:
        self.ids.extend(new)
        self.count += len(new)
        if self.stopped:
            return ""
        fresh = self._fresh()
        if fresh is None:
            return ""
        self.pending += fresh
        self.start, self.read = self.read, len(self.ids)
        hits = [i for s in self.stop if (i := self.pending.find(s)) >= 0]
        if hits:
            self.stopped = True
            return self._emit(min(hits))
        return self._emit(len(self.pending) - self._held())

    def flush(self) -> str:
        if self.stopped:
            return ""
        self.pending += self._fresh(final=True)
        return self._emit(len(self.pending))

    def _fresh(self, final: bool = False) -> str | None:
        """The text of ids[read:] (None while it ends inside a character, unless ``final``)."""
        done = self.tok.decode(self.ids[self.start:self.read], skip_special_tokens=True)
        text = self.tok.decode(self.ids[self.start:], skip_special_tokens=True)
        return None if text.endswith("\ufffd") and not final else text[len(done):]

    def _held(self) -> int:
        """The length of the longest end of ``pending`` that begins a stop string."""
        n, hold = len(self.pending), 0
        for s in self.stop:
            p = self.pending.find(s[0], max(0, n - len(s) + 1))
            while 0 <= p and n - p > hold:
                if s.startswith(self.pending[p:]):
                    hold = n - p
                    break
                p = self.pending.find(s[0], p + 1)
        return hold

    def _emit(self, upto: int) -> str:
        out, self.pending = self.pending[:upto], "" if self.stopped else self.pending[upto:]
        return out


__all__ = ["Scheduler", "Job", "Group", "TextStream", "round_info", "pieces", "IDLE_SECONDS"]
