"""What every notebook does first: find the project, read the switch, load the pair.

The switch is three environment variables, read once when this module is imported:

    GPT2_TARGET  the target p, the model whose output we want   (default gpt2-large)
    GPT2_DRAFT   the draft q, the model that proposes tokens     (default gpt2)
    DEVICE       where the models run                            (default cuda if available, else cpu)

A model is an official name (gpt2 ... gpt2-xl), a hub id owner/name, a folder holding
config.json + model.safetensors, or a single .safetensors file.
"""

import os
import sys
from pathlib import Path

# The repo root: the folder holding gpt2/ and spec_decoding/ (this file sits in notebooks/).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# tiktoken's BPE files, if a copy sits beside the repo (offline machines, CI).
_BPE_FILES = ROOT.parent / "shared" / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _BPE_FILES.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_BPE_FILES)

import torch  # noqa: E402  (after the path set-up above)

TARGET = os.environ.get("GPT2_TARGET", "gpt2-large")  # p: the model whose output we want
DRAFT = os.environ.get("GPT2_DRAFT", "gpt2")  # q: the model that proposes tokens
DEVICE = os.environ.get("DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def load_pair():
    """(target, draft) loaded from TARGET and DRAFT onto DEVICE; prints their sizes."""
    from gpt2 import load_gpt2

    target = load_gpt2(TARGET, device=DEVICE)
    draft = load_gpt2(DRAFT, device=DEVICE)
    for name, model in (("target", target), ("draft", draft)):
        c = model.config
        print(f"{name:6}: {model.num_parameters() / 1e6:7.1f}M parameters, {c.n_layer} layers, "
              f"n_embd={c.n_embd}, vocab={c.vocab_size}")
    assert target.config.vocab_size == draft.config.vocab_size, "the pair must share one tokenizer"
    return target, draft
