"""Load on ``isouq serve`` in steady state, beside its engine's throughput without the server.

For each endpoint (``/v1/score``, ``/v1/chat/completions``) and each number of concurrent
clients (``--levels``, default 1 4 16 64), clients of the official ``openai`` package (a thread
each, its own client, no retries, connected before the clock starts) send requests back to
back. The level first warms up (until the server has run ``--warmup-batches`` batches since
the level began), then is measured over a window of at least ``--seconds`` that holds at least
``--min-batches`` batches. Its answers/s come from whole client cycles (per client, the
answers it was given between its first and its last request sent in the window, over that
time; summed over the clients), so that where the window cuts the bursts in which a batch's
answers return does not move the figure; the count of answers in the window over its length is
kept beside it. A request answered 429 (the queue is full, ``--max-queue``) is counted, and
its client waits the ``Retry-After`` seconds before it sends again, as a client that honours
the header does.

The ceiling is the engine's work without the server, in a process of its own with the runtime
settings of ``isouq serve`` (``isouq.runtime.configure``) and no HTTP: ``score_sequences`` over
the same pairs, in the order the clients send them, at batch 1 and at the server's
``--max-batch``; for chat, each batch's prompts answered by ``llm.generation.generate_greedy``
(``max_tokens`` new tokens) and then scored by ``score_sequences`` on the prompt's and the
answer's token ids, as the server's engine does. For ``/v1/score`` it also scores batches of
``--max-batch`` formed as the server's batcher forms them from a long queue (``B_by_length``,
``serve.batcher.choose``). A ceiling run comes before an endpoint's first level, between each
two and after the last; each level is compared with the mean of the two runs around it. The
cores other processes used during each level and each ceiling run are recorded
(``other_cores``, from /proc on Linux): on a shared machine they say which figures to trust.

/v1/score pairs are TriviaQA questions (the shipped file) with a short answer, every other one
another question's, scored in the QA prompt (``question``, as ``isouq score`` does); chat
requests ask the same questions as one user message, greedy, ``max_tokens`` new tokens.

    bash scripts/quiet.sh run python benchmarks/serve_load.py   # ~30 min; benchmarks/results/serve_load.json
    python benchmarks/serve_load.py --levels 1 16 --seconds 10 --min-batches 2 \\
        --endpoints score --out /tmp/serve_load_short.json        # a short look

Per endpoint and level the JSON holds: answers/s and its ratio to the ceiling at batch 1 and at
``--max-batch``; p50/p95/p99 latency; the 429s; the batches the server ran with their sizes
(``batch_sizes``: answers → batches, from ``isouq_batches_total``) and why they started; the
model thread's busy share of the window (``isouq_model_busy_seconds_total``); the mean seconds
of each stage (per request: ``parse``, ``queue``, ``deliver``, ``respond``; per batch: ``gap``
(the model idle since the batch before), ``prepare``, ``generate``, ``score``, ``calibrate``);
the server's CPU seconds per answer (this script started it; Linux) and the clients' own; and
``p95_over_batch_s``: p95 over the ceiling's time for one full batch. ``targets`` checks the
goals of docs/serve.md; ``memory``: the predicted peak of one batch (``isouq.memory_plan``)
and the server's measured peak RSS. The load averages at the start and the end are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import save_json  # noqa: E402

REQUEST_STAGES = ("parse", "queue", "deliver", "respond")
BATCH_STAGES = ("gap", "prepare", "generate", "score", "calibrate")
ENDPOINTS = {"score": "/v1/score", "chat": "/v1/chat/completions"}


# --------------------------------------------------------------------------- the pairs


def questions(n: int) -> list[tuple[str, str]]:
    """n (question, answer) pairs of the shipped TriviaQA file, every other answer another
    question's (so that some answers are wrong)."""
    from isouq.data.qa import load_dataset

    items = load_dataset("triviaqa")
    out = []
    for i in range(n):
        it = items[i % len(items)]
        other = items[(i * 7 + 3) % len(items)]
        out.append((it.question, str((it if i % 2 == 0 else other).answers[0])))
    return out


