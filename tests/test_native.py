"""Our C kernel (gpt2/speed/csrc/rows_linear.c through gpt2/speed/native.py): x @ W.T + bias against float64
on float16 and float32 weights, at shapes that leave every tail of its loops some work; int8
computing the int8 format's float32 arithmetic bit for bit; a row's result the same bits alone as among others (what a
verification and a decode step must share); and a clear line where it cannot be built or run."""

import math

import pytest
import torch

import gpt2.speed.kernels as kernels
from gpt2.speed import load_accelerated, native
from gpt2.speed.fast_linear import NativeInt8Linear, NativeRowsLinear, int8_per_channel
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

needs_native = pytest.mark.skipif(native.why_not() is not None, reason=f"no C kernel here: {native.why_not()}")

# (out, in): a group of four 16-row panels and two panels left (96), one group only (64), three
# panels, the last partial (37), a single partial panel (5, 13); odd and small input widths.
SHAPES = [(96, 1280), (64, 768), (37, 100), (5, 7), (13, 40)]


@needs_native
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("out,inp", SHAPES)
def test_the_c_kernel_computes_x_times_w_transposed_plus_bias(out, inp, dtype):
    g = torch.Generator().manual_seed(out + inp)
    w, b = torch.randn(out, inp, generator=g), torch.randn(out, generator=g)
    kernel = NativeRowsLinear(w, dtype)
    exact = w.to(dtype).double()  # the weights as the kernel holds them
    for rows in (1, 2, 3, 5, 9):
        x = torch.randn(1, rows, inp, generator=g)
        for bias in (b, None):
            y = kernel(x, bias)
            assert y.shape == (1, rows, out) and y.dtype == torch.float32
            reference = x.double() @ exact.T + (0 if bias is None else bias.double())
            # float32 sums of `inp` products: a few ulps of the largest partial sum
            assert (y.double() - reference).abs().max() <= 1e-6 * inp ** 0.5 * reference.abs().max(), (rows, bias is None)


def int8_step_by_step(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The int8 format's defined computation, one input at a time in PyTorch: for k = 0, 1, ...,
    acc = float32(acc + x[:, k] * q[:, k]) (the product of a float32 and an int8 is exact in
    float64, and so is its sum with acc unless the two are more than 22 binary orders apart: an
    FMA's result), then acc * scale and + bias, each rounded to float32. x [rows, in] -> [rows, out]."""
    acc = torch.zeros(x.shape[0], q.shape[0], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = (acc.double() + x[:, k:k + 1].double() * q[:, k].double()).float()
    y = acc * scale
    return y if bias is None else y + bias


@needs_native
@pytest.mark.parametrize("out,inp", SHAPES)
def test_int8_computes_the_int8_formats_arithmetic_bit_for_bit(out, inp):
    """int8 weights q with a float32 scale per output: each output is the float32 running sum of
    q * x over the inputs in order (x as given, float32), times its scale, plus the bias, nothing
    rounded to 16 bits: the same bits as that computation written out in PyTorch, for a decode
    step and for verifications. (Fails on the kernel that rounded x and its outputs to bfloat16.)"""
    g = torch.Generator().manual_seed(out * inp)
    w, b = torch.randn(out, inp, generator=g), torch.randn(out, generator=g)
    q, scale = int8_per_channel(w)
    kernel = NativeInt8Linear(q, scale)
    for rows in (1, 2, 5, 9):
        x = torch.randn(rows, inp, generator=g)
        for bias in (b, None):
            y = kernel(x, bias)
            assert y.shape == (rows, out) and y.dtype == torch.float32
            assert torch.equal(y, int8_step_by_step(x, q, scale, bias)), (rows, bias is None)


@needs_native
def test_the_c_kernel_reaches_every_input_and_every_output():
    """The last input and the last outputs (in a partial panel) count: a weight whose only non-zero
    column is the last gives exactly x's last column times it, for a step (1 row) and for more."""
    w = torch.zeros(35, 45)
    w[:, -1] = torch.arange(1, 36) / 8  # exact in float16
    for rows in (1, 5, 7):
        x = torch.randn(rows, 45, generator=torch.Generator().manual_seed(rows))
        for dtype in (torch.float16, torch.float32):
            assert torch.equal(NativeRowsLinear(w, dtype)(x, None), x[:, -1:] * w[:, -1]), (rows, dtype)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8])
def test_a_row_gives_the_same_bits_alone_as_among_others(dtype):
    """A decode step runs one row, a verification of gamma tokens gamma + 1: on this kernel the
    same row gives the same bits either way (each dot product is summed in one order), so greedy
    speculative decoding on it cannot part from plain greedy decoding through the linear layers."""
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(200, 1280, generator=g), torch.randn(200, generator=g)
    kernel = NativeInt8Linear(*int8_per_channel(w)) if dtype == torch.int8 else NativeRowsLinear(w, dtype)
    for rows in (2, 3, 5, 6, 7, 9, 16):
        x = torch.randn(rows, 1280, generator=g)
        together = kernel(x, b)
        alone = torch.cat([kernel(x[i:i + 1], b) for i in range(rows)])
        assert torch.equal(together, alone), rows


@needs_native
@pytest.mark.parametrize("fmt", ["fp16", "int8"])
def test_greedy_speculative_equals_plain_greedy_on_the_c_kernel(text_pair_dirs, monkeypatch, fmt):
    """float16 or int8 weights, every linear layer on the C kernel for every row count: the
    speculative output is the target's own greedy output, token for token."""
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)  # this small pair's layers get the kernel too
    monkeypatch.setitem(kernels.CANDIDATES, fmt, (f"native-{fmt}",))  # the only path of the format
    target_dir, draft_dir = text_pair_dirs
    target, draft = load_accelerated(target_dir, format=fmt), load_accelerated(draft_dir, format=fmt)
    for model in (target, draft):
        assert len(kernels.attached(model)) == 4 * model.config.n_layer + 1  # every linear layer and the head
        assert {tuple(k.kernel.paths()) for k in kernels.attached(model)} == {((math.inf, f"native-{fmt}"),)}
    prompt = list(range(100, 120))
    ar = autoregressive_generate(target, prompt, 40).tokens
    assert speculative_sampling_greedy(target, draft, prompt, 40, gamma=4).tokens == ar


