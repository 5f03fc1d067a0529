"""The experiment's tables, summary figure and per-document CSV."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ....data.newsgroups import GROUPS, Newsgroups
from .statistics import correlations, cv, domain_ratios, row_normalize


def method_order(names: Sequence[str]) -> list[str]:
    """representative, identity, the singles, pairs, triples (the paper's row order first)."""
    first = ["representative", "identity", *GROUPS]
    return [n for n in first if n in names] + [n for n in names if n not in first]


def n_domains(name: str) -> int | None:
    """Number of topical groups in a proxy name; None for identity / representative / full."""
    return len(name.split("+")) if all(p in GROUPS for p in name.split("+")) else None


def build_tables(U: dict[str, np.ndarray], ref: np.ndarray, domains: np.ndarray) -> dict:
    """The correlation, domain-ratio and combination tables from the epistemic maps U."""
    names = method_order(list(U))
    corr = [{"covariance": n, "n_domains": n_domains(n), **correlations(U[n], ref)}
            for n in names]
    ratios = []
    for n in names:
        r = domain_ratios(U[n], ref, domains)
        ratios.append({"covariance": n, "n_domains": n_domains(n), **row_normalize(r),
                       "cv": cv(list(r.values())),
                       "lowest_domain": min(r, key=r.get)})
    cvs = {row["covariance"]: row["cv"] for row in ratios}

    def sorted_cvs(k: int) -> list[float]:
        return sorted(v for n, v in cvs.items() if n_domains(n) == k)

    ident = cvs["identity"]
    combo = [{"domains_in_proxy": "identity (none)", "cv_sorted": f"{ident:.2f}", "n": 1}]
    for k, label in ((1, "1 (single domain)"), (2, "2 (pairs)"), (3, "3 (triples)")):
        vals = sorted_cvs(k)
        combo.append({"domains_in_proxy": label, "cv_sorted": ", ".join(f"{v:.2f}" for v in vals),
                      "n": len(vals), "n_below_identity": sum(v < ident for v in vals)})
    combo.append({"domains_in_proxy": "4 (representative)",
                  "cv_sorted": f"{cvs['representative']:.2f}", "n": 1})
    multi = [v for n, v in cvs.items() if (n_domains(n) or 0) >= 2]
    singles = [r for r in ratios if n_domains(r["covariance"]) == 1]
    summary = [{
        "combinations": sum(1 for n in cvs if n_domains(n)),
        "multi_domain_below_identity_cv": sum(v < ident for v in multi),
        "multi_domain": len(multi),
        "singles_lowest_on_own_domain": sum(r["lowest_domain"] == r["covariance"]
                                            for r in singles),
        "singles": len(singles),
        "identity_cv": ident, "representative_cv": cvs["representative"],
        "single_cv_min": min(r["cv"] for r in singles),
        "single_cv_max": max(r["cv"] for r in singles),
    }]
    return {"correlation_vs_full": corr, "domain_ratios": ratios, "combination_cv": combo,
            "summary": summary}


def plot_summary(tables: dict, U: dict[str, np.ndarray], ref: np.ndarray, path: Path) -> Path:
    """Three panels: row-normalized domain ratios (heatmap), CV vs #domains, U vs full."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), constrained_layout=True)
    rows = tables["domain_ratios"]
    M = np.array([[r[d] for d in GROUPS] for r in rows])
    ax = axes[0]
    im = ax.imshow(M, cmap="RdBu_r", vmin=0.0, vmax=2.0, aspect="auto")
    ax.set_xticks(range(len(GROUPS)), GROUPS)
    ax.set_yticks(range(len(rows)), [f"{r['covariance']} (CV {r['cv']:.2f})" for r in rows],
                  fontsize=7)
    for i in range(M.shape[0]):
        for j in range(M.shape[1]):
            ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_title("mean U / mean U_full per test domain, row-normalized")
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax = axes[1]
    cvs = {r["covariance"]: r["cv"] for r in rows}
    for k in (1, 2, 3):
        vals = [v for n, v in cvs.items() if n_domains(n) == k]
        ax.scatter([k] * len(vals), vals, c="tab:blue")
    ax.scatter([4], [cvs["representative"]], c="tab:green", label="representative")
    ax.axhline(cvs["identity"], color="tab:red", ls="--", label="identity")
    ax.set(xticks=[1, 2, 3, 4], xlabel="domains in proxy", ylabel="CV across domains",
           title="CV of all 14 combinations")
    ax.legend()
    ax = axes[2]
    for n, col in (("identity", "tab:red"), ("representative", "tab:green"),
                   ("comp", "tab:purple"), ("talk", "tab:orange")):
        if n in U:
            c = tables["correlation_vs_full"]
            rho = next(r["spearman"] for r in c if r["covariance"] == n)
            ax.scatter(ref / ref.mean(), U[n] / U[n].mean(), s=8, alpha=0.6, c=col,
                       label=f"{n} (ρ {rho:.3f})")
    ax.set(xscale="log", yscale="log", xlabel="full Hessian gᵀCg / mean",
           ylabel="covariance gᵀCg / mean", title="per test document")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_scores_csv(path: Path, test: Newsgroups, domains: np.ndarray, pred: np.ndarray,
                     U: dict[str, np.ndarray]) -> Path:
    """One row per evaluated test document: id, label, group, prediction, every gᵀCg."""
    names = list(U)
    lines = [",".join(["id", "label", "group", "pred", *names])]
    for i in range(len(test)):
        vals = [f"{U[n][i]:.6e}" for n in names]
        lines.append(",".join([test.ids[i], str(int(test.labels[i])), domains[i] or "-",
                               str(int(pred[i])), *vals]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
