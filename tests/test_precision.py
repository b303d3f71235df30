"""The formats dtype="auto" can pick keep float32 logits, and auto keeps only formats whose
next-token distributions stay near float32's (gpt2/speed/kernels.py: AUTO_FORMATS, fidelity,
fastest_format; docs/precision.md)."""

import math

import pytest
import torch

import gpt2.speed.accelerator as accelerator
import gpt2.speed.device as device
import gpt2.speed.kernel_cache as kernel_cache
import gpt2.speed.kernels as kernels
from gpt2 import GPT2Config, load_gpt2
from gpt2.speed import FastLinear, load_accelerated, native

# The head [vocab, n_embd] is 2^18 weights, so every format attaches its kernel to it.
WIDE = GPT2Config(n_layer=1, n_head=8, n_embd=512, n_positions=32, vocab_size=512)


@pytest.fixture(scope="module")
def wide_dir(make_checkpoint):
    return make_checkpoint(WIDE, seed=4, std=0.05, embedding_std=0.3)


def logits(model, idx):
    with torch.inference_mode():
        return model(idx)


def low_bits_set(t: torch.Tensor) -> float:
    """The share of a float32 tensor's entries whose 16 low mantissa bits are not all zero: about
    1 for float32 sums, 0 for values rounded to bfloat16 (or float16 in range, 13 bits)."""
    assert t.dtype == torch.float32
    return ((t.contiguous().view(torch.int32) & 0xFFFF) != 0).double().mean().item()


@pytest.mark.parametrize("fmt", list(kernels.AUTO_FORMATS))
def test_the_heads_logits_are_float32_in_every_format_auto_can_pick(wide_dir, fmt):
    """In every format of AUTO_FORMATS the head's logits are float32 sums, not values on a 16-bit
    grid, for a decode step (1 row) and a verification (9 rows), on the head's kernel. (Fails on
    the int8 format that rounded every output to bfloat16, and on bfloat16 in AUTO_FORMATS, as
    they were: every logit's low 16 bits zero.)"""
    dtype, quantize = kernels.AUTO_FORMATS[fmt]
    model = load_accelerated(wide_dir, dtype=dtype, quantize=quantize)
    assert isinstance(model.lm_head, FastLinear) and model.lm_head.kernel.paths()  # the head runs on its kernel
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    for rows in (idx, idx[:, :1]):
        out = logits(model, rows)
        assert out.dtype == torch.float32
        assert low_bits_set(out) > 0.9, (fmt, rows.shape)


@pytest.mark.skipif(native.why_not() is not None, reason=f"no C kernel here: {native.why_not()}")
def test_the_int8_formats_kernels_give_one_computations_bits(wide_dir):
    """The int8 format is one computation: its every kernel (the C kernel, this CPU's build and the
    AVX2 one) gives the same head logits bit for bit, and a decode step's row the same bits as
    that row in a verification. (The library's int8 products, once among its kernels, rounded to
    bfloat16 in their own orders: one bfloat16 step apart now and then.)"""
    model = load_accelerated(wide_dir, quantize="int8")
    x = torch.randn(9, WIDE.n_embd, generator=torch.Generator().manual_seed(2))
    head = model.lm_head.stored  # the head's int8 weights, as the model holds them
    q, scale = head.int8()
    outs = []
    for path in kernels.candidates("int8", torch.float32):
        for build in (None, False):  # this CPU's build, the AVX2 one
            kernel = kernels.build_kernel(path, head, (q, scale))
            kernel.lib = native.library(build) if build is not None else None
            together = kernel(x, None)
            alone = torch.cat([kernel(x[i:i + 1], None) for i in range(9)])
            assert torch.equal(together, alone), (path, build)
            outs.append(together)
    assert all(torch.equal(out, outs[0]) for out in outs)


def test_fidelity_is_kl_to_float32_and_greedy_agreement():
    """KL(p_float32 || p_format) in nats and the share of equal argmaxes, against a hand-computed
    two-token case; zero and all for the same logits."""
    target = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    same = kernels.fidelity(target, target.clone())
    assert same == {"kl": 0.0, "agreement": 1.0}
    other = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    p = [1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))]  # softmax of (2, 0); (0, 2) gives them swapped
    kl_second = p[0] * math.log(p[0] / p[1]) + p[1] * math.log(p[1] / p[0])  # the first row's KL is 0
    got = kernels.fidelity(target, other)
    assert got["kl"] == pytest.approx(kl_second / 2, rel=1e-9) and got["agreement"] == 0.5


def coarse_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A planted coarse "int8": three levels per output channel (-1, 0, 1) times its largest
    weight, stored as int8: what a format far outside the fidelity bound computes."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(w / scale[:, None]).to(torch.int8), scale


def test_auto_never_picks_a_format_outside_the_fidelity_bound(make_checkpoint, kernel_cache_file, monkeypatch, capsys):
    """A format that measures fastest but whose next-token distributions are far from float32's
    (int8 weights planted as three levels per channel) is not loaded by dtype="auto": the next
    format within FIDELITY_MAX_KL is, and the load line gives both speed and fidelity. With the
    bound lifted (auto by speed alone, as it was) the same measurement loads the coarse format,
    so it is the fidelity check that keeps it out."""
    folder = make_checkpoint(GPT2Config(n_layer=1, n_head=2, n_embd=64, n_positions=16, vocab_size=64),
                             seed=3, std=0.1, embedding_std=1.0)
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 1)  # measure even this tiny model
    monkeypatch.setattr(kernels, "format_paths", lambda: {"float32": ["linear"], "fp16": ["linear"], "int8": ["linear"]})
    monkeypatch.setattr(kernels, "format_times", lambda config: ({"float32": 1.0, "fp16": 0.8, "int8": 0.5}, "planted"))
    monkeypatch.setattr(accelerator, "int8_per_channel", coarse_per_channel)
    for bound, expected in ((kernels.FIDELITY_MAX_KL, "fp16"), (math.inf, "int8")):
        monkeypatch.setattr(kernels, "FIDELITY_MAX_KL", bound)
        monkeypatch.setattr(device, "_NOTES_SHOWN", set())
        kernel_cache.forget()
        model = load_accelerated(folder)  # format "auto"
        note = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("note: dtype auto"))
        assert model.format == expected, note
        assert "fidelity to float32" in note and "int8 KL" in note and "planted" in note
        if bound < math.inf:
            assert "int8 KL" in note and "(outside the bound)" in note


def test_fidelity_of_int8_on_a_small_pair_is_within_the_bound_and_repeats(text_pair_dirs):
    """On the tests' small pair with GPT-2's vocabulary, int8 weights (float32 sums) stay within
    FIDELITY_MAX_KL of float32 on the fidelity tokens, and measuring again gives the same numbers
    (fixed tokens, no timing: what the tests can check under GPT2_MEASURE_KERNELS=0)."""
    target_dir, _ = text_pair_dirs
    config = load_gpt2(target_dir).config
    logits_in = accelerator.format_logits(target_dir / "model.safetensors", config, torch.device("cpu"))
    measured = []
    for _ in range(2):
        fidelity = kernels.FormatFidelity(logits_in, config)
        assert fidelity.within_bound("int8"), fidelity.describe()
        measured.append(fidelity.of("int8"))
    assert measured[0] == measured[1]
    assert 0 < measured[0]["kl"] <= kernels.FIDELITY_MAX_KL
