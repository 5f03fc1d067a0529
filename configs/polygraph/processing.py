"""Answer normalization before LM-Polygraph's accuracy and ROUGE-L (``process_output_fn`` and
``process_target_fn``): TriviaQA's standard exact-match rule, as in LM-Polygraph's own
TriviaQA configs (lower case, punctuation and the articles a/an/the removed, whitespace
collapsed)."""

import re
import string

_PUNCT = set(string.punctuation + "‘’´`")
#: special tokens a batched generation leaves in a decoded answer (a pad token after an answer
#: that stopped at a stop string: Gemma's ``<pad>``, Qwen's ``<|endoftext|>``): never an answer
_SPECIAL = re.compile(r"<pad>|<eos>|</s>|<\|endoftext\|>|<\|im_end\|>|<end_of_turn>")


def normalize_em(s: str) -> str:
    s = _SPECIAL.sub(" ", s).replace("_", " ").lower()
    s = "".join(" " if ch in _PUNCT else ch for ch in s)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())
