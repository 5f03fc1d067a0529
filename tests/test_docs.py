"""Every Python and shell example in README.md and docs/*.md runs (so no example can rot).

A collector over the Markdown code fences:

- ```python fences of one page run in order in one Python session (the project's interpreter,
  in a fresh temporary folder), like a notebook: a later block may use names an earlier one
  defined. A failure points at the Markdown line (the code is compiled with the page's name and
  line numbers).
- ```bash / ```sh / ```shell fences run one by one with bash (``-euo pipefail``) in a fresh
  temporary folder, with the project's ``.venv/bin`` first on PATH (so ``isouq`` is the
  project's command).
- Other fences (```text, ```json, ...) are output or illustration and are not run.

An HTML comment on the line before a fence marks it:

- ``<!-- fence: slow — why -->``: needs a fetched or large model, or takes minutes; runs only
  with ``pytest -m slow`` (a page's slow Python session runs all its blocks, slow ones included).
- ``<!-- fence: skip — why -->``: never run here (installs the project, rewrites kept results,
  needs several machines); the reason is shown as the skip reason.
- ``repo`` (with slow): a shell example that must run from the repository root
  (``bash scripts/demo.sh``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")
NOT_RUN = ("text", "json", "jsonl", "toml", "yaml", "console", "csv", "")
FLAGS = {"slow", "skip", "repo"}
OPEN = re.compile(r"^ {0,3}(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")
MARK = re.compile(r"^\s*<!--\s*fence:\s*(?P<flags>[a-z ,]+?)\s*(?:(?:—|--|-|:)\s*(?P<why>.*?))?\s*-->\s*$")


@dataclass
class Fence:
    path: str  # relative to the repository root
    line: int  # 1-based line of the first code line
    lang: str
    code: str
    flags: set[str] = field(default_factory=set)
    why: str = ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path, root: Path = ROOT) -> list[Fence]:
    """The code fences of one Markdown file, with the marker on the line before each."""
    rel = str(path.relative_to(root))
    lines = path.read_text("utf-8").splitlines()
    out: list[Fence] = []
    i, pending = 0, None  # pending: (flags, why, line) of a marker waiting for its fence
    while i < len(lines):
        line = lines[i]
        m = MARK.match(line)
        if m:
            flags = set(re.split(r"[ ,]+", m["flags"].strip()))
            pending = (flags, m["why"] or "", i + 1)
            i += 1
            continue
        o = OPEN.match(line)
        if o:
            ticks, info = o["ticks"], o["info"]
            lang = info.split()[0].lower() if info else ""
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith(ticks):
                j += 1
            flags, why = (pending[0], pending[1]) if pending else (set(), "")
            out.append(Fence(rel, i + 2, lang, "\n".join(lines[i + 1:j]) + "\n", flags, why))
            pending = None
            i = j + 1
            continue
        if pending and line.strip():
            raise ValueError(f"{rel}:{pending[2]}: a fence marker must be on the line right "
                             "before a code fence")
        i += 1
    if pending:
        raise ValueError(f"{rel}:{pending[2]}: a fence marker with no fence after it")
    return out


def all_fences() -> list[Fence]:
    return [f for p in pages() for f in parse(p)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("ISOUQ_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


DRIVER = """\
import json, sys
g = {"__name__": "__main__"}
for f in json.load(open(sys.argv[1], encoding="utf-8")):
    # blank lines in front, so that tracebacks give the Markdown file's own line numbers
    code = "\\n" * (f["line"] - 1) + f["code"]
    print(f"--- {f['path']}:{f['line']}", flush=True)
    exec(compile(code, f["path"], "exec"), g)
