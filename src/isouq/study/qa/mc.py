"""TruthfulQA MC1 with exact labels: the model picks an option, our scores say how far to trust it.

Per question (``isouq qa mc``):

1. The prompt is the open-question prompt of the QA study, ``prompts.qa_prompt`` (Farquhar et
   al.'s brief instruction, ``Question: …`` and, for a plain model, ``\\nAnswer:``; a chat model
   gets it as one user turn plus the template's generation prompt). Each option follows the
   prompt as the model's answer would: ``" " + option`` after a plain prompt, the option itself
   after a chat prompt (``continuation``). Prompt and continuation are tokenized apart, exactly
   as ``isouq.score_sequences`` does, so the scored tokens are the same in both passes.
2. One batched forward over the K options gives each option's token probabilities: p̄ (mean token
   probability) and the mean token log-probability ℓ̄.
3. Decision rule: chosen = argmax p̄ (first on ties); the answer is correct iff the chosen option
   is the one labelled 1 in MC1 (exact label, no judge).
4. Scores of the chosen option: epistemic ‖∇θ p̄‖² (ghost norms, one backward pass, via
   ``score_sequences``), epistemic_log ‖∇θ log p̄‖² = epistemic / p̄² (identity ∇ log p̄ =
   ∇p̄ / p̄), aleatoric (1/T) Σ pₜ(1 − pₜ), p̄ itself; baselines: the option distribution
   softmax(ℓ̄) over the K options (length-normalized log-likelihoods), its maximum probability and
   entropy (nats), and P(True) of the chosen option with the other options, in the file's order,
   as the brainstormed answers (``baselines.p_true.p_true_given``; no sampling). Beside them
   the critique's scores (Li et al. 2026, ``qa.semgrad``): SemGrad, the lm_head-gradient
   baseline and HybridGrad of the chosen option.

Rows go to ``OUT/mc1_truthfulqa__<model>.jsonl`` (one per question, resumable; a resume with
other settings is an error) and the run's config to ``OUT/mc1_truthfulqa__<model>.run.json``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import InputError
from ...llm.prompts import encode_prompt, qa_prompt
from ...models.info import has_chat_template
from ...runio import (
    JsonlWriter,
    check_resume,
    dumps,
    exclusive,
    latest_by_key,
    machine_label,
    read_jsonl,
    versions,
)
from ...tokens import pad_id as tokenizer_pad_id

DATASET = "truthfulqa_mc1"
#: what defines a row's content: a resume with other values is an error
SETTINGS = {
    "prompt": "qa_prompt (brief instruction, zero-shot; chat template when the tokenizer has one)",
    "continuation": "' ' + option after a plain prompt; the option after a chat prompt",
    "decision": "argmax mean token probability",
    "option_distribution": "softmax of mean token log-likelihoods",
    "p_true": "meta-prompt with the other options (file order) as brainstormed answers",
    "gradient": "ghost, all parameters, identity covariance",
}


def mc_prompt(tokenizer, question: str) -> str:
    """The fixed prompt the options follow (``qa_prompt`` without examples)."""
    return qa_prompt(tokenizer, question)


def continuation(tokenizer, option: str) -> str:
    """The text scored after the prompt: ``" " + option`` (plain prompt ending in "Answer:"),
    or the option itself (chat prompt ending in the generation prompt)."""
    return option if has_chat_template(tokenizer) else " " + option


@dataclass
class OptionScores:
    """Per-option scores from one forward pass, each a (K,) tensor (float64 on CPU).

    mean_prob: p̄ = (1/T) Σₜ pₜ; mean_logprob: ℓ̄ = (1/T) Σₜ log pₜ; aleatoric: (1/T) Σₜ pₜ(1−pₜ);
    n_tokens: T (long).
    """

    mean_prob: torch.Tensor
    mean_logprob: torch.Tensor
    aleatoric: torch.Tensor
    n_tokens: torch.Tensor


def option_scores(model, tokenizer, prompt: str, options: Sequence) -> OptionScores:
    """Token probabilities of each continuation after ``prompt``, in one batched forward.

    Args:
        model: a causal LM (Hugging Face ``*ForCausalLM``), any device.
        tokenizer: its tokenizer.
        prompt: the prompt text (tokenized with ``encode_prompt``: BOS exactly once).
        options: K continuation texts (tokenized without special tokens) or token-id lists.

    Returns:
        OptionScores with (K,) p̄, ℓ̄, aleatoric and T.
    """
    p_ids = encode_prompt(tokenizer, prompt)
    conts = [list(tokenizer(o, add_special_tokens=False)["input_ids"]) if isinstance(o, str)
             else [int(t) for t in o] for o in options]
    if not conts:
        raise InputError("no options to score; give at least one")
    for i, c in enumerate(conts):
        if not c:
            raise InputError(f"option {i} is empty (no tokens); every option needs ≥ 1 token")
    P, K = len(p_ids), len(conts)
    L = P + max(len(c) for c in conts)
    ids = torch.full((K, L), tokenizer_pad_id(tokenizer), dtype=torch.long)
    att = torch.zeros((K, L), dtype=torch.long)
    for i, c in enumerate(conts):
        ids[i, : P + len(c)] = torch.tensor(p_ids + c)
        att[i, : P + len(c)] = 1
    dev = model.get_input_embeddings().weight.device
    keep = L - P + 1  # logits of positions P−1 … L−1 (the last one is unused)
    kw = dict(input_ids=ids.to(dev), attention_mask=att.to(dev))
    with torch.no_grad():
        try:
            out = model(**kw, logits_to_keep=keep)
        except TypeError:
            out = model(**kw)
    logits = (out.logits if hasattr(out, "logits") else out[0])[:, -keep:-1].float()
    lp = torch.log_softmax(logits, dim=-1)  # (K, L−P, V): position j predicts token P + j
    target = ids[:, P:].to(dev)
    tok_lp = lp.gather(2, target[..., None])[..., 0].double().cpu()
    mask = att[:, P:].bool()
    T = mask.sum(1)
    p = tok_lp.exp() * mask
    mean_prob = p.sum(1) / T
    mean_logprob = (tok_lp * mask).sum(1) / T
    alea = (p * (1 - p)).sum(1) / T
    if not torch.isfinite(mean_logprob).all():
        raise InputError("an option has a non-finite log-probability; check the model's weights")
    return OptionScores(mean_prob, mean_logprob, alea, T)


def option_distribution(mean_logprob: torch.Tensor) -> tuple[float, float]:
    """(maximum probability, entropy in nats) of softmax(ℓ̄) over the K options. (K,) -> floats."""
    q = torch.softmax(mean_logprob.double(), 0)
    ent = -(q * torch.log(q.clamp_min(1e-300))).sum()
    return float(q.max()), float(ent)


def semgrad_fields(model, tokenizer, prompt: str, continuation_text: str) -> dict:
    """SemGrad, the lm_head baseline and HybridGrad of the chosen option (``qa.semgrad``):
    {"scores": {...}, "semgrad": {token_offset, mean_entropy}, "seconds": s}."""
    from .semgrad import semgrad_scores

    t0 = time.perf_counter()
    sg = semgrad_scores(model, tokenizer, prompt, continuation_text)
    return {"scores": {"semgrad": sg.semgrad, "lm_head_grad": sg.lm_head,
                       "hybridgrad": sg.hybrid},
            "semgrad": {"token_offset": sg.token_offset, "mean_entropy": sg.mean_entropy},
            "seconds": time.perf_counter() - t0}


def with_semgrad(model, tokenizer, row: dict) -> dict:
    """A row written before SemGrad was added, with its SemGrad scores (revision + 1)."""
    sg = semgrad_fields(model, tokenizer, row["prompt"], row["options"][row["chosen"]])
    return {**row, "scores": {**row["scores"], **sg["scores"]}, "semgrad": sg["semgrad"],
            "seconds": {**row["seconds"], "semgrad": sg["seconds"]},
            "passes": {**row["passes"], "semgrad": 1},
            "revision": int(row.get("revision", 0)) + 1}


def score_question(model, tokenizer, item, *, p_true: bool = True, semgrad: bool = True) -> dict:
    """One MC1 question -> its row (without ``key``/``model``/``settings``); see module doc.

    item: an ``isouq.data.qa.MCItem``; ``semgrad``: add SemGrad, the lm_head baseline and
    HybridGrad of the chosen option (one more forward and backward pass).
    """
    from ...sequences import score_sequences
    from .baselines.p_true import p_true_given

    prompt = mc_prompt(tokenizer, item.question)
    conts = [continuation(tokenizer, o) for o in item.options]
    t0 = time.perf_counter()
    opt = option_scores(model, tokenizer, prompt, conts)
    t_opt = time.perf_counter() - t0
    chosen = int(torch.argmax(opt.mean_prob))
    max_prob, ent = option_distribution(opt.mean_logprob)
    t0 = time.perf_counter()
    seq = score_sequences(model, tokenizer, [prompt], [conts[chosen]], batch_size=1)
    t_grad = time.perf_counter() - t0
    pbar = float(opt.mean_prob[chosen])
    epi = float(seq.epistemic[0])
    epi_log = getattr(seq, "epistemic_log", None)
    epi_log = float(epi_log[0]) if epi_log is not None else epi / pbar**2
    scores = {
        "epistemic": epi,
        "epistemic_log": epi_log,
        "aleatoric": float(opt.aleatoric[chosen]),
        "mean_prob": pbar,
        "normalized_epistemic": float(seq.normalized_epistemic[0]),
        "max_prob": max_prob,
        "option_entropy": ent,
    }
    seconds = {"options": t_opt, "gradient": t_grad}
    extra: dict = {}
    if p_true:
        t0 = time.perf_counter()
        others = [o for i, o in enumerate(item.options) if i != chosen]
        value, pa, pb = p_true_given(model, tokenizer, [item.question], [item.options[chosen]],
                                     [others])[0]
        seconds["p_true"] = time.perf_counter() - t0
        scores["p_true"] = value
        extra["p_true_mass"] = {"p_a": pa, "p_b": pb}
    if semgrad:
        sg = semgrad_fields(model, tokenizer, prompt, conts[chosen])
        scores.update(sg["scores"])
        seconds["semgrad"] = sg["seconds"]
        extra["semgrad"] = sg["semgrad"]
    return {
        "dataset": DATASET,
        "question": item.question,
        "prompt": prompt,
        "options": conts,
        "option_mean_prob": [float(x) for x in opt.mean_prob],
        "option_mean_logprob": [float(x) for x in opt.mean_logprob],
        "option_n_tokens": [int(x) for x in opt.n_tokens],
        "chosen": chosen,
        "correct_option": item.correct_index,
        "correct": int(chosen == item.correct_index),
        "scores": scores,
        "gradient_pass_mean_prob": float(seq.mean_prob[0]),
        **extra,
        "passes": {"options": 1, "gradient": 1, **({"p_true": 1} if p_true else {}),
                   **({"semgrad": 1} if semgrad else {})},
        "seconds": seconds,
    }


def rows_path(out: str | Path, model: str) -> Path:
    from ...runio import slug

    return Path(out) / f"mc1_truthfulqa__{slug(model)}.jsonl"


def run_mc(model_name: str, out: str | Path, *, limit: int | None = None, data: str | None = None,
           device: str = "cpu", dtype: str | None = None, trust_remote_code: bool = False,
           allow_pickle: bool = False, quantize: str | None = None,
           adapter: str | Path | None = None, device_map: str | dict | None = None,
           max_memory: str | dict | None = None, offload_folder: str | Path | None = None,
           loader=None, progress: bool = True) -> Path:
    """Run (or resume) TruthfulQA MC1 for one model; returns the rows file.

    Args:
        model_name: registry name, folder or hub id (``isouq.models.load_model``).
        out: output folder (rows + run.json).
        limit: the first ``limit`` questions of the file (None: all 817).
        data: another ``mc_task.json`` (default: the shipped one, SHA-256 checked).
        device: torch device of the model.
        dtype, trust_remote_code, allow_pickle: as ``isouq.models.load_model`` (a dtype other
            than float32 is a setting of the rows: a resume with another is refused).
        quantize, adapter: as ``isouq.models.load_model``; settings of the rows (``quantize``,
            ``adapter_sha256``: ``models.content_options``), so a resume with others is refused.
        device_map, max_memory, offload_folder: as ``isouq.models.load_model`` (where the
            weights are placed; the scores do not depend on it).
        loader: optional ``name -> (model, tokenizer, info)`` (tests).
        progress: show a progress bar.

    Returns:
        Path of the JSONL rows.
    """
    from ...data.qa import load_truthfulqa_mc
    from ...models import content_options

    items = load_truthfulqa_mc(data, limit=limit, seed=None)
    path = rows_path(out, model_name)
    settings = dict(SETTINGS, data=str(data) if data else "shipped mc_task_v1.json",
                    **({"dtype": dtype} if dtype not in (None, "float32") else {}),
                    **content_options(quantize, adapter))
    with exclusive(path):
        have = {r["key"]: r for r in latest_by_key(read_jsonl(path))}
        check_resume(list(have.values()), lambda r: settings, path.name)
        todo = [it for it in items if it.key not in have]
        # rows written before SemGrad was added get it in a revision
        old = [have[it.key] for it in items
               if it.key in have and "semgrad" not in have[it.key]["scores"]]
        if not todo and not old:
            return path
        if loader is None:
            from ...models import check_loadable, load_model

            check_loadable(model_name)
            model, tok, info = load_model(model_name, device=device, dtype=dtype,
                                          trust_remote_code=trust_remote_code,
                                          allow_pickle=allow_pickle, quantize=quantize,
                                          adapter=adapter, device_map=device_map,
                                          max_memory=max_memory, offload_folder=offload_folder)
        else:
            model, tok, info = loader(model_name)
        machine = machine_label(device)
        run = {"dataset": DATASET, "model": model_name, "settings": settings,
               "n_questions": len(items), "machine": machine, "versions": versions(),
               "model_info": info.to_dict() if hasattr(info, "to_dict") else str(info),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".run.json").write_text(dumps(run, indent=1, ensure_ascii=False))
        writer = JsonlWriter(path)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(items), initial=len(items) - len(todo) - len(old),
                       desc=f"mc1 {model_name}", unit="question")
        for row in old:
            writer.write(with_semgrad(model, tok, row))
            if bar is not None:
                bar.update(1)
        for it in todo:
            row = score_question(model, tok, it)
            writer.write({"key": it.key, "model": model_name, **row, "settings": settings,
                          "timed_on": machine})
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
    return path

