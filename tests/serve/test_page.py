"""The page at / in headless Chromium against a live server: it asks the questions of its
address, and shows each answer with p̄, its uncertainty and P(correct), withheld ones marked."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from .conftest import live, make_app

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome",
                                               "google-chrome-stable")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: install the Debian package 'chromium' (.ci/run does on CI)")


class ScriptedCalibration:
    """P(correct) 0.8 for the first answer asked, 0.1 for the second; threshold 0.5."""

    threshold = 0.5
    needs_blocks = False
    needs_hidden = False
    needs_backward = True

    def __init__(self):
        self.calls = 0

    def predict(self, rows):
        """``rows``: one ``{"scores": …, "blocks": …}`` per answer, as the engine passes them."""
        self.calls += 1
        return [0.8 if self.calls == 1 else 0.1] * len(rows)

    def withheld(self, p):
        return [x < self.threshold for x in p]

    def describe(self):
        return "P(ok) = a scripted calibration for the test"


class Cards(HTMLParser):
    """Each result card: its data attributes and the text of its classed parts."""

    def __init__(self):
        super().__init__()
        self.cards: list[dict] = []
        self.body: dict = {}
        self._cls: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "article":
            self.cards.append({"attrs": a, "text": {}})
        self._cls.append(a.get("class"))

    def handle_endtag(self, tag):
        if self._cls:
            self._cls.pop()

    def handle_data(self, data):
        cls = next((c for c in reversed(self._cls) if c), None)
        if not self.cards or not cls:
            return
        text = self.cards[-1]["text"]
        text[cls] = text.get(cls, "") + data
        if cls != "answer" and "answer" in self._cls:  # a shaded span: the answer's text too
            text["answer"] = text.get("answer", "") + data


def dump_dom(url: str) -> str:
    """The DOM after the page's script ran (virtual time waits for its requests)."""
    r = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--no-first-run", "--virtual-time-budget=30000",
                        "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_page_shows_answers_scores_and_withheld(lm):
    app = make_app(lm, calibration=ScriptedCalibration(), max_new_tokens=6)
    questions = ["who wrote hamlet", "what is the moon made of"]
    with live(app) as url:
        dom = dump_dom(f"{url}/?" + "&".join(f"q={quote(q)}" for q in questions))
    page = Cards()
    page.feed(dom)
    assert page.body.get("data-ready") == "true", dom[-3000:]
    newest, oldest = page.cards  # the newest on top
    assert [c["attrs"]["data-state"] for c in page.cards] == ["done", "done"]
    assert newest["text"]["q"] == questions[1] and oldest["text"]["q"] == questions[0]
    assert newest["attrs"]["data-withheld"] == "true" and "withheld" in newest["attrs"]["class"]
    assert newest["text"]["badge withheld"] == "withheld"
    assert oldest["attrs"]["data-withheld"] == "false" and oldest["text"]["badge kept"] == "kept"
    assert oldest["text"]["p-correct"] == "0.80" and newest["text"]["p-correct"] == "0.10"
    # calibrated: the headline is P(correct), named
    assert oldest["text"]["headline"].startswith("P(correct) 0.80"), oldest["text"]
    assert "p_correct" in oldest["text"]["headline"]
    with TestClient(make_app(lm, max_new_tokens=6)) as c:  # what the API says about them
        want = c.post("/v1/ask", json={"question": questions[0]}).json()
    assert oldest["text"]["answer"] == want["answer"]
    assert float(oldest["text"]["mean-prob"]) == pytest.approx(
        want["uncertainty"]["mean_prob"], abs=6e-4)
    for cls in ("aleatoric", "epistemic", "epistemic-log"):
        assert re.fullmatch(r"[0-9.e+-]+", oldest["text"][cls]), (cls, oldest["text"])


