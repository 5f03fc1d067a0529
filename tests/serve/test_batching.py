"""Micro-batching: concurrent requests share a backward pass and get the scores they would get
alone; a bounded queue (429 + Retry-After), timeouts (504), a client that leaves frees its
place, and a failing job or batch never takes the server or another request with it."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient

import isouq
from isouq.serve.engine import Engine, GenerateJob, Outcome, Pair, ScoreJob

from .conftest import live, make_app

QUESTIONS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue",
             "what is the moon made of", "is the cat on the mat", "who sat on the mat"]
ANSWERS = ["paris", "shakespeare wrote hamlet", "because the sky is blue", "cheese rock",
           "yes the cat is", "the dog sat on the mat"]


def together(n: int, fn):
    """Call fn(i) for i < n from n threads released at once; their results in order."""
    out: list = [None] * n
    gate = threading.Barrier(n)

    def go(i):
        gate.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


@pytest.fixture(scope="module")
def batched(lm):
    app = make_app(lm, max_wait_ms=300.0, max_batch=16, max_new_tokens=6)
    with live(app) as url:
        yield url, app


def test_concurrent_scores_are_batched_and_equal_to_scoring_alone(batched, lm):
    url, app = batched
    model, tok = lm
    n = 12
    pairs = [{"prompt": QUESTIONS[i % 6] + " " + "the " * (i % 4), "answer": ANSWERS[i % 6]}
             for i in range(n)]
    before = app.state.batcher.batches
    with httpx.Client(timeout=60) as c:
        got = together(n, lambda i: c.post(f"{url}/v1/score", json=pairs[i]))
    assert all(r.status_code == 200 for r in got), [r.text for r in got]
    batches = app.state.batcher.batches - before
    assert batches < n / 2, f"{n} requests ran in {batches} batches"
    for pair, r in zip(pairs, got, strict=True):
        u = r.json()["data"][0]["uncertainty"]
        alone = isouq.score_sequences(model, tok, [pair["prompt"]], [pair["answer"]])
        for k in ("epistemic", "aleatoric", "mean_prob"):
            assert u[k] == pytest.approx(float(getattr(alone, k)[0]), rel=1e-5), k
        assert u["epistemic_log"] == pytest.approx(float(alone.epistemic_log[0]), rel=1e-5)


def test_concurrent_chats_are_batched_and_equal_to_answering_alone(batched, lm):
    from isouq.llm.generation import generate_greedy

    url, app = batched
    model, tok = lm
    n = 6
    before = app.state.batcher.batches
    with httpx.Client(timeout=60) as c:
        got = together(n, lambda i: c.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": QUESTIONS[i]}], "max_tokens": 6,
            "temperature": 0}))
    assert all(r.status_code == 200 for r in got), [r.text for r in got]
    assert app.state.batcher.batches - before < n
    for q, r in zip(QUESTIONS, got, strict=True):
        prompt = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                         add_generation_prompt=True)
        g = generate_greedy(model, tok, [prompt], max_new_tokens=6, stop=())[0]
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == g.text
        alone = isouq.score_sequences(model, tok, [prompt], [g.token_ids])
        for k in ("epistemic", "aleatoric", "mean_prob"):
            assert choice["uncertainty"][k] == pytest.approx(float(getattr(alone, k)[0]),
                                                            rel=1e-5), k


def test_one_score_sequences_call_per_batch(lm, monkeypatch):
    """The engine scores every answer of a batch, generated or sent, in one call (a pass
    costing more than any padding: ``pass_tokens`` infinite)."""
    import isouq.serve.engine as engine_mod

    calls = []
    real = engine_mod.score_sequences

    def counting(*a, **kw):
        calls.append(len(a[2]))
        return real(*a, **kw)

    monkeypatch.setattr(engine_mod, "score_sequences", counting)
    from isouq.serve.config import ServeSettings

    engine = Engine(*lm, ServeSettings(max_new_tokens=4, pass_tokens=float("inf")))
    jobs = [ScoreJob([Pair("paris", prompt="what is the capital of france"),
                      Pair("cheese", question="what is the moon made of")]),
            GenerateJob([("messages", [{"role": "user", "content": "who wrote hamlet"}])],
                        max_tokens=3, temperature=0, n=2),
            GenerateJob([("text", "the cat"), ("text", "the dog")], max_tokens=3,
                        temperature=0.8, n=2, seed=1)]
    out = engine.run(jobs)
    assert all(o.error is None for o in out), [o.error for o in out]
    assert calls == [2 + 1 + 4]  # greedy n=2 is one answer; sampled: 2 prompts × 2
    assert len(out[2].result) == 2 and len(out[2].result[0]["choices"]) == 2


def test_a_failing_job_leaves_its_batch_mates_scored(lm, monkeypatch):
    from isouq.serve.config import ServeSettings

    engine = Engine(*lm, ServeSettings())
    real = engine._score

    def poisoned(items, **kw):
        if any("poison" in str(it.prompt) for it in items):
            raise RuntimeError("poisoned")
        return real(items, **kw)

    monkeypatch.setattr(engine, "_score", poisoned)
    good = ScoreJob([Pair("paris", prompt="what is the capital of france")])
    bad = ScoreJob([Pair("x", prompt="poison")])
    limit = ScoreJob([Pair([10**6], prompt="the cat")])
    out = engine.run([good, bad, limit])
    assert out[0].error is None and out[0].result[0]["uncertainty"]["epistemic"] > 0
    assert isinstance(out[1].error, RuntimeError)
    assert "vocabulary" in str(out[2].error)


class Blocking:
    """A stand-in engine whose batches wait for ``release``; it records what it ran."""

    calibration = None

    def __init__(self, fail_first: bool = False):
        self.release = threading.Event()
        self.seen: list[list] = []
        self.fail_first = fail_first

    def params_summary(self):
        return {"spec": "all"}

    def run(self, jobs):
        self.seen.append(list(jobs))
        if self.fail_first and len(self.seen) == 1:
            raise RuntimeError("a bug in a batch")
        self.release.wait(20)
        u = {"mean_prob": 0.5, "epistemic": 1.0}
        return [Outcome(result=[{"uncertainty": u, "prompt_tokens": 1, "answer_tokens": 1}]
                        * job.units) for job in jobs]


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


PAIR = {"prompt": "a", "answer": "b"}


def test_a_full_queue_answers_429_with_retry_after(lm):
    engine = Blocking()
    app = make_app(lm, engine=engine, max_queue=1, max_batch=1)
    batcher = app.state.batcher
    with live(app) as url, httpx.Client(timeout=30) as c:
        first = threading.Thread(target=lambda: c.post(f"{url}/v1/score", json=PAIR))
        first.start()
        wait_for(lambda: len(engine.seen) == 1)
        second = {}
        t2 = threading.Thread(target=lambda: second.setdefault(
            "r", c.post(f"{url}/v1/score", json=PAIR)))
        t2.start()
        wait_for(lambda: batcher.depth == 1)
        full = c.post(f"{url}/v1/score", json=PAIR)
        assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
        assert "--max-queue" in full.json()["error"]["message"]
        engine.release.set()
        first.join(20)
        t2.join(20)
        assert second["r"].status_code == 200
        assert c.get(f"{url}/health").status_code == 200


def test_a_request_past_its_timeout_gets_504_and_leaves_the_queue(lm):
    engine = Blocking()
    app = make_app(lm, engine=engine, max_batch=1, request_timeout_s=0.5)
    batcher = app.state.batcher
    with TestClient(app) as c:
        got = together(2, lambda i: c.post("/v1/score", json=PAIR))
        assert [r.status_code for r in got] == [504, 504]
        assert "--request-timeout" in got[0].json()["error"]["message"]
        assert batcher.depth == 0  # the waiting one left the queue
        engine.release.set()
        wait_for(lambda: batcher.in_flight == 0)
        assert len(engine.seen) == 1  # the one that timed out while queued never ran


def test_a_client_that_disconnects_frees_its_place(lm):
    engine = Blocking()
    app = make_app(lm, engine=engine, max_batch=1)
    batcher = app.state.batcher
    with live(app) as url, httpx.Client(timeout=30) as c:
        first = threading.Thread(target=lambda: c.post(f"{url}/v1/score", json=PAIR))
        first.start()
        wait_for(lambda: len(engine.seen) == 1)
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps(PAIR).encode()
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: batcher.depth == 1)
        s.close()
        wait_for(lambda: batcher.depth == 0, timeout=5)
        engine.release.set()
        first.join(20)
        assert len(engine.seen) == 1  # the departed request never ran
        metrics = c.get(f"{url}/metrics").text
        assert 'isouq_requests_total{endpoint="/v1/score",status="499"} 1.0' in metrics


def test_a_batch_that_raises_answers_500_and_the_server_goes_on(lm):
    engine = Blocking(fail_first=True)
    engine.release.set()
    with TestClient(make_app(lm, engine=engine), raise_server_exceptions=False) as c:
        bad = c.post("/v1/score", json=PAIR)
        assert bad.status_code == 500 and "the server goes on" in bad.json()["error"]["message"]
        assert c.post("/v1/score", json=PAIR).status_code == 200
        assert c.get("/health").status_code == 200


def test_stopping_drains_the_queue_then_refuses(lm):
    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings
    from isouq.serve.errors import RequestError

    engine = Blocking()
    b = Batcher(engine, ServeSettings(max_batch=1)).start()
    futures = [b.submit(ScoreJob([Pair("b", prompt="a")])) for _ in range(3)]
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    wait_for(lambda: b._stopping)
    with pytest.raises(RequestError) as e:
        b.submit(ScoreJob([Pair("b", prompt="a")]))
    assert e.value.status == 503
    engine.release.set()
    stopper.join(20)
    assert all(f.result(5).error is None for f in futures)  # every queued job was answered


def test_a_memory_budget_cuts_the_batch_and_refuses_what_cannot_fit(lm, monkeypatch):
    import isouq.serve.engine as engine_mod
    from isouq.memory_plan import peak_bytes, shape_of
    from isouq.serve.config import ServeSettings

    calls = []
    real = engine_mod.score_sequences

    def counting(*a, **kw):
        calls.append(len(a[2]))
        return real(*a, **kw)

    monkeypatch.setattr(engine_mod, "score_sequences", counting)
    shape = shape_of(lm[0])
    from isouq.sequences import encode

    enc = encode(lm[1], ["the cat sat on"], ["the mat"])[0]
    n, a = len(enc.prompt) + len(enc.answer), len(enc.answer)
    budget = peak_bytes(shape, batch=2, length=n, answer_length=a)  # two such rows fit, not 3
    assert peak_bytes(shape, batch=3, length=n, answer_length=a) > budget
    engine = Engine(*lm, ServeSettings(memory_budget=budget))
    short = [ScoreJob([Pair("the mat", prompt="the cat sat on")]) for _ in range(5)]
    out = engine.run(short)
    assert all(o.error is None for o in out)
    assert sum(calls) == 5 and max(calls) <= 2 and len(calls) >= 3
    alone = isouq.score_sequences(*lm, ["the cat sat on"], ["the mat"])
    assert out[4].result[0]["uncertainty"]["epistemic"] == pytest.approx(
        float(alone.epistemic[0]), rel=1e-5)
    long = ScoreJob([Pair("cat " * 12, prompt="the cat " * 30)])
    (o,) = engine.run([long])
    assert o.error is not None and o.error.status == 413 and "--memory-budget" in str(o.error)


def test_clients_answered_by_a_batch_join_the_next_one():
    """Clients that send again as soon as they are answered join the next batch: the worker
    waits max_wait_ms after a batch ends. Without it, a group queued during a long batch (its
    wait long over) runs alone as soon as the batch ends, and two groups take turns, each
    batch half full."""
    from dataclasses import dataclass

    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings

    @dataclass
    class Work:
        name: str
        units: int = 1

    class Slow:
        def __init__(self):
            self.sizes: list[int] = []

        def run(self, works):
            self.sizes.append(len(works))
            time.sleep(0.4)  # a batch takes far longer than max_wait_ms
            return [w.name for w in works]

    engine = Slow()
    b = Batcher(engine, ServeSettings(max_batch=8, max_wait_ms=100, max_queue=16)).start()

    def client(i):
        for r in range(3):
            assert b.submit(Work(f"{i}-{r}")).result(timeout=30) == f"{i}-{r}"

    two_groups(client, b, gap=0.2)
    assert sum(engine.sizes) == 24
    assert engine.sizes[0] == 4 and 8 in engine.sizes[1:3], engine.sizes


class Timed:
    """A stand-in engine whose batches take ``seconds``; it records each batch's size and
    start time."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.sizes: list[int] = []
        self.starts: list[float] = []

    def run(self, works):
        self.sizes.append(len(works))
        self.starts.append(time.perf_counter())
        time.sleep(self.seconds)
        return [Outcome(result=w.name) for w in works]


