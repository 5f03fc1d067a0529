import copy

import numpy as np
from PIL import Image

from isouq.study.report.figures import metric_bars, score_distributions
from isouq.study.report.paper_qa import paper_qa_tables

from .conftest import synth_rows


def test_metric_bars_with_paper_markers_and_missing_values(tmp_path):
    rows = [{"method": "P(True)", "TriviaQA": 0.6, "TriviaQA ±": 0.05, "Other": None},
            {"method": "Alea.", "TriviaQA": 0.7, "TriviaQA ±": None, "Other": 0.55}]
    p = metric_bars(rows, tmp_path / "bars.png", paper_rows=paper_qa_tables()["auroc"])
    with Image.open(p) as im:
        assert im.format == "PNG" and im.width > 400 and im.height > 200


def test_score_distributions_tolerates_missing_and_tiny_groups(tmp_path):
    rows = copy.deepcopy(synth_rows(n=6, models=("a", "b"), datasets=("D",)))
    for r in rows:
        del r["scores"]["semantic_entropy"]
        r["scores"]["epistemic"] = 0.0 if r["key"].endswith("-0") else r["scores"]["epistemic"]
    rows[1]["scores"]["p_true"] = None
    p = score_distributions(rows, tmp_path / "dist.png")
    with Image.open(p) as im:
        arr = np.asarray(im.convert("L"))
    assert arr.shape[0] > 200 and arr.std() > 5  # something was drawn


def test_save_png_keeps_matplotlibs_pixels_in_a_smaller_file(tmp_path):
    import matplotlib.pyplot as plt

    from isouq.study.report.figures import save_png

    rng = np.random.default_rng(0)
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter(rng.normal(size=200), rng.normal(size=200), c=rng.uniform(size=200), alpha=0.6)
    ax.set_title("a figure with antialiased text and many colours")
    fig.savefig(tmp_path / "plain.png", dpi=100)  # matplotlib's own file, RGBA
    p = save_png(fig, tmp_path / "small.png", dpi=100)
    plt.close(fig)
    with Image.open(tmp_path / "plain.png") as a, Image.open(p) as b:
        assert a.mode == "RGBA" and b.mode == "RGB" and b.format == "PNG"
        assert (np.asarray(a.convert("RGB")) == np.asarray(b)).all()  # lossless
    assert p.stat().st_size < (tmp_path / "plain.png").stat().st_size
    assert not list(tmp_path.glob("*.tmp"))
    again = save_png(fig, tmp_path / "again.png", dpi=100)
    assert again.read_bytes() == p.read_bytes()  # no date in the file: same figure, same bytes
