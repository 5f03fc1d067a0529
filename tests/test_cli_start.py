"""The ``isouq`` command starts quietly and fast: its parser imports no torch, its choices come
from the registries, and the known import noise of third-party libraries is dropped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from isouq import choices

#: what ``isouq --help`` and ``isouq CMD --help`` must not import (seconds each, and noise)
HEAVY = ("torch", "numpy", "transformers", "jax", "scipy", "sklearn", "matplotlib", "pandas",
         "accelerate", "peft", "fastapi")


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_help_of_every_command_imports_no_torch():
    """Every ``--help`` (the command, each command, each experiment and qa subcommand), in one
    fresh interpreter: none of HEAVY imported, and the lot answered in well under a second
    (torch alone takes longer to import; the hard check is the modules)."""
    r = run_python(f"""
import contextlib, io, json, sys, time
t0 = time.perf_counter()
from isouq.cli import build_parser, main
parser = build_parser()
sub = next(a for a in parser._actions if a.dest == "command").choices
helps = [["--help"]] + [[c, "--help"] for c in sub]
for c in ("experiment", "qa"):
    nested = next(a for a in sub[c]._actions if a.dest in ("name", "qa_command")).choices
    helps += [[c, n, "--help"] for n in nested]
codes = []
for argv in helps:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as e:
            codes.append(e.code)
print(json.dumps({{"n": len(helps), "codes": codes, "seconds": time.perf_counter() - t0,
                  "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
""")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["n"] > 20 and got["codes"] == [0] * got["n"], got
    assert got["heavy"] == [], got
    assert got["seconds"] < 1.5, got
    assert r.stderr == ""


@pytest.mark.parametrize("module", ["isouq", "isouq.cli"])
def test_isouq_help_runs_as_a_command(module):
    r = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "experiment" in r.stdout and r.stderr == ""


def test_a_closed_pipe_ends_the_command_quietly():
    """``isouq models | head -1``: no traceback when the reader goes away."""
    p = subprocess.Popen([sys.executable, "-m", "isouq", "models"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the command writes
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err, err


def test_choices_are_the_tuples_the_acting_modules_check():
    """The torch-free copies (``isouq.choices``) equal the names the code acting on them checks."""
    from isouq.evaluation.features import FEATURES
    from isouq.llm.prompts import JUDGE_STYLES
    from isouq.models.options import DEVICE_MAPS, QUANTIZE
    from isouq.models.toy import PRIORS
    from isouq.spans import SPLITTERS
    from isouq.study.qa.runner import QAConfig

    assert choices.SPAN_SPLITTERS == tuple(SPLITTERS)
    assert choices.DEVICE_MAPS == tuple(DEVICE_MAPS)
    assert choices.QUANTIZE == tuple(QUANTIZE)
    assert choices.JUDGE_STYLES == tuple(JUDGE_STYLES)
    assert choices.TOY_PRIORS == tuple(PRIORS)
    assert choices.FEATURE_NAMES == tuple(FEATURES)
    assert (QAConfig.judge_model, QAConfig.judge_prompt) == (
        choices.DEFAULT_JUDGE_MODEL, choices.DEFAULT_JUDGE_PROMPT)


def test_cli_choices_come_from_the_registries():
    from isouq.cli import build_parser
    from isouq.engines import ALIASES, ENGINES
    from isouq.param_sets import PARAM_SETS
    from isouq.study.experiments.catalog import EXPERIMENTS

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    method = next(a for a in sub["score"]._actions if a.dest == "method")
    assert list(method.choices) == [*ENGINES, *ALIASES]
    for flag in ("--spans", "--device-map", "--quantize"):
        act = next(a for a in sub["score"]._actions if flag in a.option_strings)
        assert tuple(act.choices) == {"--spans": choices.SPAN_SPLITTERS,
                                      "--device-map": choices.DEVICE_MAPS,
                                      "--quantize": choices.QUANTIZE}[flag]
    params = next(a for a in sub["ask"]._actions if a.dest == "params")
    assert all(name in params.help for name in PARAM_SETS)
    experiments = next(a for a in sub["experiment"]._actions if a.dest == "name")
    assert list(experiments.choices) == list(EXPERIMENTS)
    args = parser.parse_args(["score", "p.jsonl", "--out", "o.jsonl", "--method", "loop"])
    assert args.method == "loop"
    with pytest.raises(SystemExit):
        parser.parse_args(["score", "p.jsonl", "--out", "o.jsonl", "--method", "fast"])


def test_experiment_options_parse_without_the_experiment(tmp_path):
    """An experiment's own options (from its settings module) parse in the command's parser;
    the experiment module is imported only when it runs."""
    from isouq.cli import build_parser

    args = build_parser().parse_args(["experiment", "scaling", "--out", str(tmp_path),
                                      "--vi-steps", "7", "--num-warmup", "0"])
    assert (args.vi_steps, args.num_warmup, args.quick) == (7, 0, False)
    r = run_python("""
import json, sys
from isouq.cli import build_parser
build_parser().parse_args(["experiment", "validation", "--out", "v", "--grid-n", "5"])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("isouq.study"))))
""")
    assert r.returncode == 0, r.stderr[-2000:]
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert "isouq.study.experiments.catalog" in loaded, loaded
    assert "isouq.study.experiments.validation" not in loaded, loaded


# ---------------------------------------------------------------- library noise
NOISY_IMPORT = """
import logging, sys
{quiet}
logging.getLogger("torchao").warning("a torchao warning of another kind")
import peft  # imports transformers' quantizers, torchao and bitsandbytes
from transformers import AutoModelForCausalLM
print("imported")
"""
NOISE = ("Failed to load", "is an Enum subclass and is now natively supported")


def test_known_import_noise_is_dropped_and_nothing_else():
    pytest.importorskip("peft")
    loud = run_python(NOISY_IMPORT.format(quiet=""))
    assert loud.returncode == 0, loud.stderr[-3000:]
    if not any(n in loud.stderr for n in NOISE):
        pytest.skip("this environment's libraries print none of the known noise")
    quiet = run_python(NOISY_IMPORT.format(
        quiet="from isouq.runtime import quiet_library_noise; quiet_library_noise()"))
    assert quiet.returncode == 0 and "imported" in quiet.stdout, quiet.stderr[-3000:]
    assert not any(n in quiet.stderr for n in NOISE), quiet.stderr
    assert "a torchao warning of another kind" in quiet.stderr  # other records still show


def test_a_command_prints_no_library_noise(tiny_llama_dir, tmp_path):
    """``isouq score`` in its own process: its stderr holds progress bars, no import noise."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"question": "what is the capital of france",
                                 "answer": "paris"}) + "\n")
    r = subprocess.run([sys.executable, "-m", "isouq", "score", str(pairs), "--out",
                        str(tmp_path / "o.jsonl"), "--model", str(tiny_llama_dir)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "scored 1 answers" in r.stdout
    assert not any(n in r.stderr for n in NOISE), r.stderr
