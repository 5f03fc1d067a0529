"""`isouq serve` as a command: its options, one-line errors before the model loads, and a real
server process that drains the requests in flight on SIGTERM, then exits."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from isouq.cli import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--calibration", "--host", "--port", "--api-key", "--max-batch",
                "--max-wait-ms", "--max-queue", "--request-timeout", "--max-body-bytes",
                "--max-prompt-tokens", "--max-answer-tokens", "--params", "--device",
                "--memory-budget", "--quantize", "--adapter"):
        assert opt in out, opt
    assert "127.0.0.1" in out


def test_a_port_in_use_is_one_line_before_the_model_loads(tiny_llama_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, err = run_cli(["serve", "--model", str(tiny_llama_dir), "--port", str(port)])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


@pytest.mark.parametrize("argv, words", [
    (["--max-wait-ms", "-1"], "--max-wait-ms"),
    (["--api-key", " "], "API key is blank"),
    (["--max-wait-ms", "nan"], "max_wait_ms"),
])
def test_bad_settings_are_one_line(tiny_llama_dir, argv, words):
    args = ["serve", "--model", str(tiny_llama_dir), "--port", str(free_port()), *argv]
    code, err = run_cli(args)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert words in err, err


def test_sigterm_drains_the_requests_in_flight_then_exits(tiny_llama_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ISOUQ_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "isouq", "serve", "--model", str(tiny_llama_dir), "--port",
         str(port), "--max-wait-ms", "1500", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        got = {}

        def ask():
            got["r"] = httpx.post(f"{url}/v1/score", json={"prompt": "the cat",
                                                          "answer": "sat"}, timeout=30)

        t = threading.Thread(target=ask)
        t.start()
        while httpx.get(f"{url}/health", timeout=5).json()["queue"] < 1:  # waiting 1.5 s
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert got["r"].status_code == 200, got["r"].text  # answered although SIGTERM came first
        assert got["r"].json()["data"][0]["uncertainty"]["epistemic"] > 0
        code = proc.wait(30)
        out = proc.stdout.read()
        assert code in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal once drained
        assert "on http://127.0.0.1" in out and "Traceback" not in out, out
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
