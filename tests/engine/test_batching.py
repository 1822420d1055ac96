"""Many sequences at once, in process: the batched decode forward against each sequence alone, and
the scheduler (engine/scheduler.py) driven step by step, so every claim is about which tokens run in
which step, never about time.

Exactness: on the production path (GGUF blocks, native fused block) a sequence's logits in a batch
are bit-identical to its logits alone: every product sums each block exactly in integers and
attention reads only the sequence's own slot. The pure-PyTorch fallback (fp32 / fp16 weights) lets
BLAS pick different kernels for one row and for B rows, so there the bound is a tolerance: 1e-4 of
max |logit| (fp32) and 1e-2 (fp16, whose one-row and many-row products round differently), with the
greedy tokens equal.
"""

from __future__ import annotations

import pytest
import torch

import engine
from engine import generate
from engine.scheduler import QueueFull, Scheduler, Sequence

PROMPTS = [[5, 80, 120, 33, 200], [7, 7, 9], list(range(100, 140)), [44], [3, 1, 4, 1, 5, 9, 2, 6, 5]]


def alone(m, prompt: list[int], steps: int, slot: int = 0) -> tuple[list[torch.Tensor], list[int]]:
    """Greedy logits and tokens of one sequence in ``slot``, nothing else running."""
    with torch.inference_mode():
        logits = [m.model(torch.tensor([prompt]), 0, slot=slot)]
        tokens = [int(torch.argmax(logits[-1]))]
        for i in range(steps):
            logits.append(m.model.decode(torch.tensor(tokens[-1:]), torch.tensor([len(prompt) + i]),
                                         torch.tensor([slot]))[0])
            tokens.append(int(torch.argmax(logits[-1])))
    return logits, tokens


def batched(m, prompts: list[list[int]], slots: list[int], steps: int) -> tuple[list[list[torch.Tensor]], list]:
    """The same sequences prefilled into ``slots``, then decoded together, one batched forward per step."""
    with torch.inference_mode():
        logits = [[m.model(torch.tensor([p]), 0, slot=s)] for p, s in zip(prompts, slots)]
        tokens = [[int(torch.argmax(lg[0]))] for lg in logits]
        for i in range(steps):
            rows = m.model.decode(torch.tensor([t[-1] for t in tokens]),
                                  torch.tensor([len(p) + i for p in prompts]), torch.tensor(slots))  # (B, vocab)
            for b, row in enumerate(rows):
                logits[b].append(row)
                tokens[b].append(int(torch.argmax(row)))
    return logits, tokens


@pytest.mark.usefixtures("native_kernels")
def test_batched_decode_is_bit_identical_to_each_sequence_alone(tiny_q4_gguf):
    m = engine.load(str(tiny_q4_gguf), max_context=128, slots=6)
    assert m.linear == "gguf" and all(layer.fused_decode is not None for layer in m.model.layers)
    want = [alone(m, p, 12) for p in PROMPTS]
    slots = [4, 0, 5, 2, 1]  # any slots, in any order
    got_logits, got_tokens = batched(m, PROMPTS, slots, 12)
    for (w_logits, w_tokens), g_logits, g_tokens in zip(want, got_logits, got_tokens):
        assert g_tokens == w_tokens
        assert all(torch.equal(a, b) for a, b in zip(g_logits, w_logits))
    # a smaller batch of the same sequences (others finished) changes nothing either
    _, two = batched(m, PROMPTS[:2], [3, 1], 12)
    assert two == [want[0][1], want[1][1]]
    assert len({tuple(t) for _, t in want}) == len(PROMPTS)  # distinct streams, not one repeated answer


@pytest.mark.parametrize("linear, bound", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_batched_decode_of_the_pytorch_fallback_within_tolerance(linear, bound):
    m = engine.load("tiny", max_context=128, linear=linear, slots=5)
    want = [alone(m, p, 10) for p in PROMPTS]
    got_logits, got_tokens = batched(m, PROMPTS, [2, 4, 0, 1, 3], 10)
    for (w_logits, w_tokens), g_logits, g_tokens in zip(want, got_logits, got_tokens):
        assert g_tokens == w_tokens
        err = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(g_logits, w_logits))
        assert err <= bound, err


