import base64
import io
import json
import re

import pytest
from PIL import Image

from isouq.errors import DataError
from isouq.evaluation import label_tables
from isouq.study.analysis import study_tables
from isouq.study.report import build_report
from isouq.study.report.sections import section_title

from .conftest import FAST, gold_rows

LABEL_TABLES = ("label_agreement", "auroc_by_labels", "raw_auroc_by_labels")

STUDY_TABLES = {"auroc", "prr", "aurac", "auroc_per_model", "metrics_per_model", "significance",
                "significance_wide", "paired_bootstrap", "correlation", "lomo", "cost", "raw_auroc"}


def test_writes_every_output(report_dir):
    for name in ("report.html", "tables.md", "tables.tex", "report.json",
                 "qa-study/auroc_bars.png", "qa-study/score_distributions.png",
                 "validation/map.png"):
        assert (report_dir / name).is_file() and (report_dir / name).stat().st_size > 0, name
    assert not list(report_dir.rglob("*.tmp"))


def test_tables_md_has_our_rows_beside_the_papers(report_dir):
    md = (report_dir / "tables.md").read_text(encoding="utf-8")
    assert "## validation" in md and "### Binary" in md
    assert "| linear | 0.930 | 0.980 |" in md and "| xor | 0.610 | 0.700 |" in md
    assert "| linear | 0.950 | 0.990 |" in md  # the paper's
    assert "### Regression" in md and "| linear | 0.980 ± 0.010 |" in md  # paper only
    assert "## Question answering" in md
    for method in ("Naive Ent.", "Sem. Ent.", "P(True)", "Alea.", "Epi.", "Epi. & Alea."):
        assert re.search(rf"^\| {re.escape(method)} \| (\*\*)?[0-9.]+ ± [0-9.]+", md, re.M), method
    assert "| P(True) | 0.55 ± 0.06 | **0.69 ± 0.06** |" in md  # paper, our column order
    assert "| TruthfulQA | Epi. | 0.005 ↑ | 0.575 | 0.985 |" in md.replace("**", "")
    assert "| Pooled | TriviaQA | 23233 | -0.21 | <0.001 |" in md
    assert "| TruthfulQA | Mean (Std) |" in md
    assert "### How good are the labels? Judge and lexical labels against hand labels" in md
    assert "| TriviaQA | m1 | judge | 40 |" in md and "AUROC with hand labels" in md
    assert "| Gradient norm (ours) | 1 | 1.0× |" in md


def test_tables_tex_is_balanced_and_escaped(report_dir):
    tex = (report_dir / "tables.tex").read_text(encoding="utf-8")
    n = tex.count(r"\begin{table}")
    assert n >= 20 and n == tex.count(r"\end{table}") == tex.count(r"\bottomrule")
    assert r"\textbf{" in tex and r"$\pm$" in tex and r"$\uparrow$" in tex
    assert not set("±↑↓ρ‖²×") & set(tex)
    assert r"\label{tab:qa-study-auroc}" in tex and r"\label{tab:validation-binary-paper}" in tex
    for block in tex.split(r"\begin{tabular}{")[1:]:
        spec, body = block.split("}", 1)
        lines = [x for x in body.split(r"\bottomrule")[0].splitlines() if x.endswith(r"\\")]
        assert len(lines) >= 2
        for line in lines:
            assert line.count(" & ") + 1 == len(spec), line
            assert line.replace(r"\$", "").count("$") % 2 == 0, line


def test_report_json_holds_all_tables(report_dir, qa_rows):
    doc = json.loads((report_dir / "report.json").read_text(encoding="utf-8"))
    assert doc["options"] == {**FAST, "log_epistemic": True}
    kinds = [s["kind"] for s in doc["sections"]]
    assert kinds == ["experiment", "qa"]
    exp, qa = doc["sections"]
    assert exp["tables"]["binary"][0] == {"problem": "linear", "GN r": 0.93, "GN ρ": 0.98}
    assert set(exp["paper"]) == {"binary", "regression"} and exp["seed"] == 3
    assert set(qa["tables"]) == STUDY_TABLES | set(LABEL_TABLES)
    file_order = [r for r in qa_rows if r["model"] != "m3"] + [
        r for r in qa_rows if r["model"] == "m3"]
    labels = label_tables(file_order, gold_rows(qa_rows), n_bootstrap=FAST["n_bootstrap"],
                          seed=FAST["seed"])
    assert qa["tables"] == json.loads(json.dumps({**study_tables(file_order, **FAST), **labels}))
    agree = {r["labels"]: r for r in qa["tables"]["label_agreement"] if r["dataset"] == "TriviaQA"}
    assert agree["judge"]["n"] == 40 and agree["judge"]["accuracy"] == pytest.approx(0.8)
    assert doc["inputs"]["gold_files"][0].endswith("m1.gold.jsonl")
    # every 5th label flipped: κ ≈ 0.6, above the warning threshold
    assert all(r["kappa"] > 0.4 for r in qa["tables"]["label_agreement"])
    assert "agree poorly" not in (report_dir / "report.html").read_text(encoding="utf-8")
    assert "auroc" in qa["paper"] and len(qa["source"]) == 2
    assert doc["inputs"]["skipped"] and "cache.jsonl" in doc["inputs"]["skipped"][0]


