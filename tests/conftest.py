import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama (tied embeddings) and its word-level tokenizer saved to a folder,
    for tests that load a model by path (``isouq score``, ``isouq ask``, ``--model DIR``)."""
    import tiny

    d = tmp_path_factory.mktemp("tinyllama")
    tiny.causal_lm("llama-tied").save_pretrained(d)
    tiny.tokenizer().save_pretrained(d)
    return d
