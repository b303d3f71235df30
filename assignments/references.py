"""The checks' inputs and reference values, computed with this project's code (the
instructor's), and the small checkpoints they run on."""

import json
from pathlib import Path

from .definition import Assignment

HIDDEN_SEED = 1  # the instructor's inputs; the visible ones (shipped with the copy) use seed 0
VISIBLE_SEED = 0


def make_data(folder: Path) -> Path:
    """The small random checkpoints the checks run on (made with the project's random_weights)."""
    from gpt2 import GPT2Config
    from offline.random_weights import save_agreeing_pair, save_random_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    tiny = GPT2Config(n_layer=4, n_head=2, n_embd=32, n_positions=64, vocab_size=100)
    vocab = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
    save_agreeing_pair(folder / "target", folder / "draft", tiny, draft_n_layer=2, damping=0.1, seed=11,
                       std=0.2, embedding_std=0.3)
    save_random_checkpoint(folder / "unrelated", tiny.with_(n_layer=2), seed=9, std=0.2, embedding_std=0.3)
    # A 16-token pair that agrees about half the time, for exact enumeration.
    save_random_checkpoint(folder / "vocab_target", vocab, seed=21, std=0.2, embedding_std=0.3)
    save_random_checkpoint(folder / "vocab_draft", vocab, seed=22, std=0.2, embedding_std=0.3)
    return folder


def references(assignment: Assignment, data: Path, seed: int, checks=None) -> dict:
    """{check: {"inputs", "reference"}}, computed in this process with this project's code (the
    instructor's: never the student's)."""
    import torch

    torch.set_num_threads(1)
    out = {}
    for check in checks or assignment.checks:
        inputs = check.make_inputs(seed)
        reference = (check.reference or check.probe)(inputs, data)
        out[check.name] = {"inputs": inputs, "reference": json.loads(json.dumps(reference))}
    return out
