"""Continuous batching over the KV cache's slots: which sequences run in each forward pass.

After vLLM's scheduler (continuous batching, chunked prefill under a per-step token budget) and
llama.cpp's server (``--parallel N`` slots, ``n_batch``). The model holds ``n_slots`` sequences
(``Transformer.setup_cache``); a request waits in a FIFO queue (bounded: ``QueueFull`` beyond it)
until a slot is free, then owns that slot until it finishes or is cancelled. One thread runs
``step`` in a loop; each step

1. frees the slots of cancelled requests, then admits queued requests into free slots, oldest
   first (a slot's cached tokens are reused for a common prompt prefix only when the request
   allows it: ``cache_prompt``);
2. runs one batched forward of one new token of *every* sequence that is decoding
   (``Transformer.decode``: each weight matrix streams once for all of them);
3. runs prompt chunks of the sequences still reading their prompts, oldest first, while the step's
   tokens stay within ``budget`` -- always at least one chunk, so a prompt always advances, and
   never part of a chunk: a prompt is cut into the same ``chunk``-token pieces (counted from its
   first uncached token) whatever else is running, so its logits do not depend on the load.

No admitted sequence starves: every decoding sequence gets one token per step, and the oldest
prompt gets at least one chunk per step; a long prompt delays each decode step by at most one
chunk. Cancelling (a client that went away) frees the slot at the next step boundary.

A request talks to the scheduler through its ``sink`` (the server's per-request text side):
``started(reuse, limit)`` at admission, ``token(id) -> bool`` per generated token (True: a stop
string ended it), then ``finished(reason)`` ("eos", "stop", "length", "cancelled") or
``failed(exc)``, always exactly one of these last two. Sinks run on the scheduler thread (a request
cancelled while queued: on the cancelling thread) and must be quick.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

import torch

from .generate import intra_op_threads, sample, token_limit
from .model import Transformer

#: decode batch sizes counted by the histogram /metrics shows (``le`` bounds; the last is +Inf)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class QueueFull(Exception):
    """The queue already holds its bound of waiting requests."""


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler serves it."""

    ids: list[int]
    max_tokens: int
    sink: object
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    cache_prompt: bool = True
    # set by the scheduler
    slot: int = -1
    limit: int = 0          # tokens it may generate (token_limit)
    prefilled: int = 0      # prompt tokens whose KV is in the slot
    generated: int = 0
    feed: int | None = None  # the last sampled token, to be fed back next decode step
    generator: torch.Generator | None = None
    cancelled: bool = False


