"""Semantic entropy over the K sampled answers (Farquhar et al. 2024, Nature 630:625).

1. Cluster the K answers by bidirectional entailment in the context of the question:
   answers a, b share a meaning when a ⊨ b and b ⊨ a ("strict", Farquhar's default; the
   non-strict variant asks only for no contradiction and not both neutral).
   Greedy clustering: the first unassigned answer opens a cluster and every later unassigned
   answer equivalent to it joins (LM-Polygraph's order; Farquhar's loop can also re-assign an
   answer already placed, which matters only when the judge is not transitive).
   Identical strings are one meaning without asking the judge, so K identical answers give one
   cluster and entropy 0 whatever the entailment model says.
2. Probability-weighted entropy (Farquhar's ``semantic_entropy``): with ℓ_k the length-
   normalized log-prob of answer k, log p(c) = logsumexp_{k∈c} ℓ_k − logsumexp_k ℓ_k, and
   SE = −Σ_c p(c) log p(c). Every sample counts once as mass and the masses are normalized over
   all K samples, so Σ_c p(c) = 1 and no class exceeds 1 (the failure in LM-Polygraph #223, whose
   un-normalized logsumexp exceeds 1 when answers repeat). ``unique=True`` counts each distinct
   string once instead (the remedy proposed in that issue).
3. Discrete entropy (Farquhar's ``cluster_assignment_entropy``): p(c) = |c| / K.

Entailment is pluggable (``EntailmentJudge.entails(question, a, b)``, batched as
``entails_batch``, results cached per ordered pair so each direction is asked once):
``NLIEntailment`` wraps an MNLI-style sequence classifier (Farquhar: deberta-v2-xlarge-mnli,
premise and hypothesis each prefixed by the question), ``LLMEntailment`` asks a causal LM with
Farquhar's entailment prompt and reads the most probable of entailment / contradiction /
neutral from its next-token distribution.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from ....errors import InputError, ModelError
from ....llm.generation import Sampled, model_device, option_probs
from ....llm.packed_logits import PrefixKV
from ....llm.prompts import chat_or_plain, entailment_prompt

CONTRADICTION, NEUTRAL, ENTAILMENT = 0, 1, 2
"""NLI labels as Farquhar's ``check_implication`` returns them."""

Pair = tuple[str, str, str]
"""(question, premise answer, hypothesis answer): does the premise entail the hypothesis?"""


class EntailmentJudge(ABC):
    """Decides whether one answer entails another in the context of a question.

    Subclasses implement ``predict_labels`` (a batch of pairs -> NLI labels). Results are cached
    by (question, a, b), so each ordered pair costs one model evaluation; ``calls`` counts them.
    """

    name: str = "entailment"

    def __init__(self) -> None:
        self.cache: dict[Pair, int] = {}
        self.calls = 0
        self.on_pairs: Callable[[int], None] | None = None
        """Called with the number of pairs just labelled, as batches finish (progress)."""

    def _labelled(self, n: int) -> None:
        if self.on_pairs is not None:
            self.on_pairs(n)

    @abstractmethod
    def predict_labels(self, items: Sequence[Pair]) -> list[int]:
        """NLI label (CONTRADICTION / NEUTRAL / ENTAILMENT) per (question, a, b)."""

    def labels(self, items: Sequence[Pair]) -> list[int]:
        """Cached labels; only pairs never seen go to the model, in one batched call."""
        todo = list(dict.fromkeys(it for it in items if it not in self.cache))
        if todo:
            got = self.predict_labels(todo)
            if len(got) != len(todo):
                raise ModelError(f"{self.name} returned {len(got)} labels for {len(todo)} pairs")
            self.cache.update(zip(todo, (int(x) for x in got), strict=True))
            self.calls += len(todo)
        return [self.cache[it] for it in items]

    def entails_batch(self, items: Sequence[Pair]) -> list[bool]:
        """Whether a ⊨ b for each (question, a, b)."""
        return [lab == ENTAILMENT for lab in self.labels(items)]

    def entails(self, question: str, a: str, b: str) -> bool:
        """Whether answer ``a`` entails answer ``b`` given ``question``."""
        return self.entails_batch([(question, a, b)])[0]

    def clear_cache(self) -> None:
        """Forget cached pairs (e.g. between datasets); ``calls`` keeps counting."""
        self.cache.clear()

    def config(self) -> dict:
        return {"kind": type(self).__name__, "name": self.name}