# --------------------------------------------------------------------------- the ceiling


def ceiling_child(spec: dict) -> dict:
    """In a process of its own: answers/s of the engine's work without the server, per batch
    size, the median of ``rounds`` timed passes over the first pairs (``batches_per_pass``
    full batches; at batch 1, ``single`` answers), after one untimed call. For ``/v1/score``
    also ``B_by_length``: the same number of answers in batches of B formed as the server's
    batcher forms them from a long queue (``serve.batcher.choose``, three batches' worth
    waiting, refilled as each batch leaves), against ``B`` in the order sent."""
    from isouq.runtime import configure

    configure()  # what `isouq serve` sets: allocator, threads
    from isouq.llm.generation import generate_greedy
    from isouq.llm.prompts import encode_prompt, qa_prompt
    from isouq.models import load_model
    from isouq.sequences import encode, score_sequences
    from isouq.tokens import Encoded

    model, tok, _ = load_model(spec["model"], device=spec.get("device", "cpu"))
    pairs = [tuple(p) for p in spec["pairs"]]
    runs = [(b, b, False) for b in spec["batches"]]
    if spec["endpoint"] == "score" and spec.get("by_length"):
        runs.append((f"{max(spec['batches'])}_by_length", max(spec["batches"]), True))
    out = {}
    for name, batch, by_length in runs:
        n = min(len(pairs), spec["batches_per_pass"] * batch if batch > 1 else spec["single"])
        if spec["endpoint"] == "score":
            stream = [pairs[i % len(pairs)] for i in range(n + 3 * batch)]
            order = (queued_batches(stream, batch, n) if by_length
                     else [list(range(s, min(s + batch, n))) for s in range(0, n, batch)])
            prompts = [qa_prompt(tok, q) for q, _ in stream]
            answers = [a for _, a in stream]
            enc = encode(tok, prompts, answers)

            def once(order=order, prompts=prompts, answers=answers, enc=enc, batch=batch):
                done = 0
                for idx in order:
                    score_sequences(model, tok, [prompts[i] for i in idx],
                                    [answers[i] for i in idx], batch_size=batch,
                                    encoded=[enc[i] for i in idx])
                    done += len(idx)
                return done

            warm = order[:1]
        else:
            texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q, _ in pairs[:n]]
            ids = [encode_prompt(tok, t) for t in texts]

            def once(order=None, texts=texts, ids=ids, batch=batch, n=n):
                done = 0
                for s in range(0, n, batch):
                    gens = generate_greedy(model, tok, texts[s:min(s + batch, n)],
                                           max_new_tokens=spec["max_tokens"], stop=(),
                                           batch_size=batch)
                    keep = [i for i, g in enumerate(gens) if len(g.token_ids)]
                    enc = [Encoded(list(ids[s + i]), list(gens[i].token_ids)) for i in keep]
                    score_sequences(model, tok, [texts[s + i] for i in keep],
                                    [e.answer for e in enc], batch_size=batch, encoded=enc)
                    done += len(gens)
                    if order == "first":
                        break
                return done

            warm = "first"
        once(order=warm)  # untimed: first-call costs
        rates, cpu = [], []
        for _ in range(spec["rounds"]):
            c0, t0 = time.process_time(), time.perf_counter()
            done = once()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            rates.append(done / dt)
            cpu.append(dc / done)
        out[str(name)] = {"answers": n, "answers_per_s": round(statistics.median(rates), 3),
                          "rounds": [round(r, 3) for r in rates],
                          "cpu_s_per_answer": round(statistics.median(cpu), 4),
                          "batch_service_s": round(batch / statistics.median(rates), 3)}
    if spec.get("memory"):
        out["memory"] = memory_plan(model, spec["memory"])
    return out


