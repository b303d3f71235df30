"""Small helpers the checks share: loading the checkpoints, JSON-able values, comparisons, the
chi-square verdict of the statistical checks (counted here, in the grader, from raw outcomes)."""

import importlib
from contextlib import contextmanager
from pathlib import Path

import torch

from .definition import Failed, Unlikely

PROMPT = [5, 17, 42, 8, 99, 3]


def load(data: Path, name: str):
    """A checkpoint the grader made (grade.make_data), as load_gpt2 gives it: gpt2/model.py in float32
    (exact comparisons), nothing for each check's fresh process to build or measure first."""
    from gpt2 import load_gpt2

    return load_gpt2(Path(data) / name)


def lossless_reference(inputs, data) -> list[float]:  # the grader's: make strips it from the copy
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


# ---- numbers the probe sends back ----------------------------------------------------------------

def plain(value, what: str) -> int | float:
    """What the student's function returned, as a plain Python number for the JSON sent back: an
    int for any integer (Python, NumPy, a 0-d integer tensor), a float for any other real number;
    a TypeError naming `what` for anything else (a list, None, a string). The judge then decides
    whether the kind is right (best_gamma must give an int)."""
    import numbers

    if isinstance(value, torch.Tensor) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} returned {value!r} ({type(value).__name__}), not a number")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def number(value, what: str) -> float:
    """A plain float from any real number (see plain)."""
    return float(plain(value, what))


def whole_number(value, what: str) -> int:
    """A plain int from any integer (see plain); a TypeError for anything else, 3.0 included: a
    count, an index or a token id is an int."""
    value = plain(value, what)
    if not isinstance(value, int):
        raise TypeError(f"{what} returned {value!r}, not an int")
    return value


# ---- counting raw outcomes, in the grader -----------------------------------------------------------

def outcomes(got, rounds: int, width: int, what: str) -> list[list]:
    """The probe's per-round raw outcomes, checked: a list of `rounds` lists of `width` ints (or
    None). Raises Failed (the student's values, not a crash of the grader) when they are not."""
    if not isinstance(got, list) or len(got) != rounds or not all(
            isinstance(o, list) and len(o) == width and all(x is None or type(x) is int for x in o) for o in got):
        raise Failed(f"{what}: the check's values are not {rounds} rounds of {width} whole numbers each")
    return got


def chi_square(counts, probs) -> float:
    from spec_decoding.checks import chi_square_p_value

    return chi_square_p_value(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64))


def follows(counts, probs, mistakes: dict, what: str, hint: str) -> None:
    """Raise Unlikely (a Failed) unless the counts follow probs (Pearson's chi-square, p-value threshold
    spec_decoding.checks.P_VALUE_THRESHOLD: the chance a correct solution fails). The message names
    a known mistake whose distribution the counts fit (mistakes: words -> probs), else gives the
    hint. It shows the counts' distance from the exact law, never the law itself."""
    from spec_decoding.checks import P_VALUE_THRESHOLD, total_variation

    p_value = chi_square(counts, probs)
    if p_value >= P_VALUE_THRESHOLD:
        return
    tv = total_variation(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64))
    fits = [words for words, alternative in mistakes.items() if chi_square(counts, alternative) >= P_VALUE_THRESHOLD]
    cause = f"the counts fit a known mistake: {fits[0]}" if fits else hint
    raise Unlikely(f"{what}: total variation {tv:.3f} from the exact distribution, chi-square p = {p_value:.1g} "
                 f"(threshold {P_VALUE_THRESHOLD:g}; {sum(counts)} samples): {cause}")


def sample_counts(inputs, reference: list[float], got) -> list[int]:
    """How often each outcome of inputs["n_tokens"] tokens occurs among the samples the probe sent
    back (token lists), counted here, in the order of the reference's exact law (V ** n_tokens
    cells). Failed if they are not inputs["samples"] lists of token ids."""
    from spec_decoding.checks import counts_of

    n_samples, n_tokens = inputs["samples"], inputs["n_tokens"]
    vocab = round(len(reference) ** (1 / n_tokens))
    if not isinstance(got, list) or len(got) != n_samples or not all(
            isinstance(s, list) and len(s) >= n_tokens and all(type(t) is int and 0 <= t < vocab for t in s[:n_tokens])
            for s in got):
        raise Failed(f"the generator did not return {n_samples} samples of at least {n_tokens} token ids below {vocab}")
    return counts_of(got, vocab, n_tokens).tolist()