def _work(name: str):
    from dataclasses import dataclass

    @dataclass
    class Work:
        name: str
        units: int = 1

    return Work(name)


def test_the_next_batch_waits_for_answers_handed_over_late():
    """The clients a batch answered are waited for from when their answers are handed over
    (Batcher.delivered), not from the batch's end: answers that reach their clients later than
    max_wait_ms after the batch ended (a busy event loop) still join the next batch, which then
    fills, instead of two groups taking turns with half-full batches (the old rule: wait
    max_wait_ms from the batch's end)."""
    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings

    engine = Timed(0.3)
    metrics = __import__("isouq.serve.metrics", fromlist=["Metrics"]).Metrics()
    b = Batcher(engine, ServeSettings(max_batch=16, max_wait_ms=60, max_queue=16),
                metrics).start()
    lag = 0.15  # from the batch's end to the answer handed over: > max_wait_ms

    def client(i):
        for r in range(3):
            f = b.submit(_work(f"{i}-{r}"), track=True)
            assert f.result(timeout=30).result == f"{i}-{r}"
            time.sleep(lag)
            b.delivered(f)

    two_groups(client, b, gap=0.15)
    assert sum(engine.sizes) == 24
    # the old rule ran [4, 4, 4, 4, 4, 4]: each group's batch started before the other was back
    assert engine.sizes[:3] == [4, 8, 8], engine.sizes
    assert 'isouq_batch_starts_total{reason="back"}' in metrics.text().decode()