def queued_batches(stream, batch: int, n: int) -> list[list[int]]:
    """The first ``n`` pairs of ``stream`` in the batches ``serve.batcher.choose`` forms when
    three batches' worth wait and each batch that leaves is replaced by as many new requests
    (64 clients, ``--max-batch`` 16), as indices into ``stream``."""
    from collections import deque

    from isouq.serve.batcher import Job, choose, length_hint
    from isouq.serve.engine import Pair, ScoreJob

    queue: deque = deque()
    made = 0

    def arrive():
        nonlocal made
        q, a = stream[made]
        work = ScoreJob([Pair(answer=a, question=q)])
        job = Job(work, 1, length=length_hint(work))
        job.index = made
        queue.append(job)
        made += 1

    for _ in range(3 * batch):
        arrive()
    out, done = [], 0
    while done < n:
        taken = choose(queue, min(batch, n - done))
        out.append([j.index for j in taken])
        done += len(taken)
        for _ in taken:
            arrive()
    return out


def memory_plan(model, spec: dict) -> list[dict]:
    """``isouq.memory_plan.peak_bytes`` of one batch, for batch 1 and ``--max-batch`` at 128
    and 512 tokens and at the server's longest allowed row (``--max-prompt-tokens`` +
    ``--max-new-tokens``); answers of 64 tokens (of 256 at the longest row)."""
    from isouq.memory_plan import peak_bytes, shape_of

    shape = shape_of(model)
    longest = spec["max_prompt_tokens"] + spec["max_new_tokens"]
    out = []
    for batch in sorted({1, spec["max_batch"]}):
        for tokens, answer in ((128, 64), (512, 64), (longest, spec["max_new_tokens"])):
            gib = peak_bytes(shape, batch=batch, length=tokens, answer_length=answer) / 2**30
            out.append({"batch": batch, "tokens": tokens, "answer_tokens": answer,
                        "predicted_peak_gib": round(gib, 2)})
    return out


