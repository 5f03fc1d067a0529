import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py

# ISOUQ_TEST_DEVICE=cuda runs the tests with torch's default device there (scripts/gpu_check.sh):
# every tensor and module a test makes without naming a device lives on the GPU, so the ghost
# rules meet cuBLAS/cuDNN kernels; TF32 stays off so that float32 keeps its tolerances
if os.environ.get("ISOUQ_TEST_DEVICE"):
    import torch

    torch.set_default_device(os.environ["ISOUQ_TEST_DEVICE"])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama (tied embeddings) and its word-level tokenizer saved to a folder,
    for tests that load a model by path (``isouq score``, ``isouq ask``, ``--model DIR``)."""
    import tiny

    d = tmp_path_factory.mktemp("tinyllama")
    tiny.causal_lm("llama-tied").save_pretrained(d)
    tiny.tokenizer().save_pretrained(d)
    return d
