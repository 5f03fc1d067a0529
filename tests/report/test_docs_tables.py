"""The generated tables and values of the docs (``tools/docs_tables.py``, repository tooling
outside the installed package): every marked block and value equals what its kept files give,
and the marker replacement itself (on pages written here)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_tool():
    """``tools/docs_tables.py`` as the module ``docs_tables`` (it is not in the package)."""
    if "docs_tables" in sys.modules:
        return sys.modules["docs_tables"]
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "tools" / "docs_tables.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = mod  # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


dt = _load_tool()


def test_every_marked_table_and_value_matches_its_kept_files():
    """CI fails here when a doc table or value and its file disagree: run
    ``python tools/docs_tables.py --write`` and commit the docs."""
    stale = dt.check(ROOT)
    assert not stale, "\n".join(stale) + "\nrun: python tools/docs_tables.py --write"


def test_the_tool_is_not_in_the_installed_package():
    """Repository tooling stays out of the wheel: nothing under src/ holds it."""
    assert not list((ROOT / "src").rglob("docs_tables.py"))


def test_every_marked_block_names_a_registered_table_and_the_docs_use_some():
    used = {b.name for p in dt.pages(ROOT) for b in dt.find_blocks(p.read_text("utf-8"), str(p))}
    assert used <= set(dt.TABLES), sorted(used - set(dt.TABLES))
    assert {"score_sequences", "results_headline", "qa_study_auroc"} <= used


def test_every_marked_value_names_a_registered_value_and_every_value_is_used():
    used = {f.name for p in dt.pages(ROOT) for f in dt.find_values(p.read_text("utf-8"), str(p))}
    assert used <= set(dt.VALUES), sorted(used - set(dt.VALUES))
    assert set(dt.VALUES) <= used, f"registered but on no page: {sorted(set(dt.VALUES) - used)}"


@pytest.mark.parametrize("name", sorted(dt.VALUES))
def test_every_registered_value_renders_one_line_from_the_kept_files(name):
    text = dt.render_value(name, ROOT)
    assert text.strip() and "\n" not in text and "<!--" not in text
    for src in dt.VALUES[name].sources:
        assert list(ROOT.glob(src)), src


@pytest.mark.parametrize("name", sorted(dt.TABLES))
def test_every_registered_table_renders_from_the_kept_files(name):
    md = dt.render(name, ROOT)
    lines = md.splitlines()
    assert lines[0].startswith("| ") and set(lines[1]) <= set("|-") and len(lines) >= 3
    assert all(line.count("|") == lines[0].count("|") for line in lines), md
    for src in dt.TABLES[name].sources:
        assert (ROOT / src).exists(), src


def test_paper_sizes_columns_and_three_significant_digits():
    lines = dt.render("paper_sizes", ROOT).splitlines()
    assert lines[0] == "| " + " | ".join(dt.PAPER_SIZES_COLUMNS) + " |"
    assert len(lines) == 2 + len(dt._json(ROOT, dt.PAPER_SIZES)["table"])


@pytest.fixture
def fake_table(monkeypatch):
    """A registered table ``fake`` whose content the test sets (``state["rows"]``)."""
    state = {"rows": [["1", "2"]]}
    monkeypatch.setitem(dt.TABLES, "fake", dt.DocTable(
        "fake", ("data.json",), lambda root: dt._grid(["a", "b"], state["rows"])))
    return state


def _site(tmp_path: Path, body: str) -> Path:
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# readme, no tables\n", "utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(body, "utf-8")
    return page


PAGE = ("# Title\n\nText before, kept  as is.\n\n<!-- table: fake -->\n| old | table |\n|---|---|\n"
        "| 9 | 9 |\n<!-- /table -->\n\nText after.\n\n<!--table:fake-->\n\n<!-- /table -->\n")


def test_check_names_stale_blocks_and_write_replaces_only_their_content(tmp_path, fake_table):
    page = _site(tmp_path, PAGE)
    stale = dt.check(tmp_path)
    assert [m.split(":")[:2] for m in stale] == [["docs/page.md", "5"], ["docs/page.md", "13"]]
    assert all("table fake differs from data.json" in m for m in stale)
    assert page.read_text("utf-8") == PAGE  # --check writes nothing

    assert len(dt.write(tmp_path)) == 2
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert page.read_text("utf-8") == (
        "# Title\n\nText before, kept  as is.\n\n<!-- table: fake -->\n" + table
        + "<!-- /table -->\n\nText after.\n\n<!--table:fake-->\n" + table + "<!-- /table -->\n")
    assert dt.check(tmp_path) == [] and dt.write(tmp_path) == []

    fake_table["rows"] = [["1", "3"]]  # the file changed: the doc is stale again
    assert len(dt.check(tmp_path)) == 2


def test_blank_lines_around_a_current_table_are_kept(tmp_path, fake_table):
    body = "<!-- table: fake -->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<!-- /table -->\n"
    page = _site(tmp_path, body)
    assert dt.check(tmp_path) == [] and dt.write(tmp_path) == []
    assert page.read_text("utf-8") == body


def test_malformed_markers_and_unknown_names_are_errors(tmp_path, fake_table):
    with pytest.raises(ValueError, match="never closed"):
        dt.find_blocks("<!-- table: fake -->\n| a |\n")
    with pytest.raises(ValueError, match="no <!-- table: NAME --> before it"):
        dt.find_blocks("text\n<!-- /table -->\n")
    with pytest.raises(ValueError, match="opened inside the block"):
        dt.find_blocks("<!-- table: fake -->\n<!-- table: fake -->\n<!-- /table -->\n")
    _site(tmp_path, "<!-- table: nosuch -->\n<!-- /table -->\n")
    with pytest.raises(KeyError, match="no generated table named 'nosuch'"):
        dt.check(tmp_path)


def test_command_line_check_exit_status(tmp_path, fake_table, capsys):
    _site(tmp_path, PAGE)
    assert dt.main(["--check", "--root", str(tmp_path)]) == 1
    assert "docs/page.md:5: table fake" in capsys.readouterr().out
    assert dt.main(["--write", "--root", str(tmp_path)]) == 0
    assert dt.main(["--check", "--root", str(tmp_path)]) == 0
    _site(tmp_path / "other", "<!-- table: fake -->\n")
    assert dt.main(["--check", "--root", str(tmp_path / "other")]) == 2


@pytest.fixture
def fake_value(monkeypatch):
    """A registered value ``fv`` whose text the test sets (``state["text"]``)."""
    state = {"text": "4.9×"}
    monkeypatch.setitem(dt.VALUES, "fv", dt.DocTable("fv", ("v.json",), lambda root: state["text"]))
    return state


VALUE_PAGE = ("# T\n\nghost is <!-- value: fv -->5.0×<!-- /value --> faster, and again "
              "<!--value:fv-->4.9×<!--/value-->.\n\n<!-- table: fake -->\n| a | b |\n|---|---|\n"
              "| 1 | 2 |\n<!-- /table -->\nlast <!-- value: fv --><!-- /value -->\n")


def test_values_check_names_stale_fragments_and_write_replaces_only_them(tmp_path, fake_table,
                                                                        fake_value):
    page = _site(tmp_path, VALUE_PAGE)
    stale = dt.check(tmp_path)
    assert [m.split(":")[:2] for m in stale] == [["docs/page.md", "3"], ["docs/page.md", "10"]]
    assert "value fv differs from v.json (page: '5.0×', files: '4.9×')" in stale[0]
    assert page.read_text("utf-8") == VALUE_PAGE  # --check writes nothing
    assert len(dt.write(tmp_path)) == 2
    assert page.read_text("utf-8") == VALUE_PAGE.replace(">5.0×<", ">4.9×<").replace(
        "--><!-- /value -->", "-->4.9×<!-- /value -->")
    assert dt.check(tmp_path) == []
    fake_value["text"] = "4.6–5.9×"  # the files changed: every fragment is stale again
    assert len(dt.check(tmp_path)) == 3
    assert dt.main(["--check", "--root", str(tmp_path)]) == 1
    assert dt.main(["--write", "--root", str(tmp_path)]) == 0
    assert page.read_text("utf-8").count(">4.6–5.9×<") == 3


def test_malformed_value_markers_and_bad_values_are_errors(tmp_path, fake_value):
    with pytest.raises(ValueError, match="not closed on its line"):
        dt.find_values("a <!-- value: fv -->1\n2<!-- /value -->\n")
    with pytest.raises(ValueError, match="no <!-- value: NAME --> before it"):
        dt.find_values("a 1<!-- /value -->\n")
    with pytest.raises(ValueError, match="begins with <!-- value: fv -->"):
        dt.find_values("text\n  <!-- value: fv -->1<!-- /value --> more\n")
    with pytest.raises(ValueError, match="begins with"):
        dt.find_values("- <!-- value: fv -->1<!-- /value --> more\n")
    with pytest.raises(ValueError, match="opened inside value"):
        dt.find_values("a <!-- value: fv --><!-- value: fv -->1<!-- /value --><!-- /value -->\n")
    fake_value["text"] = "two\nlines"
    with pytest.raises(ValueError, match="one non-empty line"):
        dt.render_value("fv", tmp_path)
    _site(tmp_path, "x <!-- value: nosuch -->1<!-- /value -->\n")
    with pytest.raises(KeyError, match="no generated value named 'nosuch'"):
        dt.check(tmp_path)
    assert dt.main(["--check", "--root", str(tmp_path)]) == 2


def test_value_markers_shown_as_code_are_not_values():
    text = ("a `<!-- value: x -->` marker shown as code, ``<!-- /value -->`` too\n"
            "```text\n<!-- value: x -->1<!-- /value -->\n```\n"
            "b <!-- value: fv -->`1`<!-- /value -->\n")
    assert [(f.name, f.line) for f in dt.find_values(text)] == [("fv", 4)]


def test_a_name_is_registered_once_across_tables_and_values():
    with pytest.raises(ValueError, match="registered twice"):
        dt.value("score_sequences")(lambda root: "x")


@pytest.mark.parametrize("vals, want", [([1.034, 1.2], "1.03–1.20"), ([4.9, 4.9], "4.90"),
                                        ([2.0], "2.00")])
def test_span_of_values(vals, want):
    assert dt.span(vals, lambda x: dt.fixed(x, 2)) == want


@pytest.mark.parametrize("x, want", [(0.08687, "0.0869"), (1.1460, "1.15"), (1256.68, "1,260"),
                                     (199.58, "200"), (9.9996, "10.0"), (-2.2281, "−2.23"),
                                     (0, "0"), (None, "–"), (float("nan"), "–")])
def test_significant_digits(x, want):
    assert dt.sig(x) == want


# --------------------------------------------------------------------------- polygraph.md


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
        polygraph_tables,
    )

    report = dt._json(ROOT, dt.POLYGRAPH_REPORT)
    opts = report["options"]
    paths = polygraph_files(ROOT / dt.POLYGRAPH)
    docs = [load_polygraph(p) for p in paths]
    heads = [load_heads(p, d) for p, d in zip(paths, docs, strict=True)]  # as the report does
    ranks = polygraph_tables(docs, n_bootstrap=opts["n_bootstrap"], seed=opts["seed"],
                             heads=heads)["ranks"]
    lines = dt.render("polygraph_ranks", ROOT).splitlines()[2:]
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


def _polygraph_file(folder: Path, dataset: str, cost: dict) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "isouq-polygraph", "dataset": dataset, "model": "smollm2", "questions": [],
           "estimators": list(cost), "isouq_estimators": ["IsouqEpistemic", "IsouqAleatoric"],
           "quality_metrics": ["Accuracy"],
           "cost": {"generation_s_per_answer": 12.345, "generation_median_batch_s_per_answer": 1,
                    "estimators": {e: {"s_per_answer": t, "median_batch_s_per_answer": m}
                                   for e, (t, m) in cost.items()}}}
    (folder / f"polygraph__{dataset}__smollm2.json").write_text(json.dumps(doc), "utf-8")


def test_polygraph_cost_groups_estimators_and_reads_every_kept_file(tmp_path):
    folder = tmp_path / dt.POLYGRAPH
    _polygraph_file(folder, "truthfulqa", {
        "IsouqEpistemic": (9.712, 8.6), "IsouqAleatoric": (9.7125, 8.6),
        "MaximumSequenceProbability": (0.0, 0.0), "Perplexity": (0.0019, 0.0),
        "RAUQ": (0.0021, 0.001), "RAUQ (entropy)": (5.0, 5.0),
        "AttentionScore (layer=3)": (1.0, 1.0), "AttentionScore (layer=9)": (2.0, 2.5),
        "CSL": (0.5, 0.25)})
    _polygraph_file(folder, "triviaqa", {"IsouqEpistemic": (1.0, 1.0), "CSL": (0.001, 0.0)})
    lines = dt.render("polygraph_cost", tmp_path).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {c[0]: dict(zip(header, c, strict=True)) for c in
            ([x.strip() for x in line.strip("|").split("|")] for line in lines[2:])}
    assert list(rows) == ["SmolLM2 × TriviaQA", "SmolLM2 × TruthfulQA"]  # the docs' order
    t = rows["SmolLM2 × TruthfulQA"]
    assert t["greedy generation (shared)"] == "12.3 (1.00)"
    assert t["isouq (all four, one backward per batch)"] == "9.71 (8.60)"  # one value for both
    # RAUQ (entropy) is not RAUQ; one of three above the threshold: each value shown once
    assert t["MSP, perplexity, RAUQ"] == "0 (0) / 0.00190 (0) / 0.00210 (0.00100)"
    assert t["AttentionScore"] == "1.00 (1.00) / 2.00 (2.50)"  # every layer's
    assert t["CSL"] == "0.500 (0.250)" and t["PTrue"] == dt.MISSING
    assert rows["SmolLM2 × TriviaQA"]["CSL"] == "< 0.002"
    with pytest.raises(FileNotFoundError, match="results/polygraph"):
        dt.render("polygraph_cost", tmp_path / "nowhere")


@pytest.mark.parametrize("cell, want", [("-0.024 [-0.049, -0.004]", (-0.049, -0.004)),
                                        ("-0.025 [-0.046, 2.92e-04]", (-0.046, 2.92e-04)),
                                        ("0.1 [−1.5e-05, 0.3]", (-1.5e-05, 0.3))])
def test_a_difference_interval_is_read_as_the_report_writes_it(cell, want):
    assert dt._difference_interval({"difference [95% CI]": cell}) == pytest.approx(want)


def _heads_report(root: Path, rows: list[dict]) -> None:
    """A kept report whose LM-Polygraph section holds only ``rows`` of its heads table."""
    import json

    path = root / dt.POLYGRAPH_REPORT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sections": [{"id": "lm-polygraph-benchmark", "notes": [],
                                              "tables": {"heads": rows}}]}), "utf-8")


def _head(head: str, dataset: str, verdict: str, delta: str, vs_block: str | None = None) -> dict:
    row = {"model": "smollm2", "dataset": dataset, "quality": "ROUGE-L", "head": head,
           "Δ PRR vs MSP": delta, "verdict": verdict}
    if vs_block:
        row[f"vs {dt.TRUST_HEAD}"] = vs_block
    return row


def test_the_trust_prose_counts_names_and_judges_the_kept_heads(tmp_path):
    """The prose values of docs/trust.md follow the heads table: a head below MSP in one
    setting does not meet the goal, the settings of each verdict are named, the largest gain is
    the stacked head's largest Δ, and the transfer counts only the settings it was judged in."""
    from isouq.study.analysis.learned_heads import STACKED

    ahead, within, below = ("ahead of MSP beyond noise", "within noise of MSP",
                            "below MSP beyond noise")
    block_ahead = f"ahead of {dt.TRUST_HEAD} beyond noise"
    rows = [_head(STACKED.name, "triviaqa", ahead, "0.020 [0.001, 0.040]", block_ahead),
            _head(STACKED.name, "truthfulqa", ahead, "0.150 [0.100, 0.200]", block_ahead),
            _head(dt.TRUST_HEAD, "triviaqa", below, "-0.030 [-0.050, -0.010]"),
            _head(dt.TRUST_HEAD, "truthfulqa", ahead, "0.120 [0.080, 0.160]"),
            _head(f"{STACKED.name} (trained on triviaqa)", "truthfulqa", within,
                  "0.010 [-0.020, 0.040]"),
            _head(f"{dt.TRUST_HEAD} (trained on triviaqa)", "truthfulqa", below,
                  "-0.050 [-0.080, -0.020]"),
            _head(f"{dt.TRUST_HEAD} (trained on truthfulqa)", "triviaqa", below,
                  "-0.050 [-0.080, -0.020]"),
            {**_head(STACKED.name, "triviaqa", "not rankable", "0 [0, 0]"),
             "quality": "accuracy"}]
    _heads_report(tmp_path, rows)
    goal = dt.render_value("trust_goal", tmp_path)
    assert goal.startswith(f"met on the kept run by “{STACKED.name}”")
    assert f"“{dt.TRUST_HEAD}”" in goal.split(" and not by ")[1]  # below MSP in one setting
    assert dt.render_value("trust_stacked_vs_msp", tmp_path) == (
        "over the 2 rankable settings, ahead beyond noise in 2 (SmolLM2 × TriviaQA ROUGE-L; "
        "SmolLM2 × TruthfulQA ROUGE-L), within noise in 0 and below in 0")
    assert dt.render_value("trust_largest_stacked_gain", tmp_path) == (
        "on SmolLM2 × TruthfulQA ROUGE-L the stacked head's PRR is 0.150 [0.100, 0.200] ahead "
        "of MSP's, the block head's 0.120 [0.080, 0.160]")
    # the block head transferred is below in two settings, one of them where the stack was judged
    assert dt.render_value("trust_transfer_stacked", tmp_path) == (
        "over 1 rankable settings: ahead of MSP in 0, within noise in 1, below in 0; the block "
        "head transferred is below in 1 of the same")
    rows[1] = _head(STACKED.name, "truthfulqa", below, "-0.010 [-0.020, -0.001]")
    _heads_report(tmp_path, rows)
    assert dt.render_value("trust_goal", tmp_path) == "met by no head on the kept run"


