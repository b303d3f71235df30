"""Weight formats (gpt2/speed/fast_linear.py) of an accelerated model (gpt2.speed.load_accelerated):
bf16 and int8 logits against the plain fp32 model within stated tolerances, the fast kernels
against the plain path on the same values, exact losslessness and greedy equality relative to the
target as loaded, and clear errors for bad options."""

import math

import pytest
import torch

import gpt2.speed.kernels as kernels
from gpt2 import GPT2Config, load_gpt2
from gpt2.speed import fast_model, load_accelerated
from gpt2.speed.fast_linear import (FP16Weight, Int8AsBF16, Int8Weight, OneDNNPackedForRows, OneDNNPackedWeight,
                              dequantize_int8, int8_per_channel)
from conftest import TINY_VOCAB
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.checks import check_lossless

# Wide enough that the linear layers look like GPT-2's (in = 256, head 1000 rows), small enough
# to be quick.
MEDIUM = GPT2Config(n_layer=2, n_head=4, n_embd=256, n_positions=64, vocab_size=1000)
# Largest |logit - fp32 logit| relative to the fp32 logits' spread (max - min), per format.
# bf16 keeps 8 bits of mantissa (relative rounding 2^-9 per product, accumulated in fp32) and
# rounds every activation; int8 per-channel keeps 1/254 of each row's range.
# fp16 weights keep 11 bits (relative rounding 2^-11) and the math stays float32.
TOLERANCE = {"bf16": 0.02, "int8": 0.02, "int8+bf16": 0.03, "fp16": 0.002}
FORMATS = {"bf16": dict(dtype="bfloat16"), "int8": dict(quantize="int8"),
           "int8+bf16": dict(dtype="bfloat16", quantize="int8"), "fp16": dict(quantize="fp16")}


@pytest.fixture(scope="module")
def medium_dir(make_checkpoint):
    return make_checkpoint(MEDIUM, seed=5, embedding_std=0.3)


def logits(model, idx):
    with torch.inference_mode():
        return model(idx).float()


