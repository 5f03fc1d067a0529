"""The page at ``/``: ask a question, see the answer with p̄, its uncertainty and P(correct).

One self-contained document (inline CSS and JavaScript, nothing fetched from elsewhere). It asks
``POST /v1/ask`` (the answer ``isouq ask`` gives: the QA prompt, greedy, scored), shows each
answer with its scores, P(correct) when the server has a calibration, and marks withheld
answers. Its headline is the score the answer's ``headline_by`` names (P(correct) with a
calibration, else p̄: ``isouq.defaults``). With "shade sentences" ticked (the default) it asks
for the answer's sentences too (``"spans": "sentences"``) and shades each by the score its
``least_trusted_by`` names (``defaults.SPAN_SCORE``) among the answer's sentences, the least
trusted outlined, its scores in its tooltip: the color rule of ``isouq.study.report.spans``
(``shades``: between the answer's lowest and highest, on a log scale for the scores of
``defaults.LOG_SCALE``, background ``rgba(214, 39, 40, 0.06 + 0.54 · shade)``), ported to
JavaScript. With
``?q=QUESTION`` (repeatable) in the address it asks those questions on load and then sets
``data-ready`` on the body. When the server needs a key, the page asks for it and keeps it for
the browser tab only (sessionStorage). Every text from the server is put in with
``textContent``, never parsed as HTML.
"""

from __future__ import annotations

import json

from ..defaults import HIGHER_IS_LESS_TRUSTED, LOG_SCALE, SPAN_SCORE