def test_the_fresh_answers_value_counts_each_heads_verdicts(tmp_path):
    """``trust_fresh_answers`` reads scripts/polygraph/fresh.py's rows: which questions, and per
    head the rankable settings by verdict, the ahead and below ones named with their Δ."""
    from isouq.study.analysis.learned_heads import STACKED

    rows = [{**_head(STACKED.name, "truthfulqa", "ahead of MSP beyond noise",
                     "0.150 [0.100, 0.200]"), "questions": "337–500"},
            {**_head(STACKED.name, "triviaqa", "within noise of MSP", "0.010 [-0.020, 0.040]"),
             "questions": "337–500"},
            {**_head(dt.TRUST_HEAD, "triviaqa", "below MSP beyond noise",
                     "-0.030 [-0.050, -0.010]"), "questions": "337–500"},
            {**_head(dt.TRUST_HEAD, "truthfulqa", "not rankable", "0 [0, 0]"),
             "questions": "337–500"}]
    path = tmp_path / dt.POLYGRAPH_FRESH
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
    assert dt.render_value("trust_fresh_answers", tmp_path) == (
        "questions 337–500 of each dataset, the stacked head against MSP: over 2 rankable "
        "settings, ahead beyond noise in 1 (SmolLM2 × TruthfulQA ROUGE-L: 0.150 [0.100, 0.200]), "
        "within noise in 1 and below in 0; the block head: over 1 rankable settings, ahead "
        "beyond noise in 0, within noise in 0 and below in 1 (SmolLM2 × TriviaQA ROUGE-L: "
        "−0.030 [−0.050, −0.010]). On these answers the stacked head does not meet the goal")
