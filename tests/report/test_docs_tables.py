"""The docs' tables and values (``tools/docs_tables.py``, repository tooling outside the installed
package): every table file and value equals what its kept files give, every one is used, none is a
sentence, and the marker replacement itself works (on pages written here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import by_path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"\s*$', re.M)


def _load_tool():
    """``tools/docs_tables.py`` as the module ``docs_tables`` (it is not in the package)."""
    return by_path.module("tools/docs_tables.py", register=True)


dt = _load_tool()


def _included() -> dict[str, list[str]]:
    """{table file name: [pages that include it]} over docs/*.md."""
    out: dict[str, list[str]] = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name in INCLUDE.findall(page.read_text("utf-8")):
            out.setdefault(name, []).append(page.name)
    return out


def test_every_table_file_and_value_matches_its_kept_files():
    """CI fails here when a table file or value and its kept files disagree: run
    ``python tools/docs_tables.py --write``, read the sentences beside them again, commit."""
    stale = dt.check(ROOT)
    assert not stale, "\n".join(stale) + "\nrun: python tools/docs_tables.py --write"


def test_the_tool_is_small_and_not_in_the_installed_package():
    assert not list((ROOT / "src").rglob("docs_tables.py"))
    assert len((ROOT / "tools" / "docs_tables.py").read_text("utf-8").splitlines()) <= 500


def test_line_budgets_of_readme_and_docs():
    """README for a five-minute read; the docs (pages and table files) within their budget."""
    lines = {p: len(p.read_text("utf-8").splitlines())
             for p in [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "tables").glob("*.md")]}
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) <= 120
    assert sum(lines.values()) <= 3000, sum(lines.values())
    assert lines[ROOT / "docs" / "performance.md"] <= 250


def test_every_included_table_exists_and_every_rendered_table_is_included():
    included = _included()
    for name, where in included.items():
        assert (ROOT / dt.TABLES_DIR / name).is_file(), f"{where} include the missing {name}"
    assert {f"{n}.md" for n in dt.TABLES} <= set(included), sorted(
        {f"{n}.md" for n in dt.TABLES} - set(included))


def test_every_value_is_registered_and_used_and_is_a_number_not_a_sentence():
    used = {name for p in dt.pages(ROOT) for _, name, _ in dt.values_of(p.read_text("utf-8"))[1]}
    assert used <= set(dt.VALUES), sorted(used - set(dt.VALUES))
    assert set(dt.VALUES) <= used, f"registered but on no page: {sorted(set(dt.VALUES) - used)}"
    for name in dt.VALUES:
        text = dt.render_value(name, ROOT)
        assert re.search(r"\d", text) and len(text.split()) <= 10, (name, text)
        for src in dt.VALUES[name][0]:
            assert list(ROOT.glob(src)), src


@pytest.mark.parametrize("name", sorted(dt.TABLES))
def test_every_table_renders_a_grid_from_the_kept_files(name):
    lines = dt.render(name, ROOT).splitlines()
    assert lines[0].startswith("| ") and set(lines[1]) <= set("|-") and len(lines) >= 3
    assert all(line.count("|") == lines[0].count("|") for line in lines), lines
    for src in dt.TABLES[name][0]:
        assert (ROOT / src).exists(), src


def _site(tmp_path: Path, body: str) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# readme\n", "utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(body, "utf-8")
    return page


@pytest.fixture
def fake(monkeypatch):
    """A table ``fake`` and a value ``fv`` whose content the test sets."""
    state = {"rows": [["1", "2"]], "text": "4.9×"}
    monkeypatch.setattr(dt, "TABLES", {"fake": (("data.json",), lambda root: dt.grid(
        ["a", "b"], state["rows"]))})
    monkeypatch.setattr(dt, "VALUES", {"fv": (("v.json",), lambda root: state["text"])})
    return state


PAGE = ("# T\n\nghost is <!-- value: fv -->5.0×<!-- /value --> faster, again "
        "<!--value:fv-->4.9×<!--/value-->.\n\n--8<-- \"fake.md\"\n\n"
        "a `<!-- value: fv -->shown as code<!-- /value -->`\n"
        "```text\n<!-- value: fv -->in a fence<!-- /value -->\n```\n")


def test_check_names_what_is_stale_and_write_rewrites_only_that(tmp_path, fake):
    page = _site(tmp_path, PAGE)
    stale = dt.check(tmp_path)
    assert stale[0].startswith("docs/tables/fake.md: missing")
    assert stale[1] == "docs/page.md:3: value fv is '5.0×', the files give '4.9×'"
    assert len(stale) == 2 and page.read_text("utf-8") == PAGE  # --check writes nothing
    assert dt.main(["--check", "--root", str(tmp_path)]) == 1
    assert dt.main(["--write", "--root", str(tmp_path)]) == 0
    assert page.read_text("utf-8") == PAGE.replace(">5.0×<", ">4.9×<")  # code and fences kept
    assert (tmp_path / "docs/tables/fake.md").read_text("utf-8") == "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert dt.check(tmp_path) == [] and dt.main(["--check", "--root", str(tmp_path)]) == 0
    fake["rows"], fake["text"] = [["1", "3"]], "4.6–5.9×"  # the files changed: stale again
    assert [m.split(":")[0] for m in dt.check(tmp_path)] == ["docs/tables/fake.md", "docs/page.md",
                                                             "docs/page.md"]


def test_unknown_names_and_bad_values_are_errors(tmp_path, fake):
    _site(tmp_path, "x <!-- value: nosuch -->1<!-- /value -->\n")
    with pytest.raises(KeyError, match="no value named 'nosuch'"):
        dt.check(tmp_path)
    assert dt.main(["--check", "--root", str(tmp_path)]) == 2
    fake["text"] = "two\nlines"
    with pytest.raises(ValueError, match="one non-empty line"):
        dt.render_value("fv", tmp_path)
    with pytest.raises(KeyError, match="no table named"):
        dt.render("nosuch", tmp_path)
    with pytest.raises(ValueError, match="registered twice"):
        dt.value("fv")(lambda root: "1")


@pytest.mark.parametrize("vals, want", [([1.034, 1.2], "1.03–1.20"), ([4.9, 4.9], "4.90"),
                                        ([2.0], "2.00")])
def test_span_of_values(vals, want):
    assert dt.span(vals, lambda x: dt.fixed(x, 2)) == want


@pytest.mark.parametrize("x, want", [(0.08687, "0.0869"), (1.1460, "1.15"), (1256.68, "1,260"),
                                     (199.58, "200"), (9.9996, "10.0"), (-2.2281, "−2.23"),
                                     (0, "0"), (None, "–"), (float("nan"), "–")])
def test_significant_digits(x, want):
    assert dt.sig(x) == want


def test_a_kept_markdown_table_is_copied_as_its_script_wrote_it(tmp_path):
    (tmp_path / "k.md").write_text("# t\nnote\n\n| a |\n|---|\n| 1 |\n\n| b |\n|---|\n| 2 |\n")
    assert dt.kept(tmp_path, "k.md") == "| a |\n|---|\n| 1 |\n"
    assert dt.kept(tmp_path, "k.md", 1) == "| b |\n|---|\n| 2 |\n"


# --------------------------------------------------------------------------- LM-Polygraph


# A recomputed bootstrap bound may move in its last shown digit on another CPU (BLAS summation
# order, the order of tied values): numbers are compared, a point value to its rounding, an
# interval bound within BOUND_TOL, a rank bound within one place.
POINT_TOL = 1.5e-3
BOUND_TOL = 5e-3
_NUMBER = re.compile(r"[-−]?\d+(?:\.\d+)?(?:e[-−+]?\d+)?")


def _numbers(text: str) -> list[float]:
    """The numbers of a shown cell, ``−0.029 [−0.062, 2.92e-04]`` → [-0.029, -0.062, 0.000292]."""
    return [float(m.replace("−", "-")) for m in _NUMBER.findall(text)]


def _close(shown: str, recomputed: str) -> bool:
    """A value with its interval, shown against recomputed: point to its rounding, bounds within
    BOUND_TOL."""
    a, b = _numbers(shown), _numbers(recomputed)
    tols = [POINT_TOL] + [BOUND_TOL] * (len(a) - 1)
    return len(a) == len(b) and all(abs(x - y) <= t for x, y, t in zip(a, b, tols, strict=True))


def test_numbers_of_a_cell_compare_within_tolerance():
    assert _numbers("−0.029 [−0.062, 2.92e-04]") == [-0.029, -0.062, 0.000292]
    assert _close("0.269 [0.207, 0.331]", "0.269 [0.207, 0.330]")
    assert not _close("0.269 [0.207, 0.331]", "0.279 [0.207, 0.331]")
    assert not _close("0.269 [0.207, 0.331]", "0.269 [0.207, 0.351]")
    assert not _close("0.269 [0.207, 0.331]", "0.269")


def test_polygraph_ranks_are_the_kept_files_ranked_again():
    """The rank table (read from the kept report) equals the ranks recomputed from the kept
    benchmark files and their learned heads (``heads/``) with the report's own bootstrap
    settings, number by number within the tolerances above."""
    from isouq.study.report.polygraph import (
        load_heads,
        load_polygraph,
        polygraph_files,
        rank_row,
        setting_stats,
        with_extra,
    )

    opts = dt.load(ROOT, dt.PG_REPORT)["options"]
    ranks = []
    for path in polygraph_files(ROOT / dt.PG):  # the ranks as polygraph_tables makes them
        doc = load_polygraph(path)
        heads = load_heads(path, doc)
        for metric in doc["quality_metrics"]:
            dm = with_extra(doc, heads, metric)
            st = setting_stats(dm, metric, n_bootstrap=opts["n_bootstrap"], seed=opts["seed"])
            ranks.append(rank_row(dm, metric, st))
    lines = (ROOT / dt.TABLES_DIR / "polygraph_ranks.md").read_text("utf-8").splitlines()[2:]
    assert len(lines) == len(ranks)
    for line, r in zip(lines, ranks, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == r["quality"] and cells[2].startswith(f"{r['n']} (")
        if r["verdict"].startswith("not rankable"):
            assert cells[4] == "not rankable"
            continue
        assert cells[3] == r["isouq best"] and cells[6] == r["best LM-Polygraph"]
        assert _close(cells[4], r["its PRR [95% CI]"]), (cells[4], r["its PRR [95% CI]"])
        rank, of, lo, hi = (int(x) for x in _numbers(cells[5].replace("–", " ")))
        r_lo, r_hi = (int(x) for x in r["rank 95% CI"].split("–"))
        assert (rank, of) == (r["_rank"], r["_of"])
        assert abs(lo - r_lo) <= 1 and abs(hi - r_hi) <= 1, (cells[5], r["rank 95% CI"])
        assert _close(cells[8], r["difference [95% CI]"]), (cells[8], r["difference [95% CI]"])
        assert cells[8].replace("e-", "e").count("-") == 0  # minus signs shown as −


def test_polygraph_cost_has_one_row_per_kept_benchmark_file():
    """The cost table beside the verdict covers every kept model × dataset, isouq's column from
    the report's cost of its scores."""
    files = sorted((ROOT / dt.PG).glob("polygraph__*.json"))
    rows = dt.render("polygraph_cost", ROOT).splitlines()[2:]
    assert len(rows) == len(files) and len(files) >= 8
    cost = {(r["model"], r["dataset"]): r for r in dt._pg(ROOT)["cost"]}
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        r = next(v for (m, d), v in cost.items() if dt.setting(m, d) == cells[0])
        assert cells[2] == r["IsouqEpistemic"]