def _nli_label_map(id2label: dict) -> dict[int, int]:
    """Class index -> NLI label from a classifier's ``id2label`` (entail/neutral/contradict)."""
    out = {}
    for idx, lab in id2label.items():
        s = str(lab).lower()
        if "entail" in s and "not" not in s:
            out[int(idx)] = ENTAILMENT
        elif "contradict" in s:
            out[int(idx)] = CONTRADICTION
        else:
            out[int(idx)] = NEUTRAL
    if ENTAILMENT not in out.values():
        raise ModelError(
            f"the NLI model's labels {dict(id2label)} have no 'entailment' class; use an "
            "MNLI-style model (e.g. microsoft/deberta-large-mnli) or set config.id2label"
        )
    return out


class NLIEntailment(EntailmentJudge):
    """Entailment from an MNLI-style ``AutoModelForSequenceClassification``.

    Input is the pair (premise, hypothesis) = ("{question} {a}", "{question} {b}") when
    ``prepend_question`` (Farquhar's ``condition_on_question``), else (a, b); the label is the
    argmax class, read through ``model.config.id2label``.
    """

    def __init__(self, model, tokenizer, *, name: str | None = None,
                 prepend_question: bool = True, batch_size: int = 32, max_length: int = 512):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or "nli"
        self.prepend_question = prepend_question
        self.batch_size, self.max_length = batch_size, max_length
        self.label_map = _nli_label_map(model.config.id2label)

    @torch.inference_mode()
    def predict_labels(self, items: Sequence[Pair]) -> list[int]:
        device = model_device(self.model)
        out: list[int] = []
        for s in range(0, len(items), self.batch_size):
            chunk = items[s : s + self.batch_size]
            if self.prepend_question:
                prem = [f"{q} {a}" for q, a, _ in chunk]
                hyp = [f"{q} {b}" for q, _, b in chunk]
            else:
                prem, hyp = [a for _, a, _ in chunk], [b for _, _, b in chunk]
            enc = self.tokenizer(prem, hyp, padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(device)
            logits = self.model(**enc).logits
            out += [self.label_map[int(i)] for i in logits.argmax(-1).tolist()]
            self._labelled(len(chunk))
        return out

    def config(self) -> dict:
        return {**super().config(), "prepend_question": self.prepend_question}


class LLMEntailment(EntailmentJudge):
    """Entailment asked of a causal LM with Farquhar's prompt (``prompts.entailment_prompt``).

    One forward pass per ``batch_size`` pairs of one question: their common beginning (the
    question and, comparing with one representative, its answer) is encoded once, and with
    ``pack`` (models where ``packed_logits.can_pack``) their own tokens are packed without
    padding and the question's beginning is kept between clustering rounds (``PrefixKV``
    per question, the last ``MAX_HELD`` questions); see ``option_probs``. The label is the
    option among entailment / contradiction / neutral with the most next-token probability
    (Farquhar sample a reply at T = 0.02 and look for the words; reading probabilities needs
    no parsing and never falls back to "neutral").
    """

    OPTIONS = {
        ENTAILMENT: [" entailment", "entailment", " Entailment", "Entailment"],
        CONTRADICTION: [" contradiction", "contradiction", " Contradiction", "Contradiction"],
        NEUTRAL: [" neutral", "neutral", " Neutral", "Neutral"],
    }
    MAX_HELD = 32
    """Questions whose prompt beginnings' keys/values are kept (one clustering batch needs 8)."""

    def __init__(self, model, tokenizer, *, name: str | None = None, batch_size: int = 8,
                 chat: bool | None = None, share_prefix: bool = True, pack: bool = True):
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or "llm"
        self.batch_size, self.chat, self.share_prefix = batch_size, chat, share_prefix
        self.pack = pack
        self.held: OrderedDict[str, PrefixKV] = OrderedDict()

    def prompt(self, question: str, a: str, b: str) -> str:
        return chat_or_plain(self.tokenizer, entailment_prompt(question, a, b), chat=self.chat)

    def _prefix_of(self, question: str) -> PrefixKV:
        """This question's kept prompt beginning (least recently used ones are dropped)."""
        held = self.held.pop(question, None) or PrefixKV()
        self.held[question] = held
        while len(self.held) > self.MAX_HELD:
            self.held.popitem(last=False)
        return held

    def predict_labels(self, items: Sequence[Pair]) -> list[int]:
        labels = list(self.OPTIONS)
        opts = {str(k): v for k, v in self.OPTIONS.items()}
        by_question: dict[str, list[int]] = {}
        for i, (q, _, _) in enumerate(items):
            by_question.setdefault(q, []).append(i)
        out = [NEUTRAL] * len(items)
        for q, idx in by_question.items():  # batches never mix questions: longer shared prefixes
            probs = option_probs(self.model, self.tokenizer,
                                 [self.prompt(*items[i]) for i in idx], opts,
                                 batch_size=self.batch_size, share_prefix=self.share_prefix,
                                 pack=self.pack, prefix=self._prefix_of(q) if self.pack else None)
            for i, k in zip(idx, probs.argmax(-1).tolist(), strict=True):
                out[i] = labels[k]
            self._labelled(len(idx))
        return out

    def clear_cache(self) -> None:
        super().clear_cache()
        self.held.clear()

    def config(self) -> dict:
        return {**super().config(), "chat": self.chat, "share_prefix": self.share_prefix,
                "pack": self.pack}


def entailment_judge(model, tokenizer, *, name: str | None = None,
                     batch_size: int = 8) -> EntailmentJudge:
    """The entailment judge for a loaded model: ``NLIEntailment`` for an MNLI-style sequence
    classifier (Farquhar et al.'s DeBERTa-MNLI), ``LLMEntailment`` for a causal LM."""
    from ....models.loading import names_classifier

    config_names = getattr(getattr(model, "config", None), "architectures", None) or []
    if names_classifier([type(model).__name__, *config_names]):
        return NLIEntailment(model, tokenizer, name=name, batch_size=batch_size)
    return LLMEntailment(model, tokenizer, name=name, batch_size=batch_size)


# ----------------------------------------------------------------------------- clustering


def equivalent(l_ab: int, l_ba: int, strict: bool = True) -> bool:
    """Bidirectional entailment (strict) or Farquhar's lenient rule from the two NLI labels."""
    if strict:
        return l_ab == ENTAILMENT and l_ba == ENTAILMENT
    return CONTRADICTION not in (l_ab, l_ba) and (l_ab, l_ba) != (NEUTRAL, NEUTRAL)


def could_be_equivalent(l_ab: int, strict: bool = True) -> bool:
    """Whether answers can still be equivalent after the first direction's label: strict needs
    entailment, the lenient rule only excludes contradiction. When not, the other direction
    cannot change the verdict and is never asked."""
    return l_ab == ENTAILMENT if strict else l_ab != CONTRADICTION


def semantic_clusters(
    questions: Sequence[str],
    answers: Sequence[Sequence[str]],
    judge: EntailmentJudge,
    *,
    strict: bool = True,
) -> tuple[list[list[int]], list[int]]:
    """Cluster each question's answers by meaning; all questions' pairs batched per round.

    Each round, every question's first unassigned answer opens a cluster (its representative)
    and is compared with each later unassigned answer: first rep ⊨ answer for all pairs in one
    batch, then answer ⊨ rep only for the pairs that ``could_be_equivalent`` (same clusters as
    asking both directions always, with about half the judge calls when answers differ).

    questions: (N,); answers: N lists of K_i strings. Returns (cluster ids: N lists of K_i ints,
    numbered 0.. in order of first appearance; judge evaluations spent per question).
    """
    if len(questions) != len(answers):
        raise InputError(f"{len(questions)} questions but {len(answers)} answer lists")
    uniq = [list(dict.fromkeys(a)) for a in answers]
    cid: list[list[int | None]] = [[None] * len(u) for u in uniq]
    n_next = [0] * len(uniq)
    calls = [0] * len(uniq)

    def ask(items: list[Pair], owner_q: list[int]) -> list[int]:
        seen: set[Pair] = set()
        for pair, q in zip(items, owner_q, strict=True):
            if pair not in judge.cache and pair not in seen:
                seen.add(pair)
                calls[q] += 1
        return judge.labels(items)

    while True:
        owners: list[tuple[int, str, int, int]] = []  # (question, rep text, answer, cluster)
        for q, u in enumerate(uniq):
            free = [i for i in range(len(u)) if cid[q][i] is None]
            if not free:
                continue
            rep = free[0]
            cid[q][rep] = n_next[q]
            n_next[q] += 1
            owners += [(q, u[rep], i, cid[q][rep]) for i in free[1:]]
        if not owners:
            break
        forward = ask([(questions[q], r, uniq[q][i]) for q, r, i, _ in owners],
                      [q for q, *_ in owners])
        open_ = [(o, f) for o, f in zip(owners, forward, strict=True)
                 if could_be_equivalent(f, strict)]
        if not open_:
            continue
        backward = ask([(questions[q], uniq[q][i], r) for (q, r, i, _), _ in open_],
                       [o[0] for o, _ in open_])
        for ((q, _, i, c), f), b in zip(open_, backward, strict=True):
            if equivalent(f, b, strict):
                cid[q][i] = c
    ids = []
    for q, a in enumerate(answers):
        index = {s: i for i, s in enumerate(uniq[q])}
        ids.append([int(cid[q][index[s]]) for s in a])
    return ids, calls


def _logsumexp(xs: Sequence[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def cluster_logprobs(
    cluster_ids: Sequence[int],
    mean_logprobs: Sequence[float],
    texts: Sequence[str] | None = None,
    *,
    unique: bool = False,
) -> list[float]:
    """(C,) normalized log p(c) = logsumexp_{k∈c} ℓ_k − logsumexp_k ℓ_k (Farquhar's
    ``logsumexp_by_id(..., 'sum_normalized')``). ``unique``: each distinct text counted once
    (first occurrence), which needs ``texts``."""
    if len(cluster_ids) != len(mean_logprobs) or not cluster_ids:
        raise InputError("need one log-prob per clustered answer and at least one answer")
    keep = list(range(len(cluster_ids)))
    if unique:
        if texts is None:
            raise InputError("unique=True needs the answer texts")
        first = {t: i for i, t in reversed(list(enumerate(texts)))}
        keep = sorted(first.values())
    total = _logsumexp([mean_logprobs[i] for i in keep])
    n_c = max(cluster_ids) + 1
    return [_logsumexp([mean_logprobs[i] for i in keep if cluster_ids[i] == c]) - total
            for c in range(n_c)]


def entropy_from_logprobs(logp: Sequence[float]) -> float:
    """−Σ p log p for normalized log-probabilities (Farquhar's ``predictive_entropy_rao``)."""
    return float(-sum(math.exp(lp) * lp for lp in logp))


def discrete_semantic_entropy(cluster_ids: Sequence[int]) -> float:
    """Entropy of cluster frequencies |c| / K (Farquhar's ``cluster_assignment_entropy``)."""
    k = len(cluster_ids)
    counts = [cluster_ids.count(c) for c in sorted(set(cluster_ids))]
    return float(-sum(n / k * math.log(n / k) for n in counts))


@dataclass
class SemanticEntropy:
    """Semantic entropy of one question.

    value: probability-weighted SE (nats); discrete: frequency-based SE (nats).
    cluster_ids: (K,) cluster of each sample; cluster_logprobs: (C,) normalized log p(c).
    entailment_calls: judge evaluations this question needed (cache hits excluded).
    passes: generation passes beyond the shared greedy answer (K); seconds: their wall-clock
    plus this question's share of the clustering time.
    """

    value: float
    discrete: float
    cluster_ids: list[int]
    n_clusters: int
    cluster_logprobs: list[float]
    entailment_calls: int
    passes: int
    seconds: float
    judge: str

    def to_dict(self) -> dict:
        return asdict(self)


def semantic_entropy(
    questions: Sequence[str],
    sampled: Sequence[Sampled],
    judge: EntailmentJudge,
    *,
    strict: bool = True,
    unique: bool = False,
    which: str = "sampling",
) -> list[SemanticEntropy]:
    """Semantic entropy per question from its K samples (N questions -> N results).

    Clusters the samples' stripped texts with ``judge`` (pairs of all N questions batched),
    then both entropies. ``which``: "sampling" log-probs (Farquhar) or "model".
    """
    if len(questions) != len(sampled):
        raise InputError(f"{len(questions)} questions but {len(sampled)} sample sets")
    t0 = time.perf_counter()
    ids, calls = semantic_clusters(questions, [s.texts for s in sampled], judge, strict=strict)
    share = (time.perf_counter() - t0) / max(len(questions), 1)
    out = []
    for s, cid, n_calls in zip(sampled, ids, calls, strict=True):
        t1 = time.perf_counter()
        clp = cluster_logprobs(cid, s.mean_logprobs(which), s.texts, unique=unique)
        out.append(SemanticEntropy(
            value=entropy_from_logprobs(clp), discrete=discrete_semantic_entropy(cid),
            cluster_ids=cid, n_clusters=len(clp), cluster_logprobs=clp,
            entailment_calls=n_calls, passes=s.passes,
            seconds=s.seconds + share + time.perf_counter() - t1, judge=judge.name))
    return out