@needs_native
def test_the_avx512_build_compiles_on_any_host(tmp_path):
    """The AVX-512 code is compiled (not run) wherever the compiler knows the instructions, so an
    error in it shows on a host without them too."""
    native.build(native.compiler(), tmp_path / "wide.so", native.build_flags(True))
    assert (tmp_path / "wide.so").stat().st_size > 0
    # and the w8a8 kernel's AVX512-VNNI code, which only a CPU with VNNI runs
    native.build(native.compiler(), tmp_path / "vnni.so", native.FLAGS + native.WIDE_FLAGS + native.VNNI_FLAGS)
    assert (tmp_path / "vnni.so").stat().st_size > 0
    # and the AVX2 build's AVX-VNNI code (gcc 11 or later)
    native.build(native.compiler(), tmp_path / "avx_vnni.so", native.build_flags(False, avx_vnni_build=True))
    assert (tmp_path / "avx_vnni.so").stat().st_size > 0


@needs_native
@pytest.mark.skipif("avx512f" not in native.kernel_cache.cpu_flags(), reason="needs an AVX-512 CPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.int8])
def test_the_avx512_build_gives_the_avx2_builds_bits(dtype):
    """Each 16-lane vector lane sums what the AVX2 lane of the same output sums, in the same order:
    the two builds agree bit for bit, alone and among other rows (decode step and verification)."""
    g = torch.Generator().manual_seed(7)
    w, b = torch.randn(100, 1280, generator=g), torch.randn(100, generator=g)
    if dtype == torch.int8:
        q, scale = int8_per_channel(w)
        panels, scale = native.pack_panels(q, torch.int8), scale.float().contiguous()
    else:
        panels, scale = native.pack_panels(w, dtype), None
    for rows in (1, 2, 5, 6, 7, 13):
        x = torch.randn(rows, 1280, generator=g)
        narrow, wide = (native.rows_linear(x, panels, 100, b, scale, lib=native.library(wide_build=v))
                        for v in (False, True))
        assert torch.equal(narrow, wide), rows


def test_without_the_instructions_or_a_compiler_the_probe_says_why(monkeypatch):
    monkeypatch.setattr(native.kernel_cache, "cpu_flags", lambda: ("avx2",))
    assert native.why_not() == "this CPU lacks fma, f16c (the C kernel is AVX2 with FMA and F16C)"
    monkeypatch.setattr(native.kernel_cache, "cpu_flags", lambda: ("avx2", "f16c", "fma"))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    assert "no C compiler found" in native.why_not()
    monkeypatch.setattr(kernels, "_PROBED", {})
    assert "no C compiler found" in kernels.probe("native-fp16")
    assert not kernels.works("native-f32")


@needs_native
def test_a_failing_compiler_gives_its_message(tmp_path, monkeypatch):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc: error: this compiler is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    monkeypatch.setenv("GPT2_KERNEL_CACHE", str(tmp_path / "cache" / "kernels.json"))
    monkeypatch.setattr(native, "_LIBRARY", None)
    monkeypatch.setattr(native, "_BUILDS", {})
    with pytest.raises(RuntimeError, match="compiling rows_linear.c with .*cc failed:\ncc: error: this compiler is broken"):
        native.library()
    assert not (tmp_path / "cache" / "native").exists() or not any((tmp_path / "cache" / "native").glob("*.so"))


def test_an_edited_c_kernel_is_measured_again(kernel_cache_file, monkeypatch):
    """A kept kernel choice that included the C kernel holds its source's hash: the same source
    reads the choice, an edited one (a git pull, a student's change) measures again."""
    timed = []

    def time_kernels(named, in_features, dtype, rows=kernels.ROW_COUNTS, repeats=5):
        timed.append(sorted(named))
        return {name: {m: 1.0 if name == "native-f32" else 2.0 for m in rows} for name in named}

    monkeypatch.setattr(kernels, "time_kernels", time_kernels)
    sample = lambda: [torch.ones(8, 16)]  # noqa: E731 (never timed: time_kernels is the fake)
    paths = ["onednn", "native-f32"]

    def choose():
        monkeypatch.setattr(kernels.kernel_cache, "_KEPT", {})  # a new process: read the file again
        return kernels.rows_choice("float32", (8, 16), torch.float32, paths, sample)[0]

    assert choose() == [(16, "native-f32"), (math.inf, "onednn")] and len(timed) == 1
    assert choose() == [(16, "native-f32"), (math.inf, "onednn")] and len(timed) == 1  # kept
    monkeypatch.setattr(native, "source_tag", lambda: "edited")
    choose()
    assert len(timed) == 2
    assert kernels.rows_what("float32", (8, 16), torch.float32, ["onednn", "mm"]).get("native") is None
