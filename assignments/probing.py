"""Small helpers the checks share: loading the checkpoints, JSON-able values, comparisons."""

import importlib
from contextlib import contextmanager
from pathlib import Path

import torch

from .definition import Failed

PROMPT = [5, 17, 42, 8, 99, 3]


def load(data: Path, name: str):
    """A checkpoint the grader made (grade.make_data), in float32 (exact comparisons)."""
    from gpt2 import load_gpt2

    return load_gpt2(Path(data) / name, dtype="float32")


def lossless_reference(inputs, data) -> list[float]:
    """The reference of the lossless checks: the vocab target's exact distribution over
    inputs["n_tokens"] tokens after inputs["prompt"] at temperature 1, flattened (to compare sample
    counts with, spec_decoding.checks)."""
    from spec_decoding.checks import exact_distribution

    return exact_distribution(load(data, "vocab_target"), inputs["prompt"], inputs["n_tokens"],
                              dict(temperature=1.0)).reshape(-1).tolist()


def function(dotted: str):
    """The function a dotted name (module path, then attributes) points to, imported now."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name and (module == error.name or module.startswith(error.name + ".")):
                continue  # not a module: an attribute of a shorter prefix
            raise  # a module the student's file imports is missing: that error, not ours
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {dotted}")


def tokens_of(result) -> list[int]:
    tokens = result.tokens if hasattr(result, "tokens") else result
    return [int(t) for t in tokens]


def max_difference(got, want) -> float:
    got, want = torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
    if got.shape != want.shape:
        raise Failed(f"got a tensor of shape {list(got.shape)}, expected {list(want.shape)}")
    return (got - want).abs().max().item() if got.numel() else 0.0


def first_difference(got: list[int], want: list[int]) -> str | None:
    """None if equal, else where and how the token lists differ, in words."""
    if got == want:
        return None
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return (f"differs from the target's own greedy output at token {i}: got {got[i:i + 4]}, expected "
            f"{want[i:i + 4]} ({len(got)} tokens, expected {len(want)})")


@contextmanager
def counting_forwards(model):
    """Count the model's forward passes (calls of the module itself)."""
    calls = [0]
    handle = model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_distributions(seed: int, rows: int, vocab: int, sharpness: float = 2.0) -> torch.Tensor:
    """rows random distributions over vocab tokens, [rows, vocab] float64, rows summing to 1."""
    logits = sharpness * torch.randn(rows, vocab, generator=seeded(seed), dtype=torch.float64)
    return torch.softmax(logits, -1)