def test_poor_judge_labels_get_a_warning(tmp_path):
    from .conftest import synth_rows, write_jsonl

    rows = synth_rows(n=20, models=("m1",), datasets=("D",))
    gold = [{"key": r["key"], "dataset": "D", "model": "m1", "gold_correct": i % 2 == 0}
            for i, r in enumerate(rows)]  # unrelated to the judge's labels
    write_jsonl(tmp_path / "rows.jsonl", rows)
    write_jsonl(tmp_path / "m1.gold.jsonl", gold)
    out = build_report([tmp_path / "rows.jsonl", tmp_path / "m1.gold.jsonl"], tmp_path / "o",
                       **FAST)
    k = json.loads((out.parent / "report.json").read_text())["sections"][0]["tables"][
        "label_agreement"][0]["kappa"]
    assert k < 0.4
    assert f"agree poorly with hand labels for m1 on D (κ {k:.2f}, n 20)" in out.read_text()


def _img_sources(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def test_html_links_its_figures_beside_it(report_dir):
    html = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    assert "url(" not in html and "data:" not in html
    srcs = _img_sources(html)
    assert sorted(srcs) == ["qa-study/auroc_bars.png", "qa-study/score_distributions.png",
                            "validation/map.png"]
    for src in srcs:
        with Image.open(report_dir / src) as im:
            im.verify()
            assert im.width > 100 and im.height > 100
    # small: the figures are files, not base64 inside the page
    assert (report_dir / "report.html").stat().st_size < 0.5 * sum(
        (report_dir / s).stat().st_size for s in srcs)
    ids = set(re.findall(r' id="([^"]+)"', html))
    links = re.findall(r'href="#([^"]+)"', html)
    assert len(links) >= 12 and set(links) <= ids
    assert html.count('class="label paper"') >= 8  # the paper's tables beside ours
    assert html.count("<table") >= 20


def test_embedded_figures_make_one_file_that_opens_alone(tmp_path, inputs_root):
    out = build_report([inputs_root / "exp" / "results.json"], tmp_path / "r", embed=True)
    html = out.read_text(encoding="utf-8")
    (src,) = _img_sources(html)
    assert src.startswith("data:image/png;base64,")
    png = base64.b64decode(src.split(",", 1)[1])
    assert png == (out.parent / "validation" / "map.png").read_bytes()
    with Image.open(io.BytesIO(png)) as im:
        im.verify()
    assert "Question answering" not in html
    doc = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))
    assert [s["kind"] for s in doc["sections"]] == ["experiment"]


