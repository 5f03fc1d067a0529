"""The uncertainty methods for a generated answer: one registry.

A method is what a user asks for by name (``isouq qa run --methods``, ``isouq ask
--baselines``): it runs once per answer and writes one or more scores into the answer row's
``scores`` (the row schema: ``isouq.answer_row``). Each entry says

- whether it needs K sampled answers (drawn once per question and shared),
- the score keys it writes, the first of which shows that it ran,
- how the evaluation reads it: table labels and the scores each label's logistic regression
  uses as features (``isouq.evaluation.rows.METHODS`` is built from these),
- one line of help for the CLI and ``isouq ask``'s legend.

``SCORES`` holds what each score key means (units, and whether higher means more or less
certain). The registry holds data only: how a method runs is a function of the QA pipeline
(``isouq.study.qa.methods``, a layer above), registered there under the method's name with
``@runs(name)``. A new method is one ``Method`` entry here and one run function there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from .errors import InputError
from .scores import SequenceScores


@dataclass(frozen=True)
class Score:
    """One score key of an answer row.

    Attributes:
        key: its name in a row's ``scores``.
        header: the column header of ``isouq ask``'s table.
        fmt: its format in that table (a ``format`` spec).
        higher: ``"uncertain"`` (an uncertainty) or ``"confident"`` (a confidence).
        help: what it is, with its units.
    """

    key: str
    header: str
    fmt: str
    higher: Literal["uncertain", "confident"]
    help: str


SCORES: dict[str, Score] = {s.key: s for s in (
    Score("mean_prob", "p̄", ".3f", "confident",
          "p̄ = mean probability of the answer's tokens (the model's own confidence)"),
    Score("aleatoric", "alea.", ".3f", "uncertain",
          "aleatoric = mean of p(1-p) over the tokens: how spread the model's token choices are"),
    Score("epistemic", "epist.", ".3g", "uncertain",
          "epistemic = ‖∇θ p̄‖²: how far p̄ moves when the weights move; = p̄²·‖∇θ log p̄‖², so "
          "it also carries p̄ (a low-confidence answer gets a small value)"),
    Score("epistemic_log", "epi. log", ".3g", "uncertain",
          "epi. log = ‖∇θ log p̄‖²: the same sensitivity without p̄'s scale"),
    Score("normalized_epistemic", "epi./‖θ‖²", ".3g", "uncertain",
          "normalized epistemic = ‖∇θ p̄‖² / ‖θ*‖²"),
    Score("seq_logprob", "log p", ".2f", "confident",
          "log p = Σ log pₜ: the answer's log-probability (nats; LM-Polygraph's maximum "
          "sequence probability is its negative)"),
    Score("naive_entropy", "naive H", ".3f", "uncertain",
          "naive H = entropy of K sampled answers (nats/token; higher = less certain)"),
    Score("semantic_entropy", "SE", ".3f", "uncertain",
          "SE = entropy over the meanings of the K samples (nats; higher = less certain)"),
    Score("semantic_entropy_discrete", "SE disc.", ".3f", "uncertain",
          "discrete SE = entropy of the meaning clusters' sizes (nats)"),
    Score("p_true", "P(True)", ".3f", "confident",
          "P(True) = the model's own probability that its answer is true (higher = more "
          "certain)"),
)}


@dataclass(frozen=True)
class Method:
    """One uncertainty method for generated answers.

    Attributes:
        name: the name users and rows use.
        title: the name in words (progress bars, legends).
        needs_samples: whether it reads the K sampled answers of each question.
        min_samples: the fewest samples it can run with (when it needs samples).
        writes: the score keys it writes; ``writes[0]`` shows that it ran.
        evaluated_as: (table label, feature score keys) per evaluated variant, in table order.
        ours: whether it is isouq's own method (else a baseline it is compared with).
        help: one line for the CLI.
    """

    name: str
    title: str
    needs_samples: bool
    writes: tuple[str, ...]
    evaluated_as: tuple[tuple[str, tuple[str, ...]], ...]
    ours: bool
    help: str
    min_samples: int = 0

    @property
    def done_key(self) -> str:
        """The score whose presence in a row shows that the method ran."""
        return self.writes[0]


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("gradient", "gradient", needs_samples=False,
           writes=SequenceScores.KEYS,
           evaluated_as=(("p̄", ("mean_prob",)), ("Alea.", ("aleatoric",)),
                         ("Epi.", ("epistemic",)), ("Epi. log", ("epistemic_log",)),
                         ("Epi. & Alea.", ("epistemic", "aleatoric"))),
           ours=True,
           help="epistemic ‖∇θ p̄‖², aleatoric and p̄ of the greedy answer (one backward pass)"),
    Method("naive_entropy", "naive entropy", needs_samples=True, min_samples=2,
           writes=("naive_entropy",),
           evaluated_as=(("Naive Ent.", ("naive_entropy",)),), ours=False,
           help="entropy of the K sampled answers' mean token log-probabilities"),
    Method("semantic_entropy", "semantic entropy", needs_samples=True, min_samples=2,
           writes=("semantic_entropy", "semantic_entropy_discrete"),
           evaluated_as=(("Sem. Ent.", ("semantic_entropy",)),), ours=False,
           help="entropy over the meanings of the K samples, clustered by an entailment model"),
    Method("p_true", "P(True)", needs_samples=True, writes=("p_true",),
           evaluated_as=(("P(True)", ("p_true",)),), ours=False,
           help="the model's probability that its answer is true, k_p_true samples shown"),
)}
#: the sampling-based methods the study compares with (``isouq ask --baselines``)
BASELINES: tuple[str, ...] = tuple(n for n, m in METHODS.items() if not m.ours)
#: labels of the evaluation's methods that are the paper's (``p̄`` is a baseline: it comes free)
FREE_BASELINES: tuple[str, ...] = ("p̄",)


def check_methods(names: Iterable[str], *, among: Iterable[str] = tuple(METHODS)) -> list[str]:
    """The methods asked for, in registry order; an InputError naming an unknown one.

    Args:
        names: method names.
        among: the methods allowed here (default: all).

    Returns:
        The names, deduplicated, in ``METHODS`` order.
    """
    among = tuple(among)
    names = list(names)
    unknown = [n for n in names if n not in among]
    if unknown:
        raise InputError(f"unknown method {unknown[0]!r}; choose from {', '.join(among)}")
    return [n for n in METHODS if n in names]


def check_sampling(names: Iterable[str], *, k: int, k_p_true: int, temperature: float) -> None:
    """InputError when the methods in ``names`` cannot run with these sampling settings (the one
    rule of ``isouq qa run`` and ``isouq ask --baselines``).

    Args:
        names: method names (of ``METHODS``).
        k: answers sampled per question (shared by the methods that need samples).
        k_p_true: sampled answers P(True) shows as brainstormed (0 ≤ k_p_true ≤ k; 0: none).
        temperature: sampling temperature, > 0.
    """
    sampling = [METHODS[n] for n in names if METHODS[n].needs_samples]
    short = [m.name for m in sampling if k < m.min_samples]
    if short:
        need = max(METHODS[n].min_samples for n in short)
        raise InputError(f"k={k}: {', '.join(short)} need(s) at least {need} sampled answers "
                         "(Farquhar et al.: 10); raise --k")
    if any(m.name == "p_true" for m in sampling) and not 0 <= k_p_true <= k:
        raise InputError(f"k_p_true={k_p_true}: P(True) shows 0..k={k} of the sampled answers; "
                         "set --k-p-true within that range or raise --k")
    if sampling and not temperature > 0:
        raise InputError(f"temperature={temperature}: sampling needs a temperature > 0; "
                         "pass e.g. --temperature 1")


def evaluated_methods() -> dict[str, tuple[str, ...]]:
    """Evaluation label -> feature score keys: the baselines first, then isouq's (table order)."""
    order = [m for m in METHODS.values() if not m.ours] + [m for m in METHODS.values() if m.ours]
    return {label: feats for m in order for label, feats in m.evaluated_as}


def evaluated_labels(*, ours: bool) -> tuple[str, ...]:
    """Evaluation labels of isouq's methods (``ours=True``; the free ``p̄`` excluded) or of the
    baselines they are compared with (``p̄`` included), in table order."""
    labels = [label for m in METHODS.values() for label, _ in m.evaluated_as
              if m.ours == ours and label not in FREE_BASELINES]
    return tuple(labels) if ours else (*labels, *FREE_BASELINES)


__all__ = ["BASELINES", "FREE_BASELINES", "METHODS", "SCORES", "Method", "Score",
           "check_methods", "check_sampling", "evaluated_labels", "evaluated_methods"]
