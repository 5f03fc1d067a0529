"""Load on ``isouq serve``: answers per second and p50/p95 latency for 1, 4 and 16 concurrent
clients on ``/v1/score`` and ``/v1/chat/completions``, through the official ``openai`` client.

Starts ``isouq serve`` (SmolLM2 by default) on a free loopback port, or uses ``--url``; every
request goes to 127.0.0.1 only, their number is bounded (``--score-requests``, ``--chat-requests``
per concurrency level) and the run stops by itself. Each client is a thread with its own
``OpenAI`` client (no retries), connected before the clock starts, sending requests back to
back until the level's requests are done. /v1/score pairs are TriviaQA questions (the shipped
file) with a short answer, scored in the QA prompt (as ``isouq score`` does with a
``question``); chat requests ask the same questions with ``max_tokens`` new tokens, greedy.

    python benchmarks/serve_load.py                       # writes benchmarks/results/serve_load.json
    python benchmarks/serve_load.py --score-requests 16 --chat-requests 8 --levels 1 4 16
    python benchmarks/serve_load.py --spans sentences --out benchmarks/results/serve_load_spans.json

The JSON holds, per endpoint and level: requests, seconds, answers/s, p50/p95 latency, the
batches the server ran (from /metrics) and answers per batch, why they started (``full``,
``back``: the clients the last batch answered were back, ``waited``: ``--max-wait-ms`` passed),
where a request's time went (``stages``: the mean seconds per request of ``parse``, ``queue``,
``deliver`` and ``respond``, and per batch of ``prepare``, ``generate``, ``score`` and
``calibrate``, from the server's ``isouq_stage_seconds``), and the server process's CPU seconds
per request (when this script started it, on Linux); the speed-up of each level over one
client; the machine, the load average before and after (other processes may share the CPU)
and the server's settings.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import save_json  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def start_server(args, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "isouq", "serve", "--model", args.model, "--port", str(port),
           "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
           "--max-queue", "256", "--log-level", "warning"]
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


REQUEST_STAGES = ("parse", "queue", "deliver", "respond")
BATCH_STAGES = ("prepare", "generate", "score", "calibrate")


def scrape(url: str) -> dict[str, float]:
    """The server's counters so far, from /metrics: ``batches``, ``answers``, ``start:REASON``
    (batches started for that reason), ``sum:STAGE`` and ``count:STAGE`` of each stage."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for key, pattern in (("batches", r"^isouq_batch_answers_count (\S+)$"),
                         ("answers", r"^isouq_batch_answers_sum (\S+)$")):
        m = re.search(pattern, text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    for reason, v in re.findall(r'^isouq_batch_starts_total\{reason="(\w+)"\} (\S+)$', text,
                                re.M):
        out[f"start:{reason}"] = float(v)
    for kind, stage, v in re.findall(
            r'^isouq_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)$', text, re.M):
        out[f"{kind}:{stage}"] = float(v)
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user + system) of process ``pid`` so far, from /proc (Linux), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def breakdown(before: dict[str, float], after: dict[str, float]) -> tuple[dict, dict]:
    """(mean seconds of each stage, per request or per batch; batches started by reason)
    between two scrapes."""
    stages = {}
    for stage in REQUEST_STAGES + BATCH_STAGES:
        n = after.get(f"count:{stage}", 0) - before.get(f"count:{stage}", 0)
        if n > 0:
            total = after.get(f"sum:{stage}", 0) - before.get(f"sum:{stage}", 0)
            stages[stage] = round(total / n, 4)
    starts = {k.split(":", 1)[1]: int(after[k] - before.get(k, 0)) for k in after
              if k.startswith("start:") and after[k] - before.get(k, 0) > 0}
    return stages, starts


