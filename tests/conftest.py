"""Shared fixtures. Every checkpoint is made here, on the fly, in temporary folders, in exactly the
layout of the Hugging Face hub files (random weights: the hub is unreachable offline)."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpt2 import GPT2Config, load_gpt2  # noqa: E402
from gpt2.random_weights import save_agreeing_pair, save_random_checkpoint  # noqa: E402

# The test models are tiny: threads buy nothing and, on a busy 2-core machine, cost a lot.
torch.set_num_threads(1)

# tiktoken's BPE files: beside the project in ../shared (CI and dev sessions).
_SHARED_TIKTOKEN = ROOT.parent / "shared" / "tiktoken_cache"
if "TIKTOKEN_CACHE_DIR" not in os.environ and _SHARED_TIKTOKEN.is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_SHARED_TIKTOKEN)

# A tiny config for fast tests; TINY_VOCAB for exact enumeration of output distributions.
TINY = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=100)
TINY_VOCAB = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
# Real GPT-2 tokenizer vocabulary, tiny width: for the scripts, which decode text.
TINY_TEXT = GPT2Config(n_layer=4, n_head=2, n_embd=64, n_positions=128, vocab_size=50257)


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(config, seed=0, std=0.02, layout="hub") -> folder with config.json and
    model.safetensors of random weights."""
    made = {}

    def make(config: GPT2Config, seed: int = 0, std: float = 0.02, layout: str = "hub",
             embedding_std: float | None = None) -> Path:
        key = (config, seed, std, layout, embedding_std)
        if key not in made:
            folder = tmp_path_factory.mktemp(f"ckpt-{layout}-s{seed}")
            made[key] = save_random_checkpoint(folder, config, seed, std, layout, embedding_std)
        return made[key]

    return make


@pytest.fixture(scope="session")
def text_pair_dirs(tmp_path_factory):
    """(target_dir, draft_dir): an agreeing pair with GPT-2's real vocabulary, small widths."""
    root = tmp_path_factory.mktemp("text-pair")
    return save_agreeing_pair(root / "target", root / "draft", TINY_TEXT, draft_n_layer=2,
                              damping=0.05, seed=3, embedding_std=1.0)


@pytest.fixture(scope="session")
def text_pair(text_pair_dirs):
    target_dir, draft_dir = text_pair_dirs
    return load_gpt2(target_dir), load_gpt2(draft_dir)


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)
