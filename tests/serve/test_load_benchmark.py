"""benchmarks/serve_load.py's machinery against a live server of the tiny model: clients of the
official openai package in steady state, the window's answers and latencies, the server's
batches read from /metrics, 429s counted and their Retry-After honoured, and the targets'
verdicts."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

import by_path
from isouq.serve.config import ServeSettings
from isouq.serve.engine import Engine

from .conftest import SMALL, live, make_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serve_load():
    pytest.importorskip("openai")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return by_path.module("benchmarks/serve_load.py")


PAIRS = [("what is the capital of france", "paris"), ("who wrote hamlet", "shakespeare"),
         ("why is the sky blue", "because the sky is blue"), ("who sat on the mat", "the cat")]


def args(**kw) -> Namespace:
    return Namespace(**{"model": "tiny", "max_tokens": 4, "warmup_batches": 1, "seconds": 1.0,
                        "min_batches": 3, "max_batch": 4, **kw})


def test_a_level_measures_answers_batches_and_the_ratio_to_the_ceiling(lm, serve_load):
    app = make_app(lm, max_batch=4, max_wait_ms=20.0, max_queue=16)
    with live(app) as url:
        r = serve_load.level(url, args(), "score", 4, PAIRS, None)
        chat = serve_load.level(url, args(), "chat", 2, PAIRS, None)
    assert r["endpoint"] == "/v1/score" and r["errors"] == 0, r["error_examples"]
    assert r["answers"] > 0 and r["seconds"] >= 1.0 and r["batches"] >= 3
    assert r["answers_per_s_in_window"] == pytest.approx(r["answers"] / r["seconds"], rel=0.01)
    # whole client cycles and the window's count agree on a steady server (within a batch)
    assert r["answers_per_s"] == pytest.approx(r["answers_per_s_in_window"], rel=0.3)
    assert r["p50_s"] <= r["p95_s"] <= r["p99_s"]
    sizes = {int(k): v for k, v in r["batch_sizes"].items()}
    assert sum(sizes.values()) == r["batches"] and max(sizes) <= 4
    assert 0 < r["model_busy"] <= 1.05
    assert {"parse", "queue", "score", "gap"} <= set(r["stages"])
    assert r["other_cores"] >= 0
    assert chat["endpoint"] == "/v1/chat/completions" and chat["answers"] > 0, chat
    ceil = serve_load.mean_ceiling([
        {"1": {"answers_per_s": 10.0, "cpu_s_per_answer": 0.2},
         "4": {"answers_per_s": 20.0, "cpu_s_per_answer": 0.1}},
        {"1": {"answers_per_s": 12.0, "cpu_s_per_answer": 0.2},
         "4": {"answers_per_s": 24.0, "cpu_s_per_answer": 0.1}}])
    assert ceil["4"] == {"answers_per_s": 22.0, "batch_service_s": round(4 / 22, 3),
                         "cpu_s_per_answer": 0.1}
    serve_load.compare(r, ceil, 4)
    assert r["vs_ceiling_batch_1"] == pytest.approx(r["answers_per_s"] / 11.0, abs=0.002)
    assert r["vs_ceiling_max_batch"] == pytest.approx(r["answers_per_s"] / 22.0, abs=0.002)


def test_the_rate_counts_whole_client_cycles(serve_load):
    """Two clients answered every second, in bursts: the rate is 2/s wherever the window
    starts and ends; a refused request (429) is a send without an answer."""
    crowd = serve_load.Clients.__new__(serve_load.Clients)
    crowd.sends = [[(t + 0.01 * k, True) for t in range(10)] for k in range(2)]
    for t0, t1 in ((0.0, 9.5), (0.5, 8.9), (2.2, 7.3)):
        assert crowd.rate(t0, t1) == pytest.approx(2.0, rel=0.02)
    crowd.sends = [[(0.0, True), (1.0, False), (2.0, True), (3.0, True)]]
    assert crowd.rate(0.0, 3.0) == pytest.approx(2 / 3)


class SlowEngine(Engine):
    """The tiny model's engine, each batch 0.2 s longer: the queue stays full for a while."""

    def run(self, jobs):
        time.sleep(0.2)
        return super().run(jobs)


def test_a_full_queue_is_counted_as_429s_and_the_clients_wait_their_retry_after(lm, serve_load):
    s = ServeSettings(**{**SMALL, "max_batch": 1, "max_wait_ms": 0.0, "max_queue": 1})
    app = make_app(lm, engine=SlowEngine(*lm, s), max_batch=1, max_wait_ms=0.0, max_queue=1)
    with live(app) as url:
        r = serve_load.level(url, args(max_batch=1, seconds=2.5), "score", 6, PAIRS, None)
    assert r["refused_429"] > 0 and r["errors"] == 0, r
    assert r["answers"] > 0
    # a refused client waits Retry-After (≥ 1 s) before it sends again: at most one 429 per
    # client per second of the window, not a storm
    assert r["refused_429"] <= 6 * (r["seconds"] + 1)


def test_targets_say_what_is_met_and_what_is_missed(serve_load):
    rows = [{"endpoint": "/v1/score", "clients": c, "answers_per_s": v,
             "vs_ceiling_batch_1": v / 3.0, "vs_ceiling_max_batch": v / 4.0,
             "p95_over_batch_s": 1.5} for c, v in ((1, 2.8), (4, 3.5), (16, 3.7), (64, 3.0))]
    rows.append({"endpoint": "/v1/chat/completions", "clients": 16, "answers_per_s": 2.0,
                 "vs_ceiling_max_batch": 0.8})
    t = serve_load.targets(rows, 16)
    assert t["score_1_client_vs_ceiling"]["met"]  # 2.8 / 3.0
    assert t["score_16_clients_vs_ceiling"]["met"]  # 3.7 / 4.0
    assert t["score_16_clients_p95_over_batch"]["met"]  # 1.5
    assert not t["score_throughput_never_falls"]["met"]  # 3.7 → 3.0 at 64 clients
    assert not t["chat_16_clients_vs_ceiling"]["met"]


def test_the_by_length_ceiling_scores_each_request_once_in_batches_the_batcher_forms(serve_load):
    stream = [(f"q{i}", "a" * (1 + (7 * i) % 23)) for i in range(40)]
    batches = serve_load.queued_batches(stream, 4, 20)
    flat = [i for b in batches for i in b]
    assert len(flat) == 20 == len(set(flat)) and all(len(b) <= 4 for b in batches)
    assert flat != list(range(20))  # not first come, first served
