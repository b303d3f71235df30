"""The w8a8 format (gpt2/speed/csrc/rows_linear.c's rows_linear_w8a8, NativeW8A8Linear): int8
weights and inputs rounded to int8 in blocks, integer dot products. The C kernel computes
fast_linear.w8a8_reference, the computation written out in PyTorch, bit for bit, in the AVX2 build
and the AVX-512 build (with VNNI where the CPU has it), at every row count a verification uses; a
row gives the same bits alone as among others; greedy speculative decoding in the format is plain
greedy decoding in it; the format is held, cached and decoded as int8's weights."""

import math

import pytest
import torch

import gpt2.speed.kernels as kernels
from gpt2.speed import load_accelerated, native
from gpt2.speed.fast_linear import (NativeW8A8Linear, W8A8_BLOCK, int8_per_channel, w8a8_quantize,
                                    w8a8_reference)
from gpt2.speed.stored_weights import StoredWeight
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

needs_native = pytest.mark.skipif(native.why_not() is not None, reason=f"no C kernel here: {native.why_not()}")

# (out, in): several panels with a partial last one and a partial last block (100: 3 blocks of 32
# and 4 inputs), whole blocks (1280), inputs not a multiple of 4 (70, 7), one partial panel (5, 13).
SHAPES = [(37, 100), (64, 1280), (40, 70), (5, 7), (13, 64)]
ROWS = range(1, 18)  # a step, every verification up to 16 draft tokens, and one more than a pass's rows


# The kernel's builds: AVX2 (vpmaddwd), AVX2 with AVX-VNNI, AVX-512 (with AVX512-VNNI where the CPU
# has it), each with the CPU flag it needs.
BUILDS = {"avx2": dict(wide_build=False, avx_vnni_build=False), "avx_vnni": dict(wide_build=False, avx_vnni_build=True),
          "avx512": dict(wide_build=True)}
NEEDS = {"avx2": "avx2", "avx_vnni": "avx_vnni", "avx512": "avx512f"}


def builds():
    """The builds this host can run."""
    return [native.library(**BUILDS[b]) for b in BUILDS if NEEDS[b] in native.kernel_cache.cpu_flags()]


def inputs(rows: int, inp: int, generator) -> torch.Tensor:
    """Rows with what the rounding has to get right: widely different magnitudes per block, an
    all-zero block, a block with one large value, exact halves of a step."""
    x = torch.randn(rows, inp, generator=generator) * torch.rand(rows, inp, generator=generator).mul(8)
    x[0, :W8A8_BLOCK] = 0  # a block of zeros: scale 0, inputs 0
    if rows > 1:
        x[1, 3] = 500.0  # an outlier: its block's other inputs round to few levels
    if rows > 2 and inp >= 4:
        x[2, :4] = torch.tensor([127.0, 0.5, -2.5, 1.5])  # scale 1: halves round to even
    return x


@needs_native
@pytest.mark.parametrize("out,inp", SHAPES)
def test_the_kernel_computes_the_written_out_computation_bit_for_bit(out, inp):
    g = torch.Generator().manual_seed(out * 1000 + inp)
    w, b = torch.randn(out, inp, generator=g), torch.randn(out, generator=g)
    q, scale = int8_per_channel(w)
    kernel = NativeW8A8Linear(q, scale)
    for lib in builds():
        kernel.lib = lib
        for rows in ROWS:
            x = inputs(rows, inp, g)
            for bias in (b, None):
                assert torch.equal(kernel(x, bias), w8a8_reference(x, q, scale, bias)), (lib._name, rows, bias is None)


@needs_native
def test_a_row_gives_the_same_bits_alone_as_among_others():
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(50, 1280, generator=g), torch.randn(50, generator=g)
    kernel = NativeW8A8Linear(*int8_per_channel(w))
    for lib in builds():
        kernel.lib = lib
        x = inputs(9, 1280, g)
        together = kernel(x[None], b)[0]
        alone = torch.cat([kernel(x[i:i + 1], b) for i in range(9)])
        assert torch.equal(together, alone)


@needs_native
def test_every_build_gives_the_same_bits():
    """vpmaddwd's pairs, AVX-VNNI's and AVX512-VNNI's quads: the same exact block sums, so the same
    outputs (on an AVX2 host without AVX-VNNI there is one build, and nothing to compare)."""
    g = torch.Generator().manual_seed(2)
    q, scale = int8_per_channel(torch.randn(100, 1280, generator=g))
    kernel = NativeW8A8Linear(q, scale)
    for rows in ROWS:
        x = inputs(rows, 1280, g)
        outputs = []
        for lib in builds():
            kernel.lib = lib
            outputs.append(kernel(x, None))
        assert all(torch.equal(outputs[0], other) for other in outputs[1:]), rows