def test_the_wait_runs_from_the_last_answer_handed_over():
    """While an answer of the last batch is not handed over, the next batch waits (at most
    DELIVERY_GRACE_S); then max_wait_ms from the last hand-over or arrival."""
    from isouq.serve.batcher import DELIVERY_GRACE_S, _Turn

    t = _Turn(end=10.0, expect=4, undelivered={1, 2}, last=10.0)
    assert t.closes(0.05) == 10.0 + DELIVERY_GRACE_S
    t.undelivered.clear()
    t.last = 10.2  # the last answer handed over
    assert t.closes(0.05) == pytest.approx(10.25)
    t.last = 20.0  # arrivals keep it open, but never past the bound
    assert t.closes(0.05) == pytest.approx(10.0 + DELIVERY_GRACE_S + 5 * 0.05)


def test_an_idle_server_still_batches_a_burst_and_a_lone_client_never_waits_for_others():
    """After the wait for the last batch's clients is over (they did not come back), a burst
    of requests is batched together (max_wait_ms from the first one) — not started the moment
    one arrives; and a client that sends again as soon as it is answered is not kept waiting
    for max_wait_ms: it is the one the last batch answered."""
    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings

    engine = Timed(0.05)
    wait = 0.8
    b = Batcher(engine, ServeSettings(max_batch=8, max_wait_ms=wait * 1000)).start()
    try:
        t0 = time.perf_counter()
        assert b.submit(_work("first")).result(timeout=30).result == "first"
        sent = time.perf_counter()
        assert b.submit(_work("again")).result(timeout=30).result == "again"
        assert engine.starts[0] - t0 >= wait * 0.9  # idle: waited for others to join
        assert engine.starts[1] - sent < wait / 2  # the client that came back went at once
        time.sleep(wait * 1.5)  # nobody comes back: the wait for them is over
        futures = []
        for i in range(4):
            futures.append(b.submit(_work(f"burst-{i}")))
            time.sleep(0.02)
        assert [f.result(timeout=30).result for f in futures] == [
            f"burst-{i}" for i in range(4)]
    finally:
        b.stop(10)
    assert engine.sizes == [1, 1, 4], engine.sizes