def test_bad_input_raises_before_writing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="neither"):
        build_report([tmp_path / "empty"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_figure_is_a_note(tmp_path, inputs_root):
    exp = tmp_path / "exp"
    exp.mkdir()
    doc = json.loads((inputs_root / "exp" / "results.json").read_text(encoding="utf-8"))
    doc["figures"] = ["gone.png"]
    (exp / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    html = build_report([exp], tmp_path / "out").read_text(encoding="utf-8")
    assert "gone.png is listed" in html and "<img" not in html


def test_group_without_both_classes_is_left_out_with_a_note(tmp_path):
    from .conftest import synth_rows, write_jsonl

    rows = synth_rows(n=12, models=("m1", "m2"), datasets=("D",))
    for i, r in enumerate(r for r in rows if r["model"] == "m2"):
        r["correct"] = int(i == 0)  # a run in progress: one correct answer so far
    write_jsonl(tmp_path / "rows.jsonl", rows)
    out = build_report([tmp_path / "rows.jsonl"], tmp_path / "out", **FAST)
    doc = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))
    qa = doc["sections"][0]
    assert qa["left_out"] == ["model 'm2' on 'D' left out: 1 correct and 11 incorrect judged "
                              "answers (need 2 of each)"]
    assert {r["model"] for r in qa["tables"]["auroc_per_model"]} == {"m1"}
    assert "Model &#x27;m2&#x27; on &#x27;D&#x27; left out" in out.read_text(encoding="utf-8")
    only = [r for r in rows if r["model"] == "m2"]
    write_jsonl(tmp_path / "m2.jsonl", only)
    # no group can be evaluated: the run is shown as it is, with what is missing
    out2 = build_report([tmp_path / "m2.jsonl"], tmp_path / "out2", **FAST)
    doc2 = json.loads((out2.parent / "report.json").read_text(encoding="utf-8"))
    prev = doc2["sections"][0]
    assert prev["kind"] == "qa_preview" and "Not yet evaluable" in prev["notes"][0]
    assert "Model 'm2' on 'D' left out: 1 correct and 11 incorrect" in prev["notes"][1]
    (group,) = prev["tables"]["qa_preview_groups"]
    assert (group["model"], group["answers"], group["correct"], group["incorrect"]) == \
        ("m2", "12", "1", "11")
    assert len(prev["tables"]["qa_preview_answers"]) == 12
    assert "not yet evaluable" in out2.read_text(encoding="utf-8")


def test_a_three_question_run_renders(tmp_path):
    """A first small run (every answer judged incorrect) renders instead of failing."""
    from .conftest import synth_rows, write_jsonl

    rows = synth_rows(n=3, models=("m1",), datasets=("D",))
    for r in rows:
        r["correct"] = False
    write_jsonl(tmp_path / "rows.jsonl", rows)
    out = build_report([tmp_path / "rows.jsonl"], tmp_path / "out", **FAST)
    html = out.read_text(encoding="utf-8")
    assert "not yet evaluable" in html and "need 2 of each" in html


def test_group_in_progress_gets_a_table_on_its_common_rows(tmp_path):
    from .conftest import synth_rows, write_jsonl

    rows = synth_rows(n=30, models=("m1", "m2"), datasets=("D",), both_classes=True)
    write_jsonl(tmp_path / "done.jsonl", rows)
    out = build_report([tmp_path / "done.jsonl"], tmp_path / "done", **FAST)
    doc = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))
    assert "auroc_common_rows" not in doc["sections"][0]["tables"]  # nothing in progress
    for r in [r for r in rows if r["model"] == "m2"][20:]:
        del r["scores"]["semantic_entropy"]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    out = build_report([tmp_path / "rows.jsonl"], tmp_path / "out", **FAST)
    tables = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))[
        "sections"][0]["tables"]
    (row,) = tables["auroc_common_rows"]
    assert (row["model"], row["n"], row["of"]) == ("m2", 20, 30) and row["Sem. Ent."] is not None
    assert {r["model"]: r["Sem. Ent."] is None for r in tables["auroc_per_model"]} == {
        "m1": False, "m2": True}
    assert "rows every method has scored" in out.read_text(encoding="utf-8")
    assert "rows every method has scored" in (out.parent / "tables.md").read_text("utf-8")


def test_speedups_that_may_mix_machines_get_a_note(tmp_path):
    from .conftest import synth_rows, write_jsonl

    rows = synth_rows(n=12, models=("m1",), datasets=("D",))
    for r in rows:
        r["timed_on"] = {"gradient": "box A", "naive_entropy": "box A", "p_true": "box A",
                         "semantic_entropy": "box B"}  # semantic entropy added elsewhere
    write_jsonl(tmp_path / "rows.jsonl", rows)
    out = build_report([tmp_path / "rows.jsonl"], tmp_path / "out", **FAST)
    cost = json.loads((out.parent / "report.json").read_text(encoding="utf-8"))[
        "sections"][0]["tables"]["cost"]
    assert {r["method"]: r["compared"] for r in cost} == {
        "Gradient norm (ours)": "reference", "P(True)": "same machine (12 rows)",
        "Naive Ent.": "same machine (12 rows)", "Sem. Ent.": "different machines"}
    html = out.read_text(encoding="utf-8")
    assert "Speed-ups that may mix machines (different machines: m1 on D)" in html


def test_two_runs_of_one_experiment_get_titles_that_tell_them_apart():
    assert section_title("scaling", "run1") == "scaling"  # the only run of it
    assert section_title("scaling", "scaling", runs=2) == "scaling"
    assert section_title("proxy-bias-2d", "proxy_bias_2d", runs=2) == "proxy-bias-2d"
    assert section_title("scaling", "scaling_vi_fan_in", 2) == "scaling — scaling_vi_fan_in"