def test_the_reference_tells_apart_what_a_kernel_could_get_wrong():
    """The bit-for-bit comparison can fail: each of these slips in the computation (one scale per
    row instead of per block, float64 sums, the blocks added in another order, rounding halves away
    from zero) changes the reference's bits on the inputs above."""
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(64, 1280, generator=g), torch.randn(64, generator=g)
    q, scale = int8_per_channel(w)
    x = inputs(5, 1280, g)
    right = w8a8_reference(x, q, scale, b)

    def per_row_scale(x):
        xs = x.abs().amax(-1) / 127
        xq = torch.round(x / xs[:, None]).to(torch.int64)
        return ((xq @ q.T.to(torch.int64)).float() * xs[:, None]) * scale + b

    def float64_sums(x):
        xq, xs = w8a8_quantize(x)
        blocks = xq.view(5, -1, W8A8_BLOCK).double() * xs[..., None].double()
        return ((blocks.view(5, -1) @ q.T.double()).float() * scale) + b

    def reversed_blocks(x):
        xq, xs = w8a8_quantize(x)
        sums = torch.einsum("rbk,obk->rob", xq.view(5, -1, W8A8_BLOCK), q.to(torch.int64).view(64, -1, W8A8_BLOCK))
        acc = torch.zeros(5, 64)
        for blk in reversed(range(xs.shape[1])):
            acc = acc + sums[:, :, blk].float() * xs[:, blk:blk + 1]
        return acc * scale + b

    for slip in (per_row_scale, float64_sums, reversed_blocks):
        assert not torch.equal(slip(x), right), slip.__name__
    halves = torch.zeros(1, W8A8_BLOCK)
    halves[0, :4] = torch.tensor([127.0, 0.5, -2.5, 1.5])
    xq, _ = w8a8_quantize(halves)
    assert xq[0, :4].tolist() == [127, 0, -2, 2]  # half to even; away from zero would give 1, -3, 2


def test_quad_panels_hold_the_int8_weights_exactly():
    g = torch.Generator().manual_seed(4)
    for out, inp in SHAPES:
        q, scale = int8_per_channel(torch.randn(out, inp, generator=g))
        panels = native.pack_quad_panels(q)
        assert panels.dtype == torch.uint8 and panels.shape == (math.ceil(out / 16), math.ceil(inp / 4), 16, 4)
        assert torch.equal(native.unpack_quad_panels(panels, out, inp), q)
        stored = StoredWeight("w8a8", {"panels": panels, "scale": scale}, (out, inp), torch.float32)
        assert torch.equal(stored.decode(), q.float() * scale[:, None])
        assert torch.equal(stored.int8()[0], q)
        index = torch.tensor([0, out - 1, out // 2])
        assert torch.equal(stored.rows(index), (q.float() * scale[:, None])[index])


@needs_native
@pytest.mark.parametrize("build", list(BUILDS))
def test_greedy_speculative_equals_plain_greedy_in_w8a8(text_pair_dirs, monkeypatch, build):
    """Every linear layer and the head on the w8a8 kernel (each build this CPU runs): the
    speculative output is the target's own greedy output in the format, token for token, and the
    weights are held once, as the kernel's quad panels."""
    if NEEDS[build] not in native.kernel_cache.cpu_flags():
        pytest.skip(f"needs a CPU with {NEEDS[build]}")
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)  # this small pair's layers get the kernel too
    monkeypatch.setattr(native, "_LIBRARY", native.library(**BUILDS[build]))
    target_dir, draft_dir = text_pair_dirs
    target, draft = load_accelerated(target_dir, format="w8a8"), load_accelerated(draft_dir, format="w8a8")
    for model in (target, draft):
        assert model.format == "w8a8" and model.quantize == "w8a8"
        layers = kernels.attached(model)
        assert len(layers) == 4 * model.config.n_layer + 1
        assert {tuple(k.kernel.paths()) for k in layers} == {((math.inf, "native-w8a8"),)}
        assert {layer.stored.layouts["panels"].dtype for layer in layers} == {torch.uint8}
    prompt = list(range(100, 120))
    ar = autoregressive_generate(target, prompt, 40).tokens
    assert speculative_sampling_greedy(target, draft, prompt, 40, gamma=4).tokens == ar


@needs_native
def test_w8a8_rounds_the_inputs_as_well_as_the_weights(text_pair_dirs, monkeypatch):
    """The format is its own computation: its logits are neither float32's nor int8's, and within
    the fidelity bound auto asks of a format on this pair."""
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)
    target_dir, _ = text_pair_dirs
    tokens = torch.arange(100, 132)[None]
    with torch.inference_mode():
        logits = {fmt: load_accelerated(target_dir, format=fmt)(tokens) for fmt in ("float32", "int8", "w8a8")}
    assert not torch.equal(logits["w8a8"], logits["int8"])
    assert kernels.fidelity(logits["float32"], logits["w8a8"])["kl"] <= kernels.FIDELITY_MAX_KL
