"""Answer normalization before LM-Polygraph's accuracy and ROUGE-L (``process_output_fn`` and
``process_target_fn``): TriviaQA's standard exact-match rule, as in LM-Polygraph's own
TriviaQA configs (lower case, punctuation and the articles a/an/the removed, whitespace
collapsed)."""

import re
import string

_PUNCT = set(string.punctuation + "‘’´`")


def normalize_em(s: str) -> str:
    s = s.replace("_", " ").lower()
    s = "".join(" " if ch in _PUNCT else ch for ch in s)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())