def ceiling(a, endpoint: str, pairs, memory: bool = False) -> dict:
    """:func:`ceiling_child` in a fresh process (its own torch threads, nothing else in it),
    with the cores other processes used meanwhile (``other_cores``)."""
    spec = {"model": a.model, "device": a.device, "endpoint": endpoint, "pairs": pairs,
            "batches": sorted({1, a.max_batch}), "batches_per_pass": a.ceiling_batches,
            "single": a.ceiling_single, "rounds": a.ceiling_rounds, "max_tokens": a.max_tokens,
            "by_length": True,
            "memory": {"max_batch": a.max_batch, "max_prompt_tokens": 2048,
                       "max_new_tokens": 256} if memory else None}
    proc = subprocess.Popen([sys.executable, __file__, "--ceiling-child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    o0, t0 = other_cpu({proc.pid}), time.perf_counter()
    try:
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"the ceiling run failed: {err[-3000:]}")
    got = json.loads(out.strip().splitlines()[-1])
    got["other_cores"] = round(other_cpu_since(o0, {proc.pid}) / (time.perf_counter() - t0), 2)
    return got


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "isouq", "serve", "--model", args.model, "--port", str(port),
           "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
           "--max-queue", str(args.max_queue), "--log-level", "warning",
           "--device", args.device]
    if args.pass_tokens is not None:
        cmd += ["--pass-tokens", str(args.pass_tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import httpx

    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"isouq serve exited: {proc.stdout.read()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("isouq serve did not start within 300 s")
        time.sleep(0.25)


def scrape(url: str) -> dict[str, float]:
    """The server's counters so far, from /metrics: ``batches``, ``answers``, ``busy``,
    ``start:REASON``, ``size:N`` (batches of N answers), ``sum:STAGE`` and ``count:STAGE``."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for key, pattern in (("batches", r"^isouq_batch_answers_count (\S+)$"),
                         ("answers", r"^isouq_batch_answers_sum (\S+)$"),
                         ("busy", r"^isouq_model_busy_seconds_total (\S+)$")):
        m = re.search(pattern, text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    for reason, v in re.findall(r'^isouq_batch_starts_total\{reason="(\w+)"\} (\S+)$', text,
                                re.M):
        out[f"start:{reason}"] = float(v)
    for n, v in re.findall(r'^isouq_batches_total\{answers="(\d+)"\} (\S+)$', text, re.M):
        out[f"size:{n}"] = float(v)
    for kind, stage, v in re.findall(
            r'^isouq_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)$', text, re.M):
        out[f"{kind}:{stage}"] = float(v)
    return out


def peak_rss_gib(pid: int | None) -> float | None:
    """The peak resident memory of process ``pid`` so far (VmHWM, Linux), else None."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (OSError, TypeError):
        return None
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return round(int(m.group(1)) / 2**20, 3) if m else None


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (Linux), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: processes of this benchmark (itself, the server), left out of other_cpu
OURS: set[int] = {os.getpid()}


def _cpu_by_pid() -> dict[int, float]:
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def other_cpu(exclude: set[int] = frozenset()) -> dict[int, float]:
    """CPU seconds so far of every process but this benchmark's (Linux; empty elsewhere)."""
    try:
        return {p: c for p, c in _cpu_by_pid().items() if p not in OURS | set(exclude)}
    except OSError:
        return {}


def other_cpu_since(before: dict[int, float], exclude: set[int] = frozenset()) -> float:
    """CPU seconds other processes used since ``before`` (processes that ended meanwhile are
    not counted)."""
    now = other_cpu(exclude)
    return sum(c - before.get(p, 0.0) for p, c in now.items() if p not in exclude)


def diff(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, int]:
    return {k.split(":", 1)[1]: int(after[k] - before.get(k, 0)) for k in after
            if k.startswith(prefix) and after[k] - before.get(k, 0) > 0}


def stage_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean seconds of each stage between two scrapes (per request or per batch)."""
    out = {}
    for stage in REQUEST_STAGES + BATCH_STAGES:
        n = after.get(f"count:{stage}", 0) - before.get(f"count:{stage}", 0)
        if n > 0:
            total = after.get(f"sum:{stage}", 0) - before.get(f"sum:{stage}", 0)
            out[stage] = round(total / n, 4)
    return out


# --------------------------------------------------------------------------- the clients


class Clients:
    """``n`` client threads sending requests back to back until :meth:`stop`; each keeps the
    time it sent each request and whether it was answered (``sends``)."""

    def __init__(self, url: str, model: str, endpoint: str, n: int, pairs, max_tokens: int):
        self.url, self.model, self.endpoint = url, model, endpoint
        self.pairs, self.max_tokens = pairs, max_tokens
        self.done: list[tuple[float, float]] = []  # (sent, answered) of each answer
        self.refused: list[float] = []  # when each 429 came
        self.sends: list[list[tuple[float, bool]]] = [[] for _ in range(n)]  # per client
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._ready = threading.Barrier(n + 1)
        self._threads = [threading.Thread(target=self._loop, args=(k,), daemon=True)
                         for k in range(n)]
        for t in self._threads:
            t.start()
        self._ready.wait()  # every client connected

    def _pair(self):
        with self._lock:
            i, self._next = self._next, self._next + 1
        return self.pairs[i % len(self.pairs)]

    def _loop(self, k: int) -> None:
        from openai import OpenAI, RateLimitError

        client = OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                        timeout=600)
        client.models.list()  # connected before the clock starts
        self._ready.wait()
        while not self._stop.is_set():
            q, a = self._pair()
            t0 = time.perf_counter()
            try:
                if self.endpoint == "score":
                    r = client.post("/score", body={"model": self.model, "question": q,
                                                    "answer": a}, cast_to=object)
                    ok = r["data"][0]["uncertainty"]["epistemic"] is not None
                else:
                    r = client.chat.completions.create(
                        model=self.model, messages=[{"role": "user", "content": q}],
                        max_tokens=self.max_tokens, temperature=0)
                    ok = r.choices[0].uncertainty["epistemic"] is not None
                if not ok:
                    raise ValueError("no epistemic score in the answer")
            except RateLimitError as e:
                t1 = time.perf_counter()
                with self._lock:
                    self.refused.append(t1)
                    self.sends[k].append((t0, False))
                wait = float(e.response.headers.get("retry-after", "1"))
                self._stop.wait(wait)
                continue
            except Exception as e:  # noqa: BLE001 - counted and reported
                with self._lock:
                    self.errors.append(f"{type(e).__name__}: {e}"[:300])
                    self.sends[k].append((t0, False))
                self._stop.wait(1.0)
                continue
            t1 = time.perf_counter()
            with self._lock:
                self.done.append((t0, t1))
                self.sends[k].append((t0, True))

    def stop(self) -> None:
        """Stop sending; wait for the answers in flight."""
        self._stop.set()
        for t in self._threads:
            t.join()

    def rate(self, t0: float, t1: float) -> float:
        """Answers per second from whole client cycles: per client, its answered requests
        among those it sent in [t0, t1] but the last, over the time from its first send there
        to its last; summed over the clients. Unlike answers counted in a window, it does not
        depend on where the window cuts the bursts in which a batch's answers come back."""
        total = 0.0
        for mine in self.sends:
            inside = [(t, ok) for t, ok in mine if t0 <= t <= t1]
            if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
                total += sum(ok for _, ok in inside[:-1]) / (inside[-1][0] - inside[0][0])
        return total


def level(url: str, a, endpoint: str, clients: int, pairs, server_pid: int | None) -> dict:
    """One level: warm-up, then the measured window."""
    start = scrape(url)
    crowd = Clients(url, a.model, endpoint, clients, pairs, a.max_tokens)
    try:
        while scrape(url)["batches"] - start["batches"] < a.warmup_batches:
            time.sleep(0.5)
        b0, c0, own0 = scrape(url), cpu_seconds(server_pid), time.process_time()
        o0 = other_cpu()
        t0 = time.perf_counter()
        # no /metrics scrape inside the first --seconds: rendering it takes the server's GIL
        # from the model thread's Python hooks
        time.sleep(a.seconds)
        while True:
            now = scrape(url)
            if (time.perf_counter() - t0 >= a.seconds
                    and now["batches"] - b0["batches"] >= a.min_batches):
                break
            time.sleep(1.0)
        b1, c1, own1 = now, cpu_seconds(server_pid), time.process_time()
        t1 = time.perf_counter()
        others = other_cpu_since(o0)
    finally:
        crowd.stop()
    window = t1 - t0
    lat = sorted(e - s for s, e in crowd.done if t0 <= e <= t1)
    refused = sum(1 for t in crowd.refused if t0 <= t <= t1)

    def pct(p):
        return round(lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))], 3) \
            if lat else None

    answers = b1["answers"] - b0["answers"]
    batches = int(b1["batches"] - b0["batches"])
    return {
        "endpoint": ENDPOINTS[endpoint], "clients": clients, "seconds": round(window, 2),
        "answers": len(lat), "answers_per_s": round(crowd.rate(t0, t1), 3),
        "answers_per_s_in_window": round(len(lat) / window, 3),
        "p50_s": pct(50), "p95_s": pct(95), "p99_s": pct(99),
        "refused_429": refused, "errors": len(crowd.errors), "error_examples": crowd.errors[:3],
        "batches": batches,
        "answers_per_batch": round(answers / batches, 2) if batches else None,
        "batch_sizes": dict(sorted(diff(b0, b1, "size:").items(), key=lambda kv: int(kv[0]))),
        "batch_starts": diff(b0, b1, "start:"),
        "model_busy": round((b1["busy"] - b0["busy"]) / window, 3),
        "stages": stage_means(b0, b1),
        "server_cpu_s_per_answer": (round((c1 - c0) / answers, 4)
                                    if c0 is not None and c1 is not None and answers else None),
        "client_cpu_s_per_answer": round((own1 - own0) / len(lat), 4) if lat else None,
        "other_cores": round(others / window, 2),
    }