@pytest.mark.parametrize("name", list(FORMATS))
def test_logits_close_to_fp32(medium_dir, name):
    idx = torch.randint(0, MEDIUM.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    reference = logits(load_gpt2(medium_dir), idx)  # the plain float32 model
    model = load_accelerated(medium_dir, **FORMATS[name])
    assert len(kernels.attached(model)) == 4 * MEDIUM.n_layer + 1  # every linear and the head run the format's kernel
    error = (logits(model, idx) - reference).abs().max() / (reference.max() - reference.min())
    assert 1e-5 < error < TOLERANCE[name]  # not fp32 in disguise, and close
    # Most positions keep the fp32 argmax (the rest are near-ties).
    agree = (logits(model, idx).argmax(-1) == reference.argmax(-1)).float().mean()
    assert agree > 0.9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_keeps_a_float32_cache_on_cpu(medium_dir, dtype):
    """PyTorch's CPU attention is slow in half precision for one query (docs/precision.md,
    "Attention in half precision"), so there a half-precision model's cache, and its attention, are
    float32; the rest of the model and its logits stay in the model's dtype."""
    model = load_gpt2(medium_dir, dtype=dtype)
    cache = model.new_kv_cache(max_len=16)
    assert cache.keys[0].dtype == cache.values[0].dtype == torch.float32
    assert load_gpt2(medium_dir, dtype="float32").new_kv_cache().keys[0].dtype == torch.float32
    idx = torch.randint(0, MEDIUM.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full = model(idx)  # no cache: attention in the model's dtype
        model(idx[:, :6], cache)
        stepped = torch.cat([model(idx[:, i:i + 1], cache) for i in range(6, 10)], dim=1)
    assert stepped.dtype == full.dtype == dtype
    spread = (full.max() - full.min()).float()
    assert (stepped.float() - full[:, 6:].float()).abs().max() < 0.02 * spread


@pytest.mark.parametrize("name", list(FORMATS))
def test_fast_kernels_equal_the_plain_path(medium_dir, name, monkeypatch):
    """The kernels chosen here compute the model as loaded: the plain F.linear path on the same
    values (GPT2_FAST_LINEAR=0: the layers' weights decoded, int8 dequantized) gives the same
    logits up to rounding."""
    model = load_accelerated(medium_dir, **FORMATS[name])
    idx = torch.randint(0, MEDIUM.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    fast = logits(model, idx)
    monkeypatch.setattr(fast_model, "ENABLED", False)  # every FastLinear: F.linear on its values
    plain = logits(model, idx)
    spread = (plain.max() - plain.min()).item()
    # bf16 activations round to 2^-8 relative; the plain and fast paths may round differently.
    assert (fast - plain).abs().max() <= (0.01 if "bf16" in name or name == "int8" else 1e-5) * spread
    if name == "fp16":  # the weights hold the float16 values: fp16 weights, float32 everything else
        assert all(p.dtype == torch.float32 for p in model.parameters())
        weights = [layer.weight for layer in kernels.attached(model)]
        assert len(weights) == 4 * MEDIUM.n_layer + 1
        assert all(w.dtype == torch.float32 and torch.equal(w, w.half().float()) for w in weights)


def test_int8_per_channel_quantization():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(2))
    w[3] *= 100  # one loud row must not cost the others their precision
    q, scale = int8_per_channel(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert (q.abs().amax(dim=1) == 127).all()  # each row uses the full symmetric range
    error = (dequantize_int8(q, scale, torch.float32) - w).abs()
    assert (error <= scale[:, None] / 2 + 1e-7).all()  # rounding error at most half a step
    assert error[:3].max() < 0.03  # quiet rows keep their own, small step


def test_fp16_kernel_matches_its_reference():
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    for M in (1, 5, 9):
        x = torch.randn(1, M, 64, generator=g)
        y = FP16Weight(w)(x, b)
        assert y.shape == (1, M, 48) and y.dtype == torch.float32
        torch.testing.assert_close(y, x @ w.half().float().T + b, rtol=1e-5, atol=1e-5)  # rounded weights
        assert (y - (x @ w.T + b)).abs().max() > 1e-6  # and not the float32 weights


def test_int8_kernel_matches_its_reference():
    g = torch.Generator().manual_seed(3)
    w, b, x = torch.randn(48, 64, generator=g), torch.randn(48, generator=g), torch.randn(2, 5, 64, generator=g)
    q, scale = int8_per_channel(w)
    y = Int8Weight(q, scale, torch.float32)(x, b)
    reference = x @ dequantize_int8(q, scale, torch.float32).T + b
    assert y.shape == (2, 5, 48)
    torch.testing.assert_close(y, reference, rtol=1e-4, atol=1e-4)


def test_float32_packed_for_a_few_rows_matches_f_linear():
    """float32 on weights pre-packed for a verification: F.linear's numbers (float32 rounding, in
    another order) for a decode step, a verification and more rows."""
    if not kernels.works("onednn-packed"):
        pytest.skip(f"no oneDNN here: {kernels.probe('onednn-packed')}")
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(384, 1280, generator=g), torch.randn(384, generator=g)
    kernel = OneDNNPackedForRows(w)
    for M in (1, 2, 5, 9, 16):
        x = torch.randn(1, M, 1280, generator=g)
        y = kernel(x, b)
        assert y.shape == (1, M, 384) and y.dtype == torch.float32
        reference = torch.nn.functional.linear(x, w, b)
        assert (y - reference).abs().max() <= 1e-5 * reference.abs().max(), M  # bfloat16 would be ~4e-3


def test_int8_on_bfloat16_matmul_gives_int8packs_numbers():
    """The multi-row int8 kernel computes what the 1-row one does (same int8 weights, same bfloat16
    activations and scale, float32 sums): per row count of a decode step and a verification, it
    matches F.linear on those values, and _weight_int8pack_mm's bfloat16 outputs except, rarely,
    by one bfloat16 step where the float32 sums were added in another order. (Rounding the sum to
    bfloat16 before the scale, instead of in the fused post-op, changes about a quarter of them.)"""
    if not kernels.works("int8-bf16"):
        pytest.skip(f"this CPU has no oneDNN bfloat16 path: {kernels.probe('int8-bf16')}")
    g = torch.Generator().manual_seed(6)
    w, b = torch.randn(384, 1280, generator=g), torch.randn(384, generator=g)
    q, scale = int8_per_channel(w)
    one_pass, int8pack = Int8AsBF16(q, scale), Int8Weight(q, scale)
    values = q.float() * scale.bfloat16().float()[:, None]  # the weights both kernels multiply by (exact)
    for M in (1, 2, 5, 9, 16):
        x = torch.randn(1, M, 1280, generator=g)
        y = one_pass(x, b)
        assert y.shape == (1, M, 384) and y.dtype == torch.float32
        torch.testing.assert_close(y, x.bfloat16().float() @ values.T + b, rtol=0.01, atol=0.02)
        ours, theirs = one_pass(x.bfloat16(), None).float(), int8pack(x.bfloat16(), None).float()
        one_step = torch.maximum(ours.abs(), theirs.abs()) * 2**-7  # bfloat16 keeps 8 significant bits
        assert ((ours - theirs).abs() <= one_step).all(), M
        assert (ours != theirs).float().mean() < 0.01, M


def test_onednn_packed_weight_matches_f_linear():
    if not kernels.works("onednn-bf16"):
        pytest.skip(f"this CPU has no oneDNN bfloat16 path: {kernels.probe('onednn-bf16')}")
    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(48, 64, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    for M in (1, 5, 9):
        x = torch.randn(1, M, 64, generator=g).bfloat16()
        y = OneDNNPackedWeight(w)(x, b).float()
        reference = x.float() @ w.float().T + b.float()
        assert (y - reference).abs().max() < 0.02 * reference.abs().max()


@pytest.mark.parametrize("name", ["bf16", "int8", "fp16"])
def test_speculative_greedy_equals_same_format_target(text_pair_dirs, name):
    """Greedy speculative output = the same-format target's own greedy output. Verifying several
    tokens and decoding one use different matmul shapes, so in 16-bit formats a near-tie may flip;
    if it does, the two tokens' logits must be that close (the guide's numerics note)."""
    target_dir, draft_dir = text_pair_dirs
    target, draft = load_accelerated(target_dir, **FORMATS[name]), load_accelerated(draft_dir, **FORMATS[name])
    prompt = list(range(100, 120))
    ar = autoregressive_generate(target, prompt, 40).tokens
    spec = speculative_sampling_greedy(target, draft, prompt, 40, gamma=4).tokens
    if spec != ar:
        i = next(i for i, (a, s) in enumerate(zip(ar, spec)) if a != s)
        scores = logits(target, torch.tensor([prompt + ar[:i]]))[0, -1]
        gap = (scores[ar[i]] - scores[spec[i]]).abs().item()
        assert gap < 0.05 * (scores.max() - scores.min()).item(), f"not a near-tie at {i}: gap {gap}"
    else:
        assert spec == ar


@pytest.mark.parametrize("name", ["bf16", "int8", "fp16"])
def test_lossless_in_each_format(make_checkpoint, name):
    """Sampled speculative output follows the target *as loaded* (its exact distribution,
    enumerated), whatever the weight format."""
    target = load_accelerated(make_checkpoint(TINY_VOCAB, seed=21, std=0.2, embedding_std=0.3), **FORMATS[name])
    draft = load_accelerated(make_checkpoint(TINY_VOCAB, seed=22, std=0.2, embedding_std=0.3), **FORMATS[name])
    # Fewer samples than test_lossless (these kernels have a higher per-call cost at these tiny
    # sizes): enough to catch a gross deviation, such as samples from the draft (checked below);
    # the format's small shift of p itself is defined away (lossless is relative to the target as
    # loaded).
    generate = lambda prompt, n, **kw: speculative_sampling(target, draft, prompt, n, 2, **kw)
    result = check_lossless(generate, target, [1, 2, 3], 3, dict(temperature=1.0), samples=400, seed=7)
    assert result.passed, result
    # the same check, as many samples, fails the draft's own samples
    draft_alone = lambda prompt, n, **kw: autoregressive_generate(draft, prompt, n, **kw)
    result = check_lossless(draft_alone, target, [1, 2, 3], 3, dict(temperature=1.0), samples=400, seed=7)
    assert not result.passed and result.p_value < 1e-6, result


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="float8"), "is not supported"),
    (dict(dtype=torch.int8), "is not supported"),
    (dict(quantize="int4"), "quantize must be"),
    (dict(quantize="fp16", dtype="bfloat16"), "needs dtype 'float32'"),
])
@pytest.mark.parametrize("load", [load_gpt2, load_accelerated])
def test_bad_format_options_give_clear_errors(medium_dir, kwargs, message, load):
    with pytest.raises(ValueError, match=message):
        load(medium_dir, **kwargs)