def test_the_page_without_calibration_says_so(lm):
    with live(make_app(lm, max_new_tokens=4)) as url:
        dom = dump_dom(f"{url}/?q=who%20wrote%20hamlet")
    page = Cards()
    page.feed(dom)
    (card,) = page.cards
    assert card["attrs"]["data-state"] == "done" and card["attrs"]["data-withheld"] == "false"
    assert card["text"]["p-correct"] == "— (no calibration)"
    # without a calibration the headline is p̄ (isouq.defaults.ANSWER_SCORE), named
    assert card["text"]["headline"].startswith(f"p̄ {float(card['text']['mean-prob']):.2f}")
    assert "mean_prob" in card["text"]["headline"]
    assert "no calibration" in dom  # the header line from /v1/models


class SpanEngine:
    """A stand-in engine: every question is answered with ANSWER and the scripted spans
    (aleatoric 0.05, 0.24, null and 0.1: the third is not finite; epistemic_log the other way
    round), the second the least trusted of the finite ones by aleatoric, the score the
    response names; it records whether spans were asked for."""

    calibration = None
    answer = "Paris is big. It is old.\nYes. No"
    values = [0.05, 0.24, None, 0.1]

    def __init__(self):
        self.asked: list = []

    def params_summary(self):
        return {"spec": "all"}

    def run(self, jobs):
        from isouq.serve.engine import Outcome

        out = []
        for job in jobs:
            self.asked.append(job.spans)
            ranges = [(0, 13), (14, 24), (25, 29), (30, 32)]
            spans = [{"text": self.answer[a:b], "start": a, "end": b, "n_tokens": 2,
                      "scores": {"mean_prob": 0.5, "aleatoric": v, "epistemic": 0.1,
                                 "epistemic_log": 1.0 / v if v else None,
                                 "normalized_epistemic": 1e-6}}
                     for (a, b), v in zip(ranges, self.values, strict=True)]
            u = {"mean_prob": 0.5, "aleatoric": 0.2, "epistemic": 0.1, "epistemic_log": 0.4,
                 "normalized_epistemic": 1e-6, "n_tokens": 8, "params": {"spec": "all"},
                 "headline_by": "mean_prob"}
            if job.spans is not None:
                u |= {"spans": spans, "least_trusted_span": 1, "least_trusted_by": "aleatoric"}
            out.append(Outcome(result=[{"prompt_tokens": 3, "choices": [
                {"text": self.answer, "raw_text": " " + self.answer, "finish_reason": "stop",
                 "completion_tokens": 8, "uncertainty": u}]}]))
        return out


class Spans(HTMLParser):
    """The shaded spans of the page: text, class, title and background of each."""

    def __init__(self):
        super().__init__()
        self.spans: list[dict] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-span" in a:
            self._open = {**a, "text": ""}
            self.spans.append(self._open)

    def handle_endtag(self, tag):
        if tag == "span":
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data


def test_the_page_shades_an_answers_sentences_by_the_reports_color_rule(lm):
    """The page asks for sentences and shades each as the span report does
    (``study.report.spans.shades`` by the score ``least_trusted_by`` names: alpha 0.06 + 0.54 ·
    shade), the least trusted outlined."""
    from isouq.study.report.spans import shades

    engine = SpanEngine()
    with live(make_app(lm, engine=engine)) as url:
        dom = dump_dom(f"{url}/?q=where%20is%20paris")
    assert engine.asked == ["sentences"]
    page = Spans()
    page.feed(dom)
    want = shades([{"scores": {"aleatoric": float("inf") if v is None else v}}
                   for v in SpanEngine.values], "aleatoric")
    assert [s["text"] for s in page.spans] == ["Paris is big.", "It is old.", "Yes.", "No"]
    alphas = [float(re.search(r"rgba\(214, 39, 40, ([0-9.]+)\)", s["style"]).group(1))
              for s in page.spans]
    assert alphas == [round(0.06 + 0.54 * w, 2) for w in want], (alphas, want)
    assert [("worst" in s["class"]) for s in page.spans] == [False, True, False, False]
    assert "aleatoric 0.240" in page.spans[1]["title"]
    assert "sentences shaded by their aleatoric" in dom
    cards = Cards()
    cards.feed(dom)
    assert cards.cards[0]["text"]["answer"] == SpanEngine.answer  # the text between spans kept
