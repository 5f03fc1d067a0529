import pytest

from isouq.study.analysis import study_tables
from isouq.study.report.document import Table
from isouq.study.report.paper_qa import paper_qa_tables
from isouq.study.report.tables import (
    align_columns,
    format_p,
    format_std,
    format_value,
    latex_escape,
    make_table,
    qa_blocks,
    qa_tables,
    to_latex,
    to_markdown,
)

from .conftest import FAST


@pytest.fixture(scope="module")
def study(qa_rows):
    return study_tables(qa_rows, **FAST)


def test_format_value():
    assert format_value(None) == "–"
    assert format_value(float("nan")) == "–"
    assert format_value(3) == "3"
    assert format_value(True) == "yes"
    assert format_value(0.12345) == "0.123"
    assert format_value(0.12345, digits=2) == "0.12"
    assert format_value(1.5e-7) == "1.50e-07"
    assert format_value(0.0) == "0.000"
    assert format_value("m1") == "m1"
    assert format_std(1.39e-17) == "0.000"
    assert format_p(0.0002) == "<0.001" and format_p(0.0456) == "0.046"
    assert format_p(None) == "–" and format_p("<.001") == "<.001"


def test_make_table_merges_std_and_bolds_best():
    rows = [{"method": "a", "X": 0.5, "X ±": 0.1, "Y": 0.9},
            {"method": "b", "X": 0.7, "X ±": 0.2, "Y": None}]
    t = make_table("t", rows, best="column")
    assert t.columns == ("method", "X", "Y")
    assert t.rows == (("a", "0.500 ± 0.100", "0.900"), ("b", "0.700 ± 0.200", "–"))
    assert t.bold == {(1, 1)}  # Y has one number only: nothing to compare
    r = make_table("t", rows, best="row", best_columns=["X", "Y"])
    assert r.bold == {(0, 2)}


def test_markdown_and_latex_rendering():
    t = Table("my_tab", "ρ ‖g‖²", ("a|b", "x_1"), (("1 ± 2", "<0.001 ↑"),),
              frozenset({(0, 1)}), "cap & note")
    md = to_markdown(t)
    assert md.splitlines()[0] == "| a\\|b | x_1 |"
    assert "| 1 ± 2 | **<0.001 ↑** |" in md
    tex = to_latex(t)
    assert r"\begin{tabular}{lc}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"a|b & x\_1 \\" in tex
    assert r"1 $\pm$ 2 & \textbf{$<$0.001 $\uparrow$} \\" in tex
    assert r"\caption{$\rho$ $\|$g$\|^2$. cap \& note}" in tex
    assert r"\label{tab:isouq-my-tab}" in tex
    assert to_markdown(Table("e", "E", ("a",), ())) == "_(no rows)_\n"
    assert latex_escape("50% {x} [y] $") == r"50\% \{x\} {[}y{]} \$"


def test_align_columns():
    t = Table("t", "T", ("m", "B", "A"), (("x", "1", "2"),), frozenset({(0, 2)}))
    a = align_columns(t, ("m", "A", "B"))
    assert a.columns == ("m", "A", "B") and a.rows == (("x", "2", "1"),)
    assert a.bold == {(0, 1)}


def test_qa_tables_shapes(study):
    tables = {t.name: t for t in qa_tables(study)}
    assert list(tables) == ["auroc", "auroc_per_model", "significance", "paired_bootstrap",
                            "correlation", "lomo", "cost", "passes", "prr", "aurac", "raw_auroc"]
    raw = tables["raw_auroc"]
    assert raw.columns[-1] == "score_direction" and len(raw.rows) > 0
    auroc = tables["auroc"]
    assert auroc.columns == ("method", "TruthfulQA", "TriviaQA")
    assert [r[0] for r in auroc.rows] == ["Naive Ent.", "Sem. Ent.", "P(True)", "p̄", "Alea.",
                                          "Epi.", "Epi. log", "Epi. & Alea."]
    assert all(" ± " in c for r in auroc.rows for c in r[1:])
    assert {j for _, j in auroc.bold} == {1, 2}  # one best per dataset column (or ties)
    assert len(tables["auroc_per_model"].rows) == 6
    sig = tables["significance"]
    assert len(sig.rows) == 8  # 4 gradient methods x 2 datasets
    assert all(sig.rows[i][j].endswith(("↑", "↓")) for i, j in sig.bold)
    assert [r[1] for r in tables["lomo"].rows].count("Mean (Std)") == 2
    cost = tables["cost"]
    assert [r[:2] for r in cost.rows] == [("TruthfulQA", "m1"), ("TruthfulQA", "m2"),
                                          ("TruthfulQA", "m3"), ("TriviaQA", "m1"),
                                          ("TriviaQA", "m2"), ("TriviaQA", "m3")]
    passes = {r[0]: r for r in tables["passes"].rows}
    assert passes["Gradient norm (ours)"][1:] == ("1", "1.0×")
    assert passes["Naive Ent."][1:] == ("10", "50.0×")
    assert "95% CI" in tables["paired_bootstrap"].columns


def test_paper_tables_render_like_ours_and_agree_with_each_other():
    paper = paper_qa_tables()
    tables = {t.name: t for t in qa_tables(paper, digits=2)}
    assert "**0.69 ± 0.06**" in to_markdown(tables["auroc"])
    assert "| Passes" not in to_markdown(tables["passes"])
    # The per-model table (tab:qa-per-model) averages to the main table (tab:qa-results).
    for row in paper["auroc"]:
        for ds in ("TriviaQA", "TruthfulQA"):
            per_model = [r[row["method"]] for r in paper["auroc_per_model"] if r["dataset"] == ds]
            assert len(per_model) == 4
            assert abs(sum(per_model) / 4 - row[ds]) <= 0.0101, (row["method"], ds)
    lomo = {(r["dataset"], r["held_out"]): r for r in paper["lomo"]}
    for ds in ("TriviaQA", "TruthfulQA"):
        raw = [r["Raw"] for (d, h), r in lomo.items() if d == ds and h not in ("Mean", "Std")]
        assert abs(sum(raw) / 4 - lomo[(ds, "Mean")]["Raw"]) <= 0.0101


def test_paper_datasets_follow_our_spelling(study):
    lower = {name: [{**r, **({"dataset": r["dataset"].lower()} if "dataset" in r else {})}
                    for r in rows] for name, rows in study.items()}
    for r in lower["auroc"]:
        for ds in ("TruthfulQA", "TriviaQA"):
            r[ds.lower()], r[f"{ds.lower()} ±"] = r.pop(ds), r.pop(f"{ds} ±")
    blocks = {b.name: b for b in qa_blocks(lower, paper_qa_tables())}
    assert blocks["auroc"].paper.columns == ("method", "truthfulqa", "triviaqa")
    assert {r[0] for r in blocks["auroc_per_model"].paper.rows} == {"truthfulqa", "triviaqa"}