@dataclass
class Slot:
    cached: list[int] = field(default_factory=list)  # tokens whose KV is valid at positions 0..len-1
    seq: Sequence | None = None
    last_used: int = 0  # the step it was last assigned (least recently used slots are reused first)


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Scheduler:
    def __init__(self, model: Transformer, stop_ids=frozenset(), *, chunk: int = 1024, budget: int | None = None,
                 max_queue: int = 128, decode_threads: int | None = None):
        if chunk < 1 or (budget is not None and budget < 1) or max_queue < 0:
            raise ValueError(f"Scheduler: chunk {chunk}, budget {budget} and max_queue {max_queue} must be positive")
        self.model, self.stop_ids = model, frozenset(stop_ids)
        self.chunk, self.budget = chunk, chunk if budget is None else budget
        self.max_queue, self.decode_threads = max_queue, decode_threads
        self.slots = [Slot() for _ in range(model.n_slots)]
        self.queue: deque[Sequence] = deque()
        self.cond = threading.Condition()
        self.running: list[Sequence] = []  # admitted, in admission order
        self.stopped = False
        # counters for /metrics (written by the scheduler thread only)
        self.steps = self.decode_steps = self.decode_tokens = self.prefill_chunks = self.prefill_tokens = 0
        self.decode_seconds = 0.0  # inside the batched decode forwards
        self.last_batch = 0
        self.batch_hist = [0] * (len(BATCH_BUCKETS) + 1)

    # ---- the request side (any thread)
    def submit(self, seq: Sequence) -> None:
        if len(seq.ids) > self.model.max_context or not seq.ids:
            raise ValueError(f"a prompt of {len(seq.ids)} tokens does not fit a slot of {self.model.max_context}")
        with self.cond:
            if len(self.queue) >= self.max_queue:
                raise QueueFull(f"{len(self.queue)} requests already wait for one of {len(self.slots)} slots")
            self.queue.append(seq)
            self.cond.notify()

    def cancel(self, seq: Sequence) -> None:
        """Stop ``seq``: dropped from the queue now (its sink told at once), or its slot freed (and its
        sink told) at the next step boundary."""
        with self.cond:
            seq.cancelled = True
            queued = seq in self.queue
            if queued:
                self.queue.remove(seq)
            self.cond.notify()
        if queued:
            seq.sink.finished("cancelled")

    @property
    def queue_length(self) -> int:
        return len(self.queue)

    @property
    def slots_in_use(self) -> int:
        return len(self.running)

    def run(self) -> None:
        """The scheduler thread: step while there is work, sleep until there is."""
        while True:
            with self.cond:
                while not (self.queue or self.running or self.stopped):
                    self.cond.wait()
                if self.stopped:
                    return
            try:
                self.step()
            except Exception as e:  # a bug outside any forward (which _guarded handles): fail what is in flight
                traceback.print_exc()
                for seq in list(self.running):
                    self._fail(seq, e)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify()

    # ---- one step (the scheduler thread)
    def step(self) -> None:
        self.steps += 1
        for seq in [s for s in self.running if s.cancelled]:  # first: a freed slot is admitted into now
            self._finish(seq, "cancelled")
        self._admit()
        decoding = [s for s in self.running if s.feed is not None]
        if decoding:
            self._decode(decoding)
        room, first = self.budget - len(decoding), True
        for seq in [s for s in self.running if s.prefilled < len(s.ids)]:
            while seq.slot >= 0 and seq.prefilled < len(seq.ids):
                n = min(self.chunk, len(seq.ids) - seq.prefilled)
                if not first and n > room:
                    return
                self._guarded([seq], self._prefill_chunk)
                room, first = room - n, False

    def _admit(self) -> None:
        with self.cond:
            while self.queue and len(self.running) < len(self.slots):
                seq = self.queue.popleft()
                try:  # everything that can fail before the slot is taken: a failure must not leak it
                    seq.generator = (torch.Generator().manual_seed(seq.seed if seq.seed is not None else torch.seed())
                                     if seq.temperature > 0 else None)
                except (ValueError, RuntimeError) as e:
                    seq.sink.failed(e)
                    continue
                free = [i for i, s in enumerate(self.slots) if s.seq is None]
                if seq.cache_prompt:  # the longest reusable prefix; then the least recently used slot
                    i = max(free, key=lambda i: (longest_common_prefix(self.slots[i].cached, seq.ids),
                                                 -self.slots[i].last_used))
                    reuse = min(longest_common_prefix(self.slots[i].cached, seq.ids), len(seq.ids) - 1)
                else:
                    i, reuse = min(free, key=lambda i: self.slots[i].last_used), 0
                slot = self.slots[i]
                slot.seq, slot.last_used, slot.cached = seq, self.steps, slot.cached[:reuse]
                seq.slot, seq.prefilled = i, reuse
                seq.limit = token_limit(len(seq.ids), seq.max_tokens, self.model.max_context)
                self.running.append(seq)
                seq.sink.started(reuse, seq.limit)

    def _guarded(self, seqs: list[Sequence], fn) -> None:
        """Run a forward over ``seqs`` (a prompt chunk: one sequence); if it fails, those requests fail
        and their slots are dropped."""
        try:
            fn(seqs)
        except Exception as e:  # a bug must not stop the other streams
            for seq in seqs:
                if seq.slot >= 0:
                    self._fail(seq, e)

    def _decode(self, seqs: list[Sequence]) -> None:
        """One batched decode step of ``seqs``; whatever fails fails its own request only. A forward
        that raises is run again for each sequence alone (it rewrites the same KV position of each
        slot, so a sequence that succeeds alone gets exactly the token it would have got in the
        batch); a failure after the forward (sampling, the sink) is that sequence's."""
        try:
            logits = self._decode_forward(seqs)  # (B, vocab)
        except Exception as e:  # noqa: BLE001 -- one request's bad input must not fail its batch
            if len(seqs) == 1:
                return self._fail(seqs[0], e)
            traceback.print_exc()
            for seq in seqs:
                if seq.slot >= 0:
                    self._decode([seq])
            return
        for seq, row in zip(seqs, logits):
            try:
                self.slots[seq.slot].cached.append(seq.feed)
                seq.feed = None
                self._next_token(seq, row)
            except Exception as e:  # noqa: BLE001 -- as above: this sequence alone fails
                if seq.slot >= 0:
                    self._fail(seq, e)

    def _decode_forward(self, seqs: list[Sequence]) -> torch.Tensor:
        tokens = torch.tensor([s.feed for s in seqs])  # (B,)
        positions = torch.tensor([len(s.ids) + s.generated - 1 for s in seqs])  # (B,) where each feed goes
        slots = torch.tensor([s.slot for s in seqs])  # (B,)
        t0 = time.perf_counter()
        with torch.inference_mode(), intra_op_threads(self.decode_threads):
            logits = self.model.decode(tokens, positions, slots)  # (B, vocab)
        self.decode_seconds += time.perf_counter() - t0
        B = len(seqs)
        self.decode_steps, self.decode_tokens, self.last_batch = self.decode_steps + 1, self.decode_tokens + B, B
        self.batch_hist[next((i for i, le in enumerate(BATCH_BUCKETS) if B <= le), len(BATCH_BUCKETS))] += 1
        return logits

    def _prefill_chunk(self, seqs: list[Sequence]) -> None:
        (seq,) = seqs
        start = seq.prefilled
        end = min(len(seq.ids), start + self.chunk)
        with torch.inference_mode():
            logits = self.model(torch.tensor([seq.ids[start:end]]), start, slot=seq.slot)  # (vocab,)
        self.prefill_chunks, self.prefill_tokens = self.prefill_chunks + 1, self.prefill_tokens + end - start
        seq.prefilled = end
        self.slots[seq.slot].cached = seq.ids[:end]
        if end == len(seq.ids):
            self._next_token(seq, logits)

    def _next_token(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Sample after the logits of seq's last fed position; emit, finish, or queue it for feeding."""
        if seq.generated == seq.limit:  # (only a limit of 0: the prompt filled the slot, as llama.cpp does)
            return self._finish(seq, "length")
        token = sample(logits, seq.temperature, seq.generator)
        if token in self.stop_ids and not seq.ignore_eos:
            return self._finish(seq, "eos")
        seq.generated += 1
        if seq.sink.token(token):
            return self._finish(seq, "stop")
        if seq.generated == seq.limit:  # the last token is never fed back
            return self._finish(seq, "length")
        seq.feed = token

    def _release(self, seq: Sequence) -> None:
        self.slots[seq.slot].seq = None
        self.running.remove(seq)
        seq.slot = -1

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """As ``_finish``, for a request whose forward failed: its slot's cache dropped (its KV is in an
        unknown state), its sink told, then its slot freed."""
        self.slots[seq.slot].cached = []
        try:
            seq.sink.failed(exc)
        except Exception:  # as in _finish: one sink must not stop the scheduler or the other streams
            traceback.print_exc()
        finally:
            self._release(seq)

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Tell the sink, then free the slot: a server whose slots read free has closed every finished
        request's end of its pipe (a test counts the server's descriptors once it reads idle)."""
        try:
            seq.sink.finished(reason)
        except Exception:  # a sink that cannot report (a client gone) must not fail the other streams
            traceback.print_exc()
        finally:
            self._release(seq)