def test_with_max_wait_zero_a_batch_never_waits():
    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings

    engine = Timed(0.0)
    b = Batcher(engine, ServeSettings(max_batch=8, max_wait_ms=0)).start()
    try:
        for i in range(3):
            f = b.submit(_work(str(i)), track=True)
            f.result(timeout=10)  # never delivered: nothing waits for it
        t0 = time.perf_counter()
        b.submit(_work("x")).result(timeout=10)
        assert engine.starts[-1] - t0 < 0.3
    finally:
        b.stop(10)
    assert engine.sizes == [1, 1, 1, 1]


def two_groups(client, batcher, gap: float) -> None:
    """Clients 0-3 start, then, ``gap`` seconds later (their batch running), clients 4-7 queue;
    every client runs to its end, then the batcher stops."""
    first = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    second = [threading.Thread(target=client, args=(i,)) for i in range(4, 8)]
    try:
        for t in first:
            t.start()
        time.sleep(gap)
        for t in second:
            t.start()
        for t in first + second:
            t.join(60)
    finally:
        batcher.stop(10)


def test_metrics_count_batches_by_size_the_model_busy_time_and_the_gap():
    """/metrics holds each batch's exact size (isouq_batches_total{answers}), the seconds the
    model ran batches (isouq_model_busy_seconds_total) and the idle gap before each batch after
    the first (isouq_stage_seconds{stage="gap"}), measured as the batches ran."""
    import re

    from isouq.serve.batcher import Batcher
    from isouq.serve.config import ServeSettings
    from isouq.serve.metrics import Metrics

    engine, metrics = Timed(0.1), Metrics()
    b = Batcher(engine, ServeSettings(max_batch=3, max_wait_ms=0), metrics).start()
    try:
        together(3, lambda i: b.submit(_work(str(i))).result(timeout=30))
        time.sleep(0.2)
        b.submit(_work("alone")).result(timeout=30)
    finally:
        b.stop(10)
    text = metrics.text().decode()
    sizes = {int(n): float(v) for n, v in re.findall(
        r'^isouq_batches_total\{answers="(\d+)"\} (\S+)$', text, re.M)}
    assert sum(n * v for n, v in sizes.items()) == 4 and sum(sizes.values()) == len(engine.sizes)
    assert sizes == {n: float(engine.sizes.count(n)) for n in set(engine.sizes)}
    busy = float(re.search(r"^isouq_model_busy_seconds_total (\S+)$", text, re.M).group(1))
    assert 0.1 * len(engine.sizes) <= busy < 0.1 * len(engine.sizes) + 0.5
    gaps = int(float(re.search(r'^isouq_stage_seconds_count\{stage="gap"\} (\S+)$', text,
                               re.M).group(1)))
    gap_sum = float(re.search(r'^isouq_stage_seconds_sum\{stage="gap"\} (\S+)$', text,
                              re.M).group(1))
    assert gaps == len(engine.sizes) - 1
    assert gap_sum >= 0.2  # the last batch waited for its request, sent 0.2 s after the others'


