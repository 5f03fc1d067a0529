"""The generated tables of the docs: every marked block equals what its kept files give, and the
marker replacement itself (on pages written here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from isouq.study.report import docs_tables as dt

ROOT = Path(__file__).resolve().parents[2]


def test_every_marked_table_matches_its_kept_files():
    """CI fails here when a doc table and its file disagree: run
    ``python -m isouq.study.report.docs_tables --write`` and commit the docs."""
    stale = dt.check(ROOT)
    assert not stale, "\n".join(stale) + "\nrun: python -m isouq.study.report.docs_tables --write"


def test_every_marked_block_names_a_registered_table_and_the_docs_use_some():
    used = {b.name for p in dt.pages(ROOT) for b in dt.find_blocks(p.read_text("utf-8"), str(p))}
    assert used <= set(dt.TABLES), sorted(used - set(dt.TABLES))
    assert {"score_sequences", "results_headline", "qa_study_auroc"} <= used


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


@pytest.mark.parametrize("x, want", [(0.08687, "0.0869"), (1.1460, "1.15"), (1256.68, "1,260"),
                                     (199.58, "200"), (9.9996, "10.0"), (-2.2281, "−2.23"),
                                     (0, "0"), (None, "–"), (float("nan"), "–")])
def test_significant_digits(x, want):
    assert dt.sig(x) == want