# --------------------------------------------------------------------------- the run


def mean_ceiling(runs: list[dict]) -> dict:
    """Per batch size, the mean answers/s of the ceiling runs (and the service time of a
    batch at that rate)."""
    out = {}
    for b in (k for k in runs[0] if k[:1].isdigit()):
        rate = statistics.mean(r[b]["answers_per_s"] for r in runs)
        size = int(b.split("_")[0])
        out[b] = {"answers_per_s": round(rate, 3), "batch_service_s": round(size / rate, 3),
                  "cpu_s_per_answer": round(statistics.mean(
                      r[b]["cpu_s_per_answer"] for r in runs), 4)}
    return out


def compare(r: dict, ceil: dict, max_batch: int) -> None:
    """Add to a level's row its ceiling (the mean of the ceiling runs just before and after
    it) and its ratios: answers/s over the ceiling's at batch 1 and at ``max_batch``, p95 over
    the ceiling's time for one full batch."""
    one, full = ceil["1"], ceil[str(max_batch)]
    r["ceiling"] = ceil
    r["vs_ceiling_batch_1"] = round(r["answers_per_s"] / one["answers_per_s"], 3)
    r["vs_ceiling_max_batch"] = round(r["answers_per_s"] / full["answers_per_s"], 3)
    r["p95_over_batch_s"] = (round(r["p95_s"] / full["batch_service_s"], 2)
                             if r["p95_s"] is not None else None)