def _jobs(lengths, units=1):
    from isouq.serve.batcher import Job

    out = []
    for i, n in enumerate(lengths):
        j = Job(work=None, units=units, length=n)
        j.name = i
        out.append(j)
    return out


def test_a_batch_is_first_come_first_served_when_everything_queued_fits():
    from collections import deque

    from isouq.serve.batcher import choose

    q = deque(_jobs([90, 10, 50, 200]))
    assert [j.name for j in choose(q, 4)] == [0, 1, 2, 3] and not q


def test_a_long_queue_is_batched_by_length_and_no_job_waits_long_past_its_turn():
    """With more queued than one batch holds, the worker puts rows of similar length together
    (less padding), always with the oldest job; in a steady stream of mixed lengths (the queue
    refilled as each batch leaves, as 64 clients keep it) no job goes more than MAX_PASSED
    batches later than first come, first served would send it, and the padded tokens fall."""
    import random
    from collections import deque

    from isouq.serve.batcher import MAX_PASSED, Job, choose

    q = deque(_jobs([50, 200, 50, 200, 50, 200, 50, 200]))
    first = choose(q, 4)
    assert [j.name for j in first] == [0, 2, 4, 6]  # the oldest (50) and its like
    assert all(j.passed == 1 for j in q if j.name < 6)  # 1, 3, 5 waited while younger went
    assert [j.name for j in choose(q, 4)] == [1, 3, 5, 7]

    rng = random.Random(0)
    sizes = [50, 60, 70, 90, 200]
    q, n, served, padded, fifo_padded = deque(), 0, {}, 0, 0
    made: list[int] = []

    def arrive():
        nonlocal n
        j = Job(work=None, units=1, length=rng.choice(sizes))
        j.name, n = n, n + 1
        made.append(j.length)
        q.append(j)

    for _ in range(48):
        arrive()
    for b in range(60):
        batch = choose(q, 16)
        assert sum(j.units for j in batch) == 16 and batch[0].passed <= MAX_PASSED
        padded += 16 * max(j.length for j in batch)
        for j in batch:
            served[j.name] = b
            arrive()
    late = max(b - k // 16 for k, b in served.items())
    assert late <= MAX_PASSED, late
    fifo_padded = sum(16 * max(made[k:k + 16]) for k in range(0, 60 * 16, 16))
    assert padded < 0.8 * fifo_padded, (padded, fifo_padded)


def test_the_length_hint_reads_the_longest_row_of_a_job():
    from isouq.serve.batcher import CHARS_PER_TOKEN, length_hint

    score = ScoreJob([Pair(answer="abc", prompt="hello"), Pair(answer=[1, 2, 3],
                                                               question="who?")])
    assert length_hint(score) == max(5 + 3, 4 + 3 * CHARS_PER_TOKEN)
    chat = GenerateJob([("messages", [{"role": "user", "content": "hi there"}])], max_tokens=5)
    assert length_hint(chat) == 8 + 5 * CHARS_PER_TOKEN


def test_a_batch_of_very_different_lengths_is_split_where_padding_costs_more(lm, monkeypatch):
    """With a cheap pass (``pass_tokens`` 2), the short answers and the long one are scored in
    separate passes, shortest first, each answer's scores as alone; with an infinite pass
    cost, one pass; a measured pass cost is a number ≥ 0 (or infinite)."""
    import isouq.serve.engine as engine_mod
    from isouq.serve.config import ServeSettings

    calls = []
    real = engine_mod.score_sequences

    def counting(*a, **kw):
        calls.append([len(e.prompt) + len(e.answer) for e in kw["encoded"]])
        return real(*a, **kw)

    monkeypatch.setattr(engine_mod, "score_sequences", counting)
    model, tok = lm
    long = "the cat sat on the mat and " * 6
    pairs = [Pair("paris", prompt="the capital"), Pair("mat", prompt=long),
             Pair("cheese", prompt="the moon")]
    for cost, passes in ((2.0, 2), (float("inf"), 1)):
        calls.clear()
        (out,) = Engine(model, tok, ServeSettings(pass_tokens=cost)).run([ScoreJob(pairs)])
        assert out.error is None, out.error
        assert len(calls) == passes, calls
        assert sorted(n for c in calls for n in c) == [n for c in calls for n in c]
        for p, r in zip(pairs, out.result, strict=True):
            alone = isouq.score_sequences(model, tok, [p.prompt], [p.answer])
            assert r["uncertainty"]["epistemic"] == pytest.approx(float(alone.epistemic[0]),
                                                                  rel=1e-5)
    measured = Engine(model, tok, ServeSettings()).measure_pass_tokens(length=16, repeats=1)
    assert measured >= 0
