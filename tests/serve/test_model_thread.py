"""Every torch computation of `isouq serve` runs on one thread: the model is loaded, warmed up and
scored on the same thread (a second thread running torch's parallel loops slows every batch on
the CPU; isouq/serve/model_thread.py says why)."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from isouq.serve.model_thread import ModelThread


def test_a_model_thread_runs_calls_in_order_on_one_thread_and_raises_their_errors():
    owner = ModelThread()
    seen = [owner.call(lambda i=i: (i, threading.get_ident())) for i in range(5)]
    assert [i for i, _ in seen] == list(range(5))
    assert len({t for _, t in seen}) == 1 and seen[0][1] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        owner.call(lambda: 1 / 0)
    assert owner.call(lambda: "still there") == "still there"  # an error does not end it
    owner.shutdown()


def test_the_server_loads_warms_up_and_scores_on_one_thread_apart_from_the_event_loop(
        tiny_llama_dir, monkeypatch):
    import uvicorn

    import isouq.models
    from isouq.serve import server
    from isouq.serve.engine import Engine

    where: dict[str, set] = {"load": set(), "warm_up": set(), "run": set(), "request": set()}

    real_load, real_warm, real_run = isouq.models.load_model, Engine.warm_up, Engine.run

    def load(*a, **k):
        where["load"].add(threading.get_ident())
        return real_load(*a, **k)

    def warm(self):
        where["warm_up"].add(threading.get_ident())
        return real_warm(self)

    def run(self, jobs):
        where["run"].add(threading.get_ident())
        return real_run(self, jobs)

    def serve(self, *a, **k):  # instead of listening: one request through the app
        with TestClient(self.config.app) as c:
            r = c.post("/v1/score", json={"prompt": "Question: 2+2?\nAnswer:", "answer": " 4"})
            assert r.status_code == 200, r.text
            where["request"].add(threading.get_ident())

    monkeypatch.setattr(isouq.models, "load_model", load)
    monkeypatch.setattr(Engine, "warm_up", warm)
    monkeypatch.setattr(Engine, "run", run)
    monkeypatch.setattr(uvicorn.Server, "run", serve)
    server.run_server(str(tiny_llama_dir), port=0, say=lambda *_: None)
    owner = where["load"]
    assert len(owner) == 1 and where["warm_up"] == owner and where["run"] == owner
    assert threading.get_ident() not in owner and not owner & where["request"]