def test_decode_rejects_positions_beyond_the_slot():
    m = engine.load("tiny", max_context=16, linear="fp32", slots=2)
    with pytest.raises(ValueError, match="max_context"):
        m.model.decode(torch.tensor([1, 2]), torch.tensor([3, 16]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="slot 2"):
        m.model(torch.tensor([[1, 2]]), 0, slot=2)


# --------------------------------------------------------------------------------------------------
# The scheduler, one step at a time


class Sink:
    """Records what the scheduler tells a request, and in which step."""

    def __init__(self, sched_ref: list, stop_after: int | None = None):
        self.sched_ref, self.stop_after = sched_ref, stop_after
        self.reuse = self.limit = self.reason = None
        self.tokens, self.steps = [], []

    def started(self, reuse, limit):
        self.reuse, self.limit = reuse, limit

    def token(self, token):
        self.tokens.append(token)
        self.steps.append(self.sched_ref[0].steps)
        return self.stop_after is not None and len(self.tokens) >= self.stop_after

    def finished(self, reason):
        self.reason = reason

    def failed(self, exc):
        raise AssertionError(f"a generation failed: {exc!r}")


def make(m, **kw) -> tuple[Scheduler, list]:
    sched = Scheduler(m.model, m.tokenizer.stop_ids, **kw)
    return sched, [sched]


def submit(sched, ref, ids, max_tokens, **kw) -> Sink:
    sink = Sink(ref, kw.pop("stop_after", None))
    sched.submit(Sequence(list(ids), max_tokens, sink, ignore_eos=True, **kw))
    return sink


def run_until_idle(sched, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not (sched.queue or sched.running):
            return
        sched.step()
    raise AssertionError("the scheduler did not finish its work")


@pytest.fixture(scope="module")
def tiny4(tiny_q4_gguf):
    from engine import native

    if not native.available():  # the PyTorch path serves as well; only exactness needs the blocks
        return engine.load("tiny", max_context=512, linear="fp32", slots=4)
    return engine.load(str(tiny_q4_gguf), max_context=512, slots=4)


def test_every_stream_under_the_scheduler_gets_its_tokens_alone(tiny4):
    """Five requests on four slots (one waits), different lengths: each gets exactly the tokens it
    gets alone, and the counters its request asked for."""
    want = [alone(tiny4, p, 15)[1][:16] for p in PROMPTS]
    sched, ref = make(tiny4, chunk=8)
    sinks = [submit(sched, ref, p, 16, cache_prompt=False) for p in PROMPTS]
    run_until_idle(sched)
    assert [s.tokens for s in sinks] == want
    assert all(s.reason == "length" and s.reuse == 0 and s.limit == 16 for s in sinks)
    assert sched.decode_tokens == 5 * 15 and max(sched.batch_hist[2:]) > 0  # batches of 3-4 ran


def test_decoding_streams_advance_every_step_while_a_long_prompt_is_read_in_chunks(tiny4):
    """Fairness: a 200-token prompt arriving while two streams decode is read one 16-token chunk per
    step (the budget), and in each of those steps both streams get a token: the prompt never stalls
    them, and the prompt itself advances every step."""
    sched, ref = make(tiny4, chunk=16)
    a = submit(sched, ref, PROMPTS[0], 60)
    b = submit(sched, ref, PROMPTS[1], 60)
    sched.step()  # both admitted and prefilled (short prompts: one chunk each, in the same step's budget)
    sched.step()
    assert len(a.tokens) == len(b.tokens) == 2
    long_prompt = list(range(1, 201))
    c = submit(sched, ref, long_prompt, 4)
    first = sched.steps + 1
    while not c.tokens:
        before = (len(a.tokens), len(b.tokens), sched.prefill_tokens)
        sched.step()
        assert (len(a.tokens), len(b.tokens)) == (before[0] + 1, before[1] + 1)
        assert sched.prefill_tokens - before[2] in (16, 200 % 16)  # one whole chunk per step
    assert c.steps[0] - first + 1 == -(-200 // 16)  # 13 steps of prefill, each alongside both decoders
    run_until_idle(sched)
    assert len(a.tokens) == len(b.tokens) == 60 and len(c.tokens) == 4


def test_a_prompt_read_under_load_gives_the_tokens_it_gives_alone(tiny4):
    """A prompt's chunks do not depend on what else runs: cut alone into 16-token pieces or cut
    while other streams decode, the same pieces, so the same tokens."""
    prompt = list(range(30, 130))
    sched, ref = make(tiny4, chunk=16)
    quiet = submit(sched, ref, prompt, 12, cache_prompt=False)
    run_until_idle(sched)
    others = [submit(sched, ref, p, 40, cache_prompt=False) for p in PROMPTS[:3]]
    sched.step()
    busy = submit(sched, ref, prompt, 12, cache_prompt=False)
    run_until_idle(sched)
    assert busy.tokens == quiet.tokens and all(len(o.tokens) == 40 for o in others)


def test_prefix_reuse_only_when_asked(tiny4):
    sched, ref = make(tiny4, chunk=64)
    prompt = list(range(10, 60))
    first = submit(sched, ref, prompt, 5)
    run_until_idle(sched)
    again = submit(sched, ref, prompt, 5)  # the slot holding it is chosen, all but the last token reused
    run_until_idle(sched)
    cold = submit(sched, ref, prompt, 5, cache_prompt=False)
    run_until_idle(sched)
    longer = submit(sched, ref, prompt + first.tokens[:3] + [7], 5)  # the cache holds the fed-back tokens
    run_until_idle(sched)
    assert (first.reuse, again.reuse, cold.reuse, longer.reuse) == (0, 49, 0, 53)
    assert first.tokens == again.tokens == cold.tokens


def test_cancelling_frees_the_slot_at_the_next_step_and_the_queue_moves_on(tiny4):
    sched, ref = make(tiny4, chunk=64, max_queue=8)
    running = [submit(sched, ref, p, 400) for p in PROMPTS[:4]]
    waiting = submit(sched, ref, PROMPTS[4], 3)
    sched.step()
    assert sched.slots_in_use == 4 and sched.queue_length == 1 and waiting.reuse is None
    seq = next(s for s in sched.running if s.sink is running[1])
    sched.cancel(seq)
    sched.step()  # freed at the step's start, and the waiting request admitted into it
    assert running[1].reason == "cancelled" and waiting.reuse is not None and sched.queue_length == 0
    n = len(running[1].tokens)
    run_until_idle(sched)
    assert len(running[1].tokens) == n and waiting.reason == "length" and len(running[0].tokens) == 400


def test_a_queued_request_can_be_cancelled_before_it_runs(tiny4):
    sched, ref = make(tiny4, chunk=64)
    sinks = [submit(sched, ref, PROMPTS[0], 2) for _ in range(6)]
    seqs = list(sched.queue)
    sched.cancel(seqs[5])
    assert sched.queue_length == 5
    run_until_idle(sched)
    assert [s.reason for s in sinks] == ["length"] * 5 + ["cancelled"] and sinks[5].tokens == []


def test_the_queue_is_bounded(tiny4):
    sched, ref = make(tiny4, chunk=64, max_queue=2)
    for _ in range(2):
        submit(sched, ref, PROMPTS[0], 2)
    with pytest.raises(QueueFull, match="2 requests already wait"):
        submit(sched, ref, PROMPTS[0], 2)
    sched.step()  # both admitted: the queue has room again
    submit(sched, ref, PROMPTS[0], 2)
    run_until_idle(sched)


def test_admission_is_first_come_first_served(tiny4):
    sched, ref = make(tiny4, chunk=64, max_queue=32)
    sinks = [submit(sched, ref, [i + 3] * (i + 1), 3 + (i % 3)) for i in range(12)]
    order = []
    while sched.queue or sched.running:
        sched.step()
        order += [i for i, s in enumerate(sinks) if s.reuse is not None and i not in order]
    assert order == list(range(12))


def test_stop_ids_stop_strings_and_limits_end_a_sequence_where_generate_would(tiny4):
    prompt = PROMPTS[2]
    free = generate.greedy(tiny4, prompt, 20)
    eos = free[5]
    sched = Scheduler(tiny4.model, {eos}, chunk=64)
    ref = [sched]
    by_id = Sink(ref)
    sched.submit(Sequence(list(prompt), 20, by_id))  # ignore_eos False: ends before the stop id
    by_string = submit(sched, ref, prompt, 20, stop_after=3)
    zero = submit(sched, ref, prompt, 0)
    run_until_idle(sched)
    assert by_id.tokens == free[:free.index(eos)] and by_id.reason == "eos"
    assert by_string.tokens == free[:3] and by_string.reason == "stop"
    assert zero.tokens == [] and zero.reason == "length"


class FailingSink(Sink):
    def failed(self, exc):
        self.reason = f"failed: {exc}"


def test_a_request_that_fails_at_admission_takes_no_slot_and_the_next_one_runs(tiny4):
    """A seed torch cannot take fails that request alone: its slot is never taken, so with one slot the
    requests behind it still run (the slot once leaked and every later request was dropped)."""
    sched, ref = make(tiny4, chunk=64)
    sched.slots = sched.slots[:1]
    bad = FailingSink(ref)
    sched.submit(Sequence(list(PROMPTS[0]), 3, bad, temperature=0.5, seed=2**64))
    good = submit(sched, ref, PROMPTS[1], 3)
    run_until_idle(sched)
    assert bad.reason.startswith("failed:") and bad.tokens == []
    assert good.reason == "length" and len(good.tokens) == 3
    assert all(slot.seq is None for slot in sched.slots) and not sched.running


class ExplodingSink(FailingSink):
    """A request whose text side raises on its 4th token, inside a batched decode step."""

    def token(self, token):
        if len(self.tokens) == 3:
            raise RuntimeError("this request's sink broke")
        return super().token(token)


def test_a_request_failing_inside_a_batched_step_fails_alone(tiny4):
    """Four streams decode in one batch; one of them fails in the middle of a step (after the batched
    forward, at its own token). The other three finish with exactly the tokens each gets alone, and
    the failing one gets the failure, not their tokens."""
    want = [alone(tiny4, p, 11)[1][:12] for p in PROMPTS[:4]]
    sched, ref = make(tiny4, chunk=64)
    sinks = [submit(sched, ref, p, 12, cache_prompt=False) for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]
    bad = ExplodingSink(ref)
    sched.submit(Sequence(list(PROMPTS[1]), 12, bad, ignore_eos=True, cache_prompt=False))
    run_until_idle(sched)
    assert [s.tokens for s in sinks] == [want[0], want[2], want[3]]
    assert all(s.reason == "length" for s in sinks)
    assert bad.reason == "failed: this request's sink broke" and bad.tokens == want[1][:3]
    assert max(sched.batch_hist[2:]) > 0 and not sched.running  # they did decode in batches of 3-4


def test_a_batched_forward_that_fails_is_retried_per_request_and_fails_only_its_culprit(tiny4, monkeypatch):
    """The batched decode forward itself raises whenever the poisoned slot is in the batch (as a
    bad input of one request would make it): each sequence is then decoded alone, the poisoned one
    fails, and the rest finish with exactly their tokens alone (the retry rewrites the same KV
    position, so nothing is lost or doubled)."""
    want = [alone(tiny4, p, 9)[1][:10] for p in PROMPTS[:4]]
    sched, ref = make(tiny4, chunk=64)
    sinks = [submit(sched, ref, p, 10, cache_prompt=False) for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]
    bad = FailingSink(ref)
    sched.submit(Sequence(list(PROMPTS[1]), 10, bad, ignore_eos=True, cache_prompt=False))
    sched.step()  # everyone admitted and prefilled: the poisoned request's slot is known now
    poisoned = next(s.slot for s in sched.running if s.sink is bad)
    real = tiny4.model.decode
    calls = []

    def decode(tokens, positions, slots):
        calls.append(len(slots))
        if poisoned in slots.tolist():
            raise RuntimeError("a bad input in this batch")
        return real(tokens, positions, slots)

    monkeypatch.setattr(tiny4.model, "decode", decode)
    run_until_idle(sched)
    assert [s.tokens for s in sinks] == [want[0], want[2], want[3]]
    assert bad.reason == "failed: a bad input in this batch" and bad.tokens == want[1][:1]
    assert calls[0] == 4 and calls[1:5] == [1, 1, 1, 1]  # the failed batch of 4, then each alone
    assert all(slot.seq is None for slot in sched.slots)