def level(url: str, model: str, endpoint: str, clients: int, n: int, pairs, max_tokens: int,
          server_pid: int | None = None, spans: str | None = None):
    """n requests from `clients` threads; per-request latencies and the wall time."""
    from openai import OpenAI

    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    todo = iter(range(n))

    gate = threading.Barrier(clients + 1)
    extra = {"spans": spans} if spans else {}

    def client_loop():
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        client.models.list()  # connected before the clock starts
        gate.wait()
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            q, a = pairs[i % len(pairs)]
            t0 = time.perf_counter()
            try:
                if endpoint == "score":
                    r = client.post("/score", body={"model": model, "question": q,
                                                    "answer": a, **extra}, cast_to=object)
                    assert r["data"][0]["uncertainty"]["epistemic"] is not None
                else:
                    r = client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": q}],
                        max_tokens=max_tokens, temperature=0, extra_body=extra or None)
                    assert r.choices[0].uncertainty["epistemic"] is not None
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            with lock:
                lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    b0, c0 = scrape(url), cpu_seconds(server_pid)  # before the clients are let go
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    b1, c1 = scrape(url), cpu_seconds(server_pid)
    lat.sort()
    stages, starts = breakdown(b0, b1)

    def pct(p):
        return lat[min(len(lat) - 1, int(round(p / 100 * (len(lat) - 1))))] if lat else None

    n_batches = b1["batches"] - b0["batches"]
    return {"endpoint": f"/v1/{'score' if endpoint == 'score' else 'chat/completions'}",
            "clients": clients, "requests": n, "ok": len(lat), "errors": errors[:3],
            "seconds": round(wall, 3), "answers_per_s": round(len(lat) / wall, 3),
            "p50_s": round(pct(50), 3) if lat else None,
            "p95_s": round(pct(95), 3) if lat else None,
            "batches": int(n_batches),
            "answers_per_batch": (round((b1["answers"] - b0["answers"]) / n_batches, 2)
                                  if n_batches else None),
            "batch_starts": starts, "stages": stages,
            "server_cpu_s_per_request": (round((c1 - c0) / len(lat), 4)
                                         if c0 is not None and c1 is not None and lat else None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--url", default=None, help="an isouq serve already running (loopback)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--score-requests", type=int, default=32,
                    help="requests per level on /v1/score")
    ap.add_argument("--chat-requests", type=int, default=16,
                    help="requests per level on /v1/chat/completions (0: skip)")
    ap.add_argument("--max-tokens", type=int, default=16, help="chat answers' max_tokens")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-wait-ms", type=float, default=10.0)
    ap.add_argument("--spans", choices=("sentences", "lines"), default=None,
                    help="ask for span scores too (each answer's sentences or lines)")
    ap.add_argument("--out", default="benchmarks/results/serve_load.json")
    a = ap.parse_args()
    if a.url is not None and not re.match(r"^http://(127\.\d+\.\d+\.\d+|localhost|\[::1\])",
                                          a.url):
        sys.exit("--url must be a loopback address (127.0.0.1, localhost, [::1])")
    pairs = questions(max(a.score_requests, a.chat_requests, 16))
    proc = None
    if a.url is None:
        port = free_port()
        t0 = time.perf_counter()
        proc = start_server(a, port)
        print(f"isouq serve up in {time.perf_counter() - t0:.1f} s", flush=True)
        url = f"http://127.0.0.1:{port}"
    else:
        url = a.url.rstrip("/")
    load_before = os.getloadavg()
    results = []
    try:
        pid = proc.pid if proc is not None else None
        level(url, a.model, "score", 2, 2, pairs, a.max_tokens, pid)  # warm-up
        for endpoint, n in (("score", a.score_requests), ("chat", a.chat_requests)):
            if n <= 0:
                continue
            for c in a.levels:
                r = level(url, a.model, endpoint, c, n, pairs, a.max_tokens, pid, a.spans)
                results.append(r)
                print(f"{r['endpoint']:<22} {c:>3} clients: {r['answers_per_s']:7.2f} answers/s, "
                      f"p50 {r['p50_s']} s, p95 {r['p95_s']} s, {r['batches']} batches "
                      f"({r['answers_per_batch']} answers each, started {r['batch_starts']}), "
                      f"errors {len(r['errors'])}\n    seconds: {r['stages']}; server CPU "
                      f"{r['server_cpu_s_per_request']} s per request", flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    speedup = {}
    for ep in {r["endpoint"] for r in results}:
        mine = {r["clients"]: r["answers_per_s"] for r in results if r["endpoint"] == ep}
        base = mine.get(min(mine))
        speedup[ep] = {str(c): round(v / base, 2) for c, v in mine.items() if base}
    for ep, s in speedup.items():
        print(f"speed-up over one client, {ep}: {s}")
    save_json(a.out, {"benchmark": "serve_load", "model": a.model,
                      "max_batch": a.max_batch, "max_wait_ms": a.max_wait_ms,
                      "chat_max_tokens": a.max_tokens, "spans": a.spans,
                      "loadavg_before": load_before,
                      "loadavg_after": os.getloadavg(),
                      "note": "loopback; other processes may have shared the CPU (see loadavg)",
                      "command": " ".join(["python", *sys.argv])},
              results=results, speedup=speedup)
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
