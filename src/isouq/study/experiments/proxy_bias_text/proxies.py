"""Proxy samples: stratified subsets, the group combinations, the proxy sets of the experiment."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from ....data.newsgroups import GROUPS, Newsgroups
from ....errors import InputError


def stratified_sample(labels: np.ndarray, n: int, rng: np.random.Generator,
                      classes: Sequence[int] | None = None) -> np.ndarray:
    """≈ n indices drawn without replacement, split equally over ``classes`` (default: all).

    Each class gets n // k (the first n mod k classes in a random order one more), capped at
    what the class has. Returns sorted indices.
    """
    classes = sorted(set(labels.tolist())) if classes is None else list(classes)
    k = len(classes)
    extra = set(rng.permutation(k)[: n % k].tolist()) if k else set()
    out = []
    for j, c in enumerate(classes):
        pool_ = np.flatnonzero(labels == c)
        m = min(len(pool_), n // k + (1 if j in extra else 0))
        out.append(rng.choice(pool_, size=m, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def group_sample(groups: np.ndarray, include: Sequence[str], n: int,
                 rng: np.random.Generator) -> np.ndarray:
    """n indices split equally across the topical groups ``include`` (uniform within a group)."""
    gid = np.array([include.index(g) if g in include else -1 for g in groups])
    return stratified_sample(gid, n, rng, classes=range(len(include)))


def combinations() -> list[tuple[str, ...]]:
    """The 14 proxy domain sets: 4 singles, 6 pairs, 4 triples of :data:`GROUPS`."""
    return [c for k in (1, 2, 3) for c in itertools.combinations(GROUPS, k)]


def proxy_sets(groups: np.ndarray, labels: np.ndarray, n: int, seed: int,
               representative: str = "all-classes") -> dict[str, np.ndarray]:
    """{name: training indices} for the 14 combinations ("sci", "sci+comp", …) and
    "representative" (n stratified over all classes, or equally over the four groups)."""
    rng = np.random.default_rng([seed, 7])
    out = {"+".join(c): group_sample(groups, c, n, rng) for c in combinations()}
    if representative == "all-classes":
        out["representative"] = stratified_sample(labels, n, rng)
    elif representative == "four-groups":
        out["representative"] = group_sample(groups, GROUPS, n, rng)
    else:
        raise InputError(f"representative={representative!r}; use all-classes or four-groups")
    return out


def stratified_subset(data: Newsgroups, n: int | None, seed: int) -> Newsgroups:
    """A class-stratified subsample of ≈ n documents (all of them when n is None or ≥ N)."""
    if n is None or n >= len(data):
        return data
    return data.subset(stratified_sample(data.labels, n, np.random.default_rng([seed, 3])))