def targets(results: list[dict], max_batch: int) -> dict:
    """The goals of docs/serve.md, each with what was measured and whether it is met."""
    by = {(r["endpoint"], r["clients"]): r for r in results}
    out = {}
    score = {c: r for (ep, c), r in by.items() if ep == "/v1/score"}
    if max_batch in score:
        v = score[max_batch]["vs_ceiling_max_batch"]
        out[f"score_{max_batch}_clients_vs_ceiling"] = {"goal": ">= 0.9", "measured": v,
                                                        "met": v is not None and v >= 0.9}
    if 1 in score:
        v = score[1]["vs_ceiling_batch_1"]
        out["score_1_client_vs_ceiling"] = {"goal": ">= 0.9", "measured": v,
                                            "met": v is not None and v >= 0.9}
    levels = sorted(score)
    if len(levels) > 1:
        rates = [score[c]["answers_per_s"] for c in levels]
        out["score_throughput_never_falls"] = {
            "goal": "each level >= 0.95 × the one before",
            "measured": dict(zip(map(str, levels), rates, strict=True)),
            "met": all(b >= 0.95 * a for a, b in zip(rates, rates[1:], strict=False))}
    if max_batch in score:
        v = score[max_batch]["p95_over_batch_s"]
        out[f"score_{max_batch}_clients_p95_over_batch"] = {
            "goal": "<= 2.5", "measured": v, "met": v is not None and v <= 2.5}
    chat = {c: r for (ep, c), r in by.items() if ep == "/v1/chat/completions"}
    if max_batch in chat:
        v = chat[max_batch]["vs_ceiling_max_batch"]
        out[f"chat_{max_batch}_clients_vs_ceiling"] = {"goal": ">= 0.9", "measured": v,
                                                       "met": v is not None and v >= 0.9}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ceiling-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu", help="the server's and the ceiling's device "
                    "(cuda: the GPU check, scripts/gpu_check.sh)")
    ap.add_argument("--url", default=None, help="an isouq serve already running (loopback; "
                    "its --max-batch must be this run's)")
    ap.add_argument("--endpoints", nargs="+", choices=tuple(ENDPOINTS), default=["score", "chat"])
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="the least length of a level's measured window")
    ap.add_argument("--min-batches", type=int, default=10,
                    help="the fewest batches a level's window holds")
    ap.add_argument("--warmup-batches", type=int, default=3,
                    help="batches run after a level's clients start, before its window")
    ap.add_argument("--pairs", type=int, default=64, help="distinct pairs (questions) sent")
    ap.add_argument("--ceiling-rounds", type=int, default=1,
                    help="timed passes per ceiling run (one run before the first level, one "
                         "after each)")
    ap.add_argument("--ceiling-batches", type=int, default=4,
                    help="full batches per timed pass of the ceiling at --max-batch")
    ap.add_argument("--ceiling-single", type=int, default=24,
                    help="answers per timed pass of the ceiling at batch 1")
    ap.add_argument("--max-tokens", type=int, default=16, help="chat answers' max_tokens")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    ap.add_argument("--pass-tokens", type=float, default=None,
                    help="the server's --pass-tokens (default: its own, timed at start; inf: "
                         "one pass per batch)")
    ap.add_argument("--max-queue", type=int, default=32,
                    help="the server's --max-queue (past it: 429)")
    ap.add_argument("--out", default="benchmarks/results/serve_load.json")
    a = ap.parse_args()
    if a.ceiling_child is not None:
        print(json.dumps(ceiling_child(json.loads(a.ceiling_child))))
        return
    if a.url is not None and not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\])",
                                          a.url):
        sys.exit("--url must be a loopback address (127.0.0.1, localhost, [::1])")
    # a run stopped by SIGTERM (timeout, quiet.sh) still stops the server it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("serve_load: stopped by SIGTERM"))
    pairs = questions(a.pairs)
    load_start, started = os.getloadavg(), time.time()
    proc = None
    if a.url is None:
        port = free_port()
        proc = start_server(a, port)
        url = f"http://127.0.0.1:{port}"
    else:
        url = a.url.rstrip("/")
    results, ceilings, server_peak, memory = [], {}, None, None
    import httpx

    card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0].get("isouq", {})
    try:
        pid = proc.pid if proc is not None else None
        OURS.update({pid} if pid is not None else set())
        for endpoint in a.endpoints:
            ep = ENDPOINTS[endpoint]
            # a ceiling run before the first level, between each two and after the last: each
            # level is compared with the mean of the two around it (other processes come and
            # go on a shared machine)
            runs = [ceiling(a, endpoint, pairs, memory=memory is None and endpoint == "score")]
            memory = memory or runs[0].pop("memory", None)
            print(f"{ep} ceiling: {runs[-1]}", flush=True)
            for c in a.levels:
                r = level(url, a, endpoint, c, pairs, pid)
                runs.append(ceiling(a, endpoint, pairs))
                print(f"{ep} ceiling: {runs[-1]}", flush=True)
                compare(r, mean_ceiling(runs[-2:]), a.max_batch)
                results.append(r)
                print(f"{ep:<22} {c:>3} clients: {r['answers_per_s']:6.2f} answers/s "
                      f"(x{r['vs_ceiling_batch_1']} of batch 1, x{r['vs_ceiling_max_batch']} "
                      f"of batch {a.max_batch}; {r['answers_per_s_in_window']} in the window), "
                      f"p50/95/99 {r['p50_s']}/{r['p95_s']}/{r['p99_s']} s, 429: "
                      f"{r['refused_429']}, errors {r['errors']}, busy {r['model_busy']}, "
                      f"sizes {r['batch_sizes']}, other cores {r['other_cores']}\n    stages "
                      f"{r['stages']}; CPU s/answer server {r['server_cpu_s_per_answer']} "
                      f"clients {r['client_cpu_s_per_answer']}", flush=True)
            ceilings[ep] = {"runs": runs, "mean": mean_ceiling(runs)}
        server_peak = peak_rss_gib(pid)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    goals = targets(results, a.max_batch)
    for name, t in goals.items():
        print(f"{name}: {t['measured']} (goal {t['goal']}): {'met' if t['met'] else 'MISSED'}")
    save_json(a.out, {"benchmark": "serve_load", "model": a.model,
                      "max_batch": a.max_batch, "max_wait_ms": a.max_wait_ms,
                      "max_queue": a.max_queue, "chat_max_tokens": a.max_tokens,
                      "window_s": a.seconds, "min_batches": a.min_batches,
                      "warmup_batches": a.warmup_batches, "pairs": a.pairs,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                      "elapsed_s": round(time.time() - started, 1),
                      "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
                      "nice": os.nice(0), "pass_tokens": card.get("pass_tokens"),
                      "device": a.device,
                      "note": "loopback; the clients and the server share the CPU; other "
                              "processes may too (other_cores: the cores they used during "
                              "each level and ceiling run; the load averages)",
                      "command": " ".join(["python", *sys.argv])},
              results=results, ceiling=ceilings, targets=goals,
              memory={"server_peak_rss_gib": server_peak, "predicted": memory})
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