"""


def run_python(fences: list[Fence], tmp: Path, timeout: float) -> None:
    spec = tmp / "fences.json"
    spec.write_text(json.dumps([f.__dict__ | {"flags": sorted(f.flags)} for f in fences]), "utf-8")
    driver = tmp / "driver.py"
    driver.write_text(DRIVER, "utf-8")
    work = tmp / "work"
    work.mkdir()
    r = subprocess.run([sys.executable, str(driver), str(spec)], cwd=work, env=_env(),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (f"{fences[0].path}: a Python example failed\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}")


def run_shell(fence: Fence, tmp: Path, timeout: float) -> None:
    script = tmp / "example.sh"
    script.write_text(fence.code, "utf-8")
    cwd = ROOT if "repo" in fence.flags else tmp
    r = subprocess.run(["bash", "-euo", "pipefail", str(script)], cwd=cwd, env=_env(),
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (f"{fence.id}: the shell example failed (exit {r.returncode})\n"
                               f"{fence.code}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")


# ------------------------------------------------------------------ the collected tests
FENCES = all_fences()
PY_PAGES = sorted({f.path for f in FENCES if f.lang in PYTHON})


def _page_fences(page: str, slow: bool) -> list[Fence]:
    return [f for f in FENCES if f.path == page and f.lang in PYTHON and "skip" not in f.flags
            and (slow or "slow" not in f.flags)]


def _shell_params():
    for f in FENCES:
        if f.lang not in SHELL:
            continue
        marks = []
        if "skip" in f.flags:
            marks.append(pytest.mark.skip(reason=f"{f.id}: {f.why or 'marked skip'}"))
        elif "slow" in f.flags:
            marks.append(pytest.mark.slow)
        yield pytest.param(f, id=f.id, marks=marks)


@pytest.mark.parametrize("page", PY_PAGES)
def test_python_examples(page, tmp_path):
    fences = _page_fences(page, slow=False)
    if not fences:
        pytest.skip(f"{page}: every Python example is marked slow or skip")
    run_python(fences, tmp_path, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", sorted({f.path for f in FENCES if f.lang in PYTHON and "slow" in f.flags}))
def test_python_examples_with_slow(page, tmp_path):
    run_python(_page_fences(page, slow=True), tmp_path, timeout=3600)


@pytest.mark.parametrize("fence", list(_shell_params()))
def test_shell_example(fence, tmp_path):
    run_shell(fence, tmp_path, timeout=3600 if "slow" in fence.flags else 600)


def test_fences_are_well_formed():
    """Every fence has a known language and known flags; a skip says why (so none is forgotten)."""
    assert any(f.path == "README.md" and f.lang in PYTHON for f in FENCES)
    for f in FENCES:
        assert f.lang in PYTHON + SHELL + NOT_RUN, (
            f"{f.id}: fence language {f.lang!r} is neither run ({PYTHON + SHELL}) nor known as "
            f"output ({NOT_RUN}); fix the info string or add it to NOT_RUN")
        assert f.flags <= FLAGS, f"{f.id}: unknown fence flag(s) {f.flags - FLAGS}"
        if f.flags & {"skip", "slow"}:
            assert f.why, f"{f.id}: say why the example is marked {sorted(f.flags)}"


def test_parser_reads_markers_and_languages(tmp_path):
    """The collector itself, on a page written here: markers, languages, line numbers."""
    page = tmp_path / "probe.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n<!-- fence: slow — big model -->\n"
                    "```bash\necho hi\n```\n\n```text\nout\n```\n", "utf-8")
    got = parse(page, root=tmp_path)
    assert [(f.lang, f.line, f.code, f.flags, f.why) for f in got] == [
        ("python", 4, "x = 1\n", set(), ""), ("bash", 9, "echo hi\n", {"slow"}, "big model"),
        ("text", 13, "out\n", set(), "")]
    page.write_text("<!-- fence: slow — x -->\n\ntext\n", "utf-8")
    with pytest.raises(ValueError, match="right before a code fence"):
        parse(page, root=tmp_path)
    page.write_text("text\n<!-- fence: skip — x -->\n", "utf-8")
    with pytest.raises(ValueError, match="no fence after it"):
        parse(page, root=tmp_path)


def test_a_failing_example_fails_and_names_its_line(tmp_path):
    """The runner reports a broken example with the Markdown line it broke on."""
    page = tmp_path / "probe.md"
    page.write_text("```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2\n```\n"
                    "\n```bash\nfalse\necho never\n```\n", "utf-8")
    py = [f for f in parse(page, root=tmp_path) if f.lang in PYTHON]
    (tmp_path / "a").mkdir()
    with pytest.raises(AssertionError, match=r'(?s)File "probe.md", line 8'):
        run_python(py, tmp_path / "a", timeout=120)
    sh = [f for f in parse(page, root=tmp_path) if f.lang in SHELL]
    with pytest.raises(AssertionError, match="probe.md:12: the shell example failed"):
        run_shell(sh[0], tmp_path, timeout=60)