#: how the page reads each score (``isouq.defaults``), given to its script
SHADING = {"higher_is_less_trusted": HIGHER_IS_LESS_TRUSTED, "log_scale": sorted(LOG_SCALE),
           "span_score": SPAN_SCORE}

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>isouq serve</title>
<style>
  :root { --ink: #1d2430; --muted: #5b6472; --line: #d9dee7; --accent: #3949ab;
          --good: #2e7d32; --bad: #c62828; --warn: #ef6c00; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
         color: var(--ink); background: #f6f7fb; }
  header { background: var(--accent); color: #fff; padding: 14px 24px; }
  header h1 { margin: 0; font-size: 20px; font-weight: 600; }
  header p { margin: 2px 0 0; opacity: .85; font-size: 13px; }
  main { max-width: 920px; margin: 0 auto; padding: 18px 24px 40px; }
  form { display: flex; gap: 10px; margin-bottom: 8px; }
  textarea { flex: 1; min-height: 46px; resize: vertical; padding: 10px 12px; font: inherit;
             border: 1px solid var(--line); border-radius: 8px; background: #fff; }
  button { padding: 0 20px; font: inherit; font-weight: 600; color: #fff; border: 0;
           border-radius: 8px; background: var(--accent); cursor: pointer; }
  button:disabled { opacity: .5; cursor: default; }
  #key-row { display: none; margin: 0 0 10px; font-size: 13px; color: var(--muted); }
  #key-row input { padding: 4px 8px; border: 1px solid var(--line); border-radius: 6px; }
  #status { min-height: 20px; font-size: 13px; color: var(--muted); }
  .result { background: #fff; border: 1px solid var(--line); border-radius: 10px;
            padding: 14px 16px; margin: 12px 0; }
  .result .q { font-weight: 600; }
  .result .answer { font-size: 17px; margin: 6px 0 10px; }
  .result.withheld .answer { color: var(--muted); text-decoration: line-through; }
  .badge { display: inline-block; font-size: 12px; font-weight: 600; padding: 1px 8px;
           border-radius: 10px; margin-left: 8px; vertical-align: middle; }
  .badge.withheld { background: #fdecea; color: var(--bad); }
  .badge.kept { background: #e8f5e9; color: var(--good); }
  .badge.error { background: #fff3e0; color: var(--warn); }
  table { border-collapse: collapse; font-size: 13px; }
  th, td { text-align: left; padding: 3px 14px 3px 0; font-variant-numeric: tabular-nums; }
  th { color: var(--muted); font-weight: 500; }
  .bar { display: inline-block; height: 8px; border-radius: 4px; background: var(--accent);
         vertical-align: middle; margin-left: 6px; }
  details { margin-top: 24px; color: var(--muted); font-size: 13px; }
  #options { font-size: 13px; color: var(--muted); margin: 0 0 8px; }
  .answer .s { border-radius: 3px; padding: 1px 0; }
  .answer .worst { outline: 2px solid #b3261e; }
  .spans-legend { font-size: 12px; color: var(--muted); margin: -4px 0 8px; }
  .headline { font-size: 17px; font-weight: 600; margin: 4px 0 6px; }
  .error-text { color: var(--bad); }
</style>
</head>
<body>
<header>
  <h1>isouq serve</h1>
  <p id="model">Answers with their uncertainty from gradient norms</p>
</header>
<main>
  <div id="key-row">This server needs a key: <input id="key" type="password"
    autocomplete="off" placeholder="API key"> (kept for this tab only)</div>
  <form id="ask">
    <textarea id="question" placeholder="Ask a question, e.g. What is the capital of France?"
              required></textarea>
    <button id="go" type="submit">Ask</button>
  </form>
  <div id="options"><label><input id="spans" type="checkbox" checked> shade sentences
    (each scored too: which one to check first)</label></div>
  <div id="status"></div>
  <section id="results"></section>
  <details>
    <summary>What the numbers mean</summary>
    <p><b>p̄</b>: the mean probability the model gave the answer's tokens.
    <b>Aleatoric</b>: (1/T) Σ p(1 − p) over the answer's tokens, the noise the model expects.
    <b>Epistemic</b>: ‖∇θ p̄‖², how much p̄ moves when the weights move; comparable between
    answers of one model. <b>Epistemic (log)</b>: ‖∇θ log p̄‖² = epistemic / p̄².
    <b>Shaded sentences</b>: each sentence of the answer scored on its own tokens; the darker,
    the higher its epistemic (log) among the answer's sentences (log scale); the outlined one
    is the one to check first. Hover a sentence for its scores.
    <b>P(correct)</b>: a calibration fitted on labelled answers of this model
    (<code>isouq calibrate</code>, passed with <code>--calibration</code>); answers below its
    threshold are <b>withheld</b> (struck through). None of the raw scores is a probability
    of being right.</p>
  </details>
</main>
<script>
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var keyRow = $("key-row"), key = $("key");
  key.value = sessionStorage.getItem("isouq-key") || "";
  key.addEventListener("change", function () { sessionStorage.setItem("isouq-key", key.value); });

  function headers() {
    var h = {"Content-Type": "application/json"};
    if (key.value) { h["Authorization"] = "Bearer " + key.value; }
    return h;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) { return "—"; }
    if (Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3)) { return x.toExponential(2); }
    return x.toFixed(digits === undefined ? 3 : digits);
  }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function row(table, name, value, cls, bar) {
    var tr = el("tr"), td = el("td", cls, value);
    tr.appendChild(el("th", null, name));
    if (bar !== undefined && bar !== null) {
      var b = el("span", "bar"); b.style.width = Math.round(80 * bar) + "px"; td.appendChild(b);
    }
    tr.appendChild(td); table.appendChild(tr);
  }

  // how each score is read (isouq.defaults)
  var SHADING = __SHADING__;
  var HEADLINES = {p_correct: "P(correct)", mean_prob: "p̄"};
  // the color rule of isouq.study.report.spans.shades: each span's score (on a log scale for
  // the scores of SHADING.log_scale, negated for a confidence) between the answer's lowest (0)
  // and highest (1); 0.5 for all when fewer than two differ; a score that is not a finite
  // number (null in JSON), or not positive on a log scale, counts as the highest
  function shades(spans, score) {
    var log = SHADING.log_scale.indexOf(score) >= 0;
    var sign = SHADING.higher_is_less_trusted[score] === false ? -1 : 1;
    var vals = spans.map(function (s) {
      var v = s.scores[score];
      if (typeof v !== "number" || !isFinite(v) || (log && v <= 0)) { return null; }
      return sign * (log ? Math.log10(v) : v);
    });
    var have = vals.filter(function (v) { return v !== null; });
    var lo = Math.min.apply(null, have), hi = Math.max.apply(null, have);
    if (have.length < 2 || hi === lo) { return spans.map(function () { return 0.5; }); }
    return vals.map(function (v) { return v === null ? 1 : (v - lo) / (hi - lo); });
  }
  // (text, span index or null) pieces: the answer's own text between the spans when their
  // ranges index it, else the spans' texts joined by blanks
  function pieces(answer, spans) {
    var out = [];
    if (spans.every(function (s) { return answer.slice(s.start, s.end) === s.text; })) {
      var order = spans.map(function (s, k) { return k; });
      order.sort(function (a, b) { return spans[a].start - spans[b].start; });
      var at = 0;
      order.forEach(function (k) {
        out.push([answer.slice(at, spans[k].start), null], [spans[k].text, k]);
        at = spans[k].end;
      });
      out.push([answer.slice(at), null]);
      return out;
    }
    spans.forEach(function (s, k) { out.push([k ? " " : "", null], [s.text, k]); });
    return out;
  }
  function shaded(answer, u) {
    var box = el("div", "answer"), spans = u.spans;
    var shade = shades(spans, u.least_trusted_by || SHADING.span_score);
    pieces(answer, spans).forEach(function (p) {
      if (p[1] === null) { if (p[0]) { box.appendChild(document.createTextNode(p[0])); } return; }
      var k = p[1], sc = spans[k].scores;
      var e = el("span", "s" + (k === u.least_trusted_span ? " worst" : ""), p[0]);
      e.style.background = "rgba(214, 39, 40, " + (0.06 + 0.54 * shade[k]).toFixed(2) + ")";
      e.title = "p̄ " + fmt(sc.mean_prob) + " · aleatoric " + fmt(sc.aleatoric) + " · epistemic "
        + fmt(sc.epistemic) + " · epistemic_log " + fmt(sc.epistemic_log);
      e.dataset.span = String(k);
      box.appendChild(e);
    });
    return box;
  }

  function describe() {
    fetch("/v1/models", {headers: headers()}).then(function (r) {
      if (r.status === 401) { keyRow.style.display = "block"; return null; }
      return r.json();
    }).then(function (doc) {
      if (!doc || !doc.data) { return; }
      var m = doc.data[0], info = m.isouq || {};
      $("model").textContent = "Model " + m.id + (info.calibration ? " · calibrated"
        : " · no calibration (start with --calibration FILE for P(correct))");
    }).catch(function () {});
  }

  function show(q, doc, card) {
    var u = doc.uncertainty || {};
    card.textContent = "";
    var head = el("div", "q", q);
    var withheld = u.withheld === true;
    if (u.withheld !== undefined && u.withheld !== null) {
      head.appendChild(el("span", "badge " + (withheld ? "withheld" : "kept"),
                          withheld ? "withheld" : "kept"));
    }
    card.appendChild(head);
    if (u.headline_by) {  // the score to read first, named (isouq.defaults)
      var v = u[u.headline_by];
      card.appendChild(el("div", "headline", (HEADLINES[u.headline_by] || u.headline_by) + " "
                          + fmt(v, 2) + "  (the score to read first: " + u.headline_by + ")"));
    }
    if (u.spans && u.spans.length && doc.answer) {
      card.appendChild(shaded(doc.answer, u));
      card.appendChild(el("div", "spans-legend", u.spans.length > 1
        ? "sentences shaded by their " + (u.least_trusted_by || SHADING.span_score)
          + ": the darker, the less trusted; outlined: check first"
        : "one sentence"));
    } else {
      card.appendChild(el("div", "answer", doc.answer || "(empty answer)"));
    }
    var t = el("table");
    row(t, "p̄ (mean token probability)", fmt(u.mean_prob), "mean-prob", u.mean_prob);
    row(t, "aleatoric", fmt(u.aleatoric, 4), "aleatoric");
    row(t, "epistemic ‖∇θ p̄‖²", fmt(u.epistemic), "epistemic");
    row(t, "epistemic (log) ‖∇θ log p̄‖²", fmt(u.epistemic_log), "epistemic-log");
    row(t, "P(correct)", "p_correct" in u ? fmt(u.p_correct, 2) : "— (no calibration)",
        "p-correct", "p_correct" in u ? u.p_correct : null);
    row(t, "answer tokens", String(u.n_tokens === undefined ? "—" : u.n_tokens), "n-tokens");
    card.appendChild(t);
    card.classList.toggle("withheld", withheld);
    card.dataset.state = "done";
    card.dataset.withheld = String(withheld);
  }

  function ask(q) {
    q = q.trim();
    if (!q) { return Promise.resolve(); }
    var card = el("article", "result"); card.dataset.state = "pending";
    card.appendChild(el("div", "q", q)); card.appendChild(el("div", "answer", "…"));
    $("results").insertBefore(card, $("results").firstChild);
    $("go").disabled = true; $("status").textContent = "Answering and scoring…";
    var body = {question: q};
    if ($("spans").checked) { body.spans = "sentences"; }
    return fetch("/v1/ask", {method: "POST", headers: headers(), body: JSON.stringify(body)})
      .then(function (r) {
        return r.json().then(function (doc) { return {status: r.status, doc: doc}; });
      }).then(function (res) {
        if (res.status === 401) { keyRow.style.display = "block"; }
        if (res.status !== 200) {
          var msg = (res.doc && res.doc.error && res.doc.error.message) || ("HTTP " + res.status);
          throw new Error(msg);
        }
        show(q, res.doc, card); $("status").textContent = "";
      }).catch(function (e) {
        card.dataset.state = "error";
        card.querySelector(".answer").textContent = "";
        card.querySelector(".answer").appendChild(el("span", "error-text", String(e.message || e)));
        $("status").textContent = "";
      }).then(function () { $("go").disabled = false; });
  }

  $("ask").addEventListener("submit", function (ev) {
    ev.preventDefault(); ask($("question").value);
  });
  $("question").addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); ask($("question").value); }
  });
  describe();
  // ?q=QUESTION (repeatable): ask on load, one after the other
  new URLSearchParams(location.search).getAll("q").reduce(function (done, q) {
    return done.then(function () { return ask(q); });
  }, Promise.resolve()).then(function () { document.body.dataset.ready = "true"; });
})();
</script>
</body>
</html>
"""
PAGE = PAGE.replace("__SHADING__", json.dumps(SHADING))
