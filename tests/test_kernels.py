"""gpt2/speed/kernels.py: the capability probe (a path that raises or miscomputes is never used), the
GPT2_CPU=avx2 switch, kernels chosen per number of rows (every choice computes the plain path's
logits), bfloat16 on a CPU without its fast path (runs, slower, with one note), the plain model and
the accelerated one (load_gpt2: F.linear; gpt2.speed's FastLinear layers: the same float32 logits),
and the choices measured once per machine and kept (gpt2/speed/kernel_cache.py).

These run on every CPU; .ci/run runs them a second time as on an AVX2-only CPU (GPT2_CPU=avx2
with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2), so each host tests both kinds of paths."""

import ast
import json
import math
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import gpt2.speed.device as device
import gpt2.speed.kernel_cache as kernel_cache
import gpt2.speed.kernels as kernels
from conftest import ROOT, plain_with_format_values
from gpt2 import GPT2, GPT2Config, load_gpt2
from gpt2.speed import FastGPT2, fast_model, load_accelerated
from spec_decoding import autoregressive_generate
from gpt2.speed.fast_linear import int8_per_channel

# Every linear layer at least ONEDNN_MIN_WEIGHTS (n_embd 512): measured and routed like GPT-2's.
WIDE = GPT2Config(n_layer=1, n_head=8, n_embd=512, n_positions=32, vocab_size=512)
FORMATS = {"float32": dict(dtype="float32"), "bfloat16": dict(dtype="bfloat16"),
           "float16": dict(dtype="float16"), "fp16": dict(quantize="fp16"), "int8": dict(quantize="int8")}


@pytest.fixture(scope="module")
def wide_dir(make_checkpoint):
    return make_checkpoint(WIDE, seed=4, std=0.05, embedding_std=0.3)


@pytest.fixture
def fresh_probe(monkeypatch):
    """A probe with nothing tried yet, restored afterwards."""
    monkeypatch.setattr(kernels, "_PROBED", {})
    monkeypatch.setattr(device, "_NOTES_SHOWN", set())


def paths_used(model) -> set[str]:
    return {path for k in kernels.attached(model) for _, path in k.kernel.paths()}


def choice_of(model) -> list[tuple[float, str]]:
    """The one kernel choice of every attached layer ([(max_rows, path)])."""
    choices = {tuple(k.kernel.paths()) for k in kernels.attached(model)}
    assert len(choices) == 1, choices
    return list(choices.pop())


MM_BELOW_PROMPTS = [(16, "mm"), (math.inf, "onednn")]  # mm wins every row count timed; prompts: the default


def logits(model, idx):
    with torch.inference_mode():
        return model(idx).float()


def test_the_plain_paths_always_work_and_every_probe_says_why_not():
    assert kernels.works("linear") and kernels.works("mm")  # the fallbacks, on every CPU
    for path in kernels.PATHS:
        why = kernels.probe(path)
        assert why is None or (isinstance(why, str) and why), path
    with pytest.raises(ValueError, match="unknown kernel path 'avx9000'"):
        kernels.probe("avx9000")


def test_a_path_that_raises_or_miscomputes_is_never_used(wide_dir, fresh_probe, monkeypatch):
    calls = []

    def broken(weight):
        calls.append(1)
        raise RuntimeError("bf16 path needs the cpu support avx_ne_convert or avx512bw")

    class Wrong:  # runs, but computes something else
        def __init__(self, weight):
            self.weight = weight

        def __call__(self, x, bias):
            return 2 * torch.nn.functional.linear(x, self.weight, bias)

    monkeypatch.delenv("GPT2_CPU", raising=False)  # the probe must try the path itself
    monkeypatch.setitem(kernels.KERNELS, "onednn-bf16", broken)
    monkeypatch.setitem(kernels.KERNELS, "onednn", Wrong)
    assert "RuntimeError: bf16 path needs" in kernels.probe("onednn-bf16")
    assert "computed something else" in kernels.probe("onednn")
    assert len(calls) == 1
    model = load_accelerated(wide_dir, dtype="bfloat16")  # runs, without the broken path
    assert len(calls) == 1  # tried once, never again in this process
    used = paths_used(model)
    assert used and "onednn-bf16" not in used
    model32 = load_accelerated(wide_dir, dtype="float32")
    assert kernels.attached(model32) and "onednn" not in paths_used(model32)
    idx = torch.randint(0, WIDE.vocab_size, (1, 7), generator=torch.Generator().manual_seed(0))
    reference = logits(model32, idx)
    spread = (reference.max() - reference.min()).item()
    assert (logits(model, idx) - reference).abs().max() < 0.05 * spread


def test_gpt2_cpu_avx2_acts_as_a_cpu_without_bf16(fresh_probe, monkeypatch):
    monkeypatch.setenv("GPT2_CPU", "avx2")
    assert kernels.emulated_cpu() == "avx2" and not kernels.cpu_has_bf16_instructions()
    assert "GPT2_CPU=avx2" in kernels.probe("onednn-bf16")
    assert "onednn-bf16" not in kernels.candidates("bfloat16", torch.bfloat16)
    assert kernels.works("linear")
    monkeypatch.setenv("GPT2_CPU", "avx9000")
    with pytest.raises(ValueError, match="GPT2_CPU='avx9000' is not known: use GPT2_CPU=avx2"):
        kernels.emulated_cpu()


def test_gpt2_cpu_avx2_vnni_keeps_avx_vnni_and_drops_avx512(fresh_probe, monkeypatch):
    """GPT2_CPU=avx2-vnni acts as an AVX2 CPU with AVX-VNNI: no bfloat16 path, our C kernel's AVX2
    build, with AVX-VNNI where the CPU has it; GPT2_CPU=avx2 leaves AVX-VNNI out."""
    from gpt2.speed import native
    monkeypatch.setenv("GPT2_CPU", "avx2-vnni")
    assert kernels.emulated_cpu() == "avx2-vnni" and not kernels.cpu_has_bf16_instructions()
    assert "GPT2_CPU=avx2-vnni" in kernels.probe("onednn-bf16")
    assert not native.wide() and native.avx_vnni() == ("avx_vnni" in native.kernel_cache.cpu_flags())
    monkeypatch.setenv("GPT2_CPU", "avx2")
    assert not native.wide() and not native.avx_vnni()
    assert "-mavxvnni" not in native.build_flags(False) and "-mavxvnni" in native.build_flags(False, True)


def test_bfloat16_without_its_fast_path_runs_with_one_note(wide_dir, fresh_probe, monkeypatch, capsys):
    monkeypatch.setitem(kernels._PROBED, "onednn-bf16", "RuntimeError: needs avx512bw")
    model = load_accelerated(wide_dir, dtype=torch.bfloat16)
    load_accelerated(wide_dir, dtype="bf16")  # the same note is not said twice
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: bfloat16 has no fast kernel on this CPU")
    assert "Faster here:" in notes[0] and "needs avx512bw" in notes[0]
    idx = torch.randint(0, WIDE.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    reference = logits(load_gpt2(wide_dir), idx)  # the plain float32 model
    assert logits(model, idx).dtype == torch.float32  # (converted by logits())
    assert (logits(model, idx) - reference).abs().max() < 0.05 * (reference.max() - reference.min())


def test_rows_aware_kernel_runs_each_call_on_its_rows_kernel():
    seen = []

    def kernel(name):
        return lambda x, bias: seen.append((name, x.numel() // x.shape[-1])) or x

    k = kernels.RowsAwareKernel([(1, "a", kernel("a")), (3, "b", kernel("b")), (math.inf, "c", kernel("c"))])
    for rows in (1, 2, 3, 4, 40):
        k(torch.zeros(1, rows, 8), None)
    k(torch.zeros(2, 1, 8), None)  # 2 sequences of 1 token: 2 rows
    assert seen == [("a", 1), ("b", 2), ("b", 3), ("c", 4), ("c", 40), ("b", 2)]
    assert kernels.describe_choice(k.paths()) == "1 row: a, 2-3 rows: b, 4+ rows: c"


def test_choose_by_rows_takes_the_fastest_per_row_count(monkeypatch):
    measured = {"onednn": {1: 1.0, 2: 3.0, 5: 4.0, 9: 5.0}, "mm": {1: 2.0, 2: 2.0, 5: 3.0, 9: 6.0},
                "linear": {1: 9.0, 2: 9.0, 5: 9.0, 9: 9.0}}
    monkeypatch.setattr(kernels, "time_kernels", lambda ks, *a, **kw: {p: measured[p] for p in ks})
    choice, times = kernels.choose_by_rows([torch.zeros(8, 4)], ["onednn", "mm", "linear"])
    # 1 row: onednn; 2-7 rows: mm (2 and 5 rows merged); 8-16: onednn; more (a prompt): the default
    assert choice == [(1, "onednn"), (7, "mm"), (math.inf, "onednn")]
    assert times == measured
    measured["mm"][2] = 2.9  # 3% faster than the default at 2 rows: a near-tie, the default stays
    choice, _ = kernels.choose_by_rows([torch.zeros(8, 4)], ["onednn", "mm", "linear"])
    assert choice == [(3, "onednn"), (7, "mm"), (math.inf, "onednn")]


def test_int8_runs_only_on_kernels_with_float32_outputs():
    """The int8 format is one float32 computation, on our C kernel only: the library's int8
    products (_weight_int8pack_mm, and int8 on oneDNN's bfloat16 matmul) round every output to
    bfloat16 (the low 16 bits of each float32 output zero), which would put an int8 head's logits
    on a bfloat16 grid. (Fails while they are among int8's candidates, as they were.)"""
    g = torch.Generator().manual_seed(8)
    w, x = torch.randn(256, 512, generator=g), torch.randn(5, 512, generator=g)
    q, scale = int8_per_channel(w)
    values = q.float() * scale[:, None]  # what an int8 model's parameters hold
    for path in ("int8pack", "int8-bf16"):
        if kernels.works(path):
            y = kernels.build_kernel(path, values, (q, scale))(x, None)
            assert ((y.view(torch.int32) & 0xFFFF) == 0).all(), path
            assert path not in kernels.CANDIDATES["int8"]
    for path in kernels.candidates("int8", torch.float32):
        y = kernels.build_kernel(path, values, (q, scale))(x, None)
        assert ((y.view(torch.int32) & 0xFFFF) != 0).double().mean() > 0.99, path
        assert (y - x @ values.T).abs().max() <= 1e-5 * y.abs().max(), path  # float32 sums, other order


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_kernel_choice_gives_the_plain_paths_logits(wide_dir, fmt, fresh_probe):
    """Whatever the measurement picks, the logits are the plain path's (gpt2/model.py as written,
    F.linear on parameters holding the format's values) up to rounding: each working path alone,
    and one path per range of rows (a decode step and a verification on different kernels), each
    attached to a FastGPT2 on the plain model's own tensors."""
    plain = plain_with_format_values(wide_dir, fmt)
    dtype = plain.wte.weight.dtype
    paths = kernels.candidates(fmt if fmt in ("fp16", "int8") else str(dtype).removeprefix("torch."), dtype)
    assert paths and all(kernels.works(p) for p in paths)
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    plain_9, plain_1 = logits(plain, idx), logits(plain, idx[:, :1])
    spread = (plain_9.max() - plain_9.min()).item()
    # 16-bit activations (bfloat16, float16) round differently per kernel; float32 math (float32,
    # float16 weights, int8 weights) differs only in the order of its float32 sums
    tol = 1e-4 if fmt in ("float32", "fp16", "int8") else 0.02
    choices = [[(math.inf, p)] for p in paths] + ([[(1, paths[-1]), (math.inf, paths[0])]] if len(paths) > 1 else [])
    for choice in choices:
        model = FastGPT2.holding(plain)
        weights = kernels.linear_weights(model)  # the tied head's (wte), then every nn.Linear's
        assert len(weights) == 4 * WIDE.n_layer + 1
        # the int8 weights: quantizing the dequantized values gives back the same (q, scale)
        int8 = {w: int8_per_channel(w) for w in weights} if fmt == "int8" else None
        kernels.attach_kernels(model, int8=int8, fp16=fmt == "fp16", choose=lambda *a, c=choice: c)
        assert all(k.kernel.paths() == choice for k in kernels.attached(model))
        assert len(kernels.attached(model)) == len(weights)
        for got, want in ((logits(model, idx), plain_9), (logits(model, idx[:, :1]), plain_1)):
            assert (got - want).abs().max() <= tol * spread, (fmt, choice)


def test_the_report_lists_every_path():
    from gpt2.speed.kernel_report import report
    text = report()
    assert text.startswith("CPU: ") and "ATen CPU capability" in text
    for path in kernels.PATHS:
        assert path in text


def imports_of(name: str) -> set[str]:
    tree = ast.parse(Path(ROOT / "gpt2" / name).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {f"{'.' * n.level}{n.module or ''}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {f"{'.' * n.level}{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 for a in n.names}
    return imported


# What kernels.py may import of the model's side: the accelerated model's own classes (it puts
# their layers in place, gpt2/speed/fast_model.py); and the stored weights.
KERNELS_MAY_IMPORT = {".fast_model": {"FastEmbedding", "FastGPT2", "FastLinear"},
                      ".stored_weights": {"StoredWeight", "give_back_freed_memory"}}


def imported_names(name: str) -> dict[str, set[str]]:
    """{module as written in the import: the names imported from it} of a file under gpt2/."""
    tree = ast.parse(Path(ROOT / "gpt2" / name).read_text())
    found: dict[str, set[str]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                found.setdefault(a.name, set())
        elif isinstance(n, ast.ImportFrom):
            found.setdefault(f"{'.' * n.level}{n.module or ''}", set()).update(a.name for a in n.names)
    return found


def test_the_model_imports_no_kernels_and_the_kernels_no_model():
    """gpt2/model.py is plain PyTorch: it imports none of the kernel files. gpt2/speed/kernels.py
    imports fast_linear.py and kernel_cache.py, and of the model's side only the accelerated
    model's classes (fast_model.py: FastEmbedding, FastGPT2, FastLinear) and the stored
    weights: nothing of gpt2/model.py, loading or the checkpoints. fast_linear.py and
    kernel_cache.py import no model; fast_model.py and stored_weights.py import no kernels (no
    cycle)."""
    assert not any("kernel" in i or "fast_linear" in i or "speed" in i for i in imports_of("model.py"))
    for name in ("speed/fast_linear.py", "speed/kernel_cache.py"):
        imported = imports_of(name)
        assert not any("model" in i or "loading" in i for i in imported), (name, imported)
    model_side = {module: names for module, names in imported_names("speed/kernels.py").items()
                  if any(word in module for word in ("model", "loading", "checkpoints", "stored_weights",
                                                     "accelerator"))}
    assert set(model_side) <= set(KERNELS_MAY_IMPORT), model_side
    assert all(names <= KERNELS_MAY_IMPORT[module] for module, names in model_side.items()), model_side
    for name in ("speed/fast_model.py", "speed/stored_weights.py"):
        imported = imports_of(name)
        assert not any(i.endswith("kernels") or "loading" in i or "accelerator" in i for i in imported), (name, imported)


# ---------------------------------------------------------------------------------------------
# The plain model (load_gpt2) and the accelerated one (FastLinear layers on the chosen kernels)


def count_f_linear(monkeypatch) -> list:
    """Make torch.nn.functional.linear count its calls (it still computes): the list of calls."""
    calls, plain = [], torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **kw: calls.append(1) or plain(*a, **kw))
    return calls


def test_stepping_into_the_plain_model_reaches_f_linear(wide_dir, monkeypatch):
    """load_gpt2 is gpt2/model.py as written: every linear layer and the head run
    torch.nn.functional.linear. An accelerated model runs them on its FastLinear layers' kernels
    instead (here pinned to oneDNN, which never calls F.linear). Its to_plain() is a plain GPT2
    again, F.linear everywhere, with the same logits up to float32 rounding, and leaves the
    accelerated model as it was."""
    plain = load_gpt2(wide_dir)
    fast = FastGPT2.holding(load_gpt2(wide_dir))
    kernels.attach_kernels(fast, choose=lambda *a: [(math.inf, "onednn")])
    assert kernels.attached(plain) == [] and len(kernels.attached(fast)) == 4 * WIDE.n_layer + 1
    assert type(plain) is GPT2 and type(plain.h[0].mlp.c_fc) is nn.Linear
    idx = torch.tensor([[1, 2, 3]])
    calls = count_f_linear(monkeypatch)
    want = logits(plain, idx)
    assert len(calls) == 4 * WIDE.n_layer + 1  # 4 per block, and the head
    calls.clear()
    got = logits(fast, idx)
    assert calls == []
    back = fast.to_plain()  # and back: a plain model again
    assert type(back) is GPT2 and kernels.attached(back) == [] and type(back.h[0].mlp.c_fc) is nn.Linear
    again = logits(back, idx)
    assert len(calls) == 4 * WIDE.n_layer + 1
    spread = (want.max() - want.min()).item()
    assert (got - want).abs().max() <= 1e-5 * spread and (again - got).abs().max() <= 1e-5 * spread
    calls.clear()
    assert torch.equal(logits(fast, idx), got) and calls == []  # the accelerated model unchanged


def test_the_kernel_choice_is_logged_and_gpt2_fast_linear_0_runs_f_linear(wide_dir, monkeypatch, capsys, caplog):
    """The kernel choice is logged (logger gpt2.speed) and kept on the model, never printed, and
    the line names the plain model; load_gpt2 without speed options attaches nothing and says
    nothing. With GPT2_FAST_LINEAR=0 (fast_model.ENABLED) every FastLinear runs F.linear on its
    values: the same logits up to float32 rounding."""
    caplog.set_level("INFO", logger="gpt2.speed")
    model = load_accelerated(wide_dir, dtype="float32")
    assert kernels.attached(model)
    assert model.kernel_choice.startswith("float32: 1+ rows: onednn")
    logged = [r.getMessage() for r in caplog.records if r.name == "gpt2.speed"]
    assert len(logged) == 1 and logged[0].startswith("kernels: gpt2/speed/kernels.py, float32: 1+ rows: onednn")
    assert "load_gpt2(path) without speed options" in logged[0] and "kernels:" not in capsys.readouterr().err
    caplog.clear()
    assert kernels.attached(load_gpt2(wide_dir)) == []
    assert capsys.readouterr().err == "" and not caplog.records
    idx = torch.randint(0, WIDE.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    fast = logits(model, idx)
    monkeypatch.setattr(fast_model, "ENABLED", False)  # what GPT2_FAST_LINEAR=0 sets at import
    calls = count_f_linear(monkeypatch)
    off = logits(model, idx)
    assert len(calls) == 4 * WIDE.n_layer + 1
    assert (off - fast).abs().max() <= 1e-5 * (off.max() - off.min())


@pytest.mark.parametrize("choice", [[(math.inf, "onednn")], [(math.inf, "mm")], [(math.inf, "linear")],
                                    [(1, "mm"), (math.inf, "onednn")]])
def test_float32_logits_are_the_same_plain_and_accelerated(wide_dir, choice):
    """The plain float32 model (load_gpt2) and one with each float32 kernel of this machine give
    the same logits and the same greedy tokens. Not bit for bit: oneDNN and MKL sum in other
    orders, so logits differ in their last bits (measured: under 1e-6 of their spread); the bound
    is 1e-5 of the spread, where a real difference (a bfloat16 rounding, a missing bias) is 1e-3
    or more. On F.linear ("linear") the two are the same computation: equal bit for bit."""
    if not all(kernels.works(path) for _, path in choice):
        pytest.skip(f"not on this CPU: {choice}")
    plain = load_gpt2(wide_dir)
    fast = FastGPT2.holding(load_gpt2(wide_dir))
    kernels.attach_kernels(fast, choose=lambda *a: choice)
    assert len(kernels.attached(fast)) == 4 * WIDE.n_layer + 1
    idx = torch.randint(0, WIDE.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    for rows in (idx[:, :1], idx):
        want, got = logits(plain, rows), logits(fast, rows)
        if choice == [(math.inf, "linear")]:
            assert torch.equal(got, want)
        assert (got - want).abs().max() <= 1e-5 * (want.max() - want.min())
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    prompt = [5, 6, 7]
    assert autoregressive_generate(fast, prompt, 12).tokens == autoregressive_generate(plain, prompt, 12).tokens


# ---------------------------------------------------------------------------------------------
# Packing on a layer's first call, not at load

# (int8's panels are packed while loading, one weight at a time, and kept in the weight cache:
# tests/test_footprint.py)
PACKING = [("bfloat16", "onednn-bf16"), ("fp16", "fbgemm-fp16")]


def count_builds(monkeypatch) -> list:
    """Make kernels.build_kernel record (path, weight) per call (it still builds): the list."""
    builds, build = [], kernels.build_kernel
    monkeypatch.setattr(kernels, "build_kernel", lambda path, w, *a: builds.append((path, w)) or build(path, w, *a))
    return builds


def built_for(builds: list, model) -> list[str]:
    """The paths of the kernels built for model's own weights (the probe builds others)."""
    mine = {id(w) for w in kernels.linear_weights(model)}  # (as held: a StoredWeight or the parameter)
    return [path for path, w in builds if id(w) in mine]


@pytest.mark.parametrize("fmt,path", PACKING)
def test_a_layer_packs_its_weights_on_its_first_call_once(wide_dir, fmt, path, monkeypatch, capsys):
    """Loading packs nothing (the load line says the first step pays it); the first forward packs
    every layer once, later forwards none; and the logits are those of a model packed at load
    (kernels.pack_now), bit for bit. Fails if packing stays in the load, or repeats per call."""
    if not kernels.works(path):
        pytest.skip(f"{path} does not work here: {kernels.probe(path)}")
    monkeypatch.setattr(device, "_NOTES_SHOWN", set())
    builds = count_builds(monkeypatch)
    model = load_accelerated(wide_dir, **FORMATS[fmt])
    assert f"{path} packs every layer's weights on its first call, side by side on" in model.kernel_choice
    assert paths_used(model) == {path} and built_for(builds, model) == []
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    first = logits(model, idx)
    assert len(kernels.linear_weights(model)) == 4 * WIDE.n_layer + 1
    assert built_for(builds, model) == [path] * len(kernels.linear_weights(model))
    again = logits(model, idx[:, :1])
    assert len(built_for(builds, model)) == len(kernels.linear_weights(model))  # packed once
    packed_at_load = load_accelerated(wide_dir, **FORMATS[fmt])
    assert kernels.pack_now(packed_at_load) == len(kernels.linear_weights(model))
    assert kernels.pack_now(packed_at_load) == 0
    assert torch.equal(first, logits(packed_at_load, idx)) and torch.equal(again, logits(packed_at_load, idx[:, :1]))


def test_the_first_call_on_a_path_packs_every_layer_of_that_model(wide_dir, monkeypatch):
    """One layer's first call packs all of its model's kernels on that path, not one layer at a
    time (a packing is a serial loop: side by side, the threads share it), and nothing of another
    model; on 2 threads the packing runs on the pool's threads, not the caller's. Fails if each
    layer packs on its own call."""
    path = "fbgemm-fp16" if kernels.works("fbgemm-fp16") else "native-int8"
    fmt = {"fbgemm-fp16": "fp16", "native-int8": "int8"}[path]
    model, other = load_accelerated(wide_dir, **FORMATS[fmt]), load_accelerated(wide_dir, **FORMATS[fmt])
    assert paths_used(model) == {path}
    threads, build = [], kernels.build_kernel
    monkeypatch.setattr(kernels, "build_kernel",
                        lambda p, w, *a: threads.append(threading.get_ident()) or build(p, w, *a))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    layer = model.h[0].mlp.c_fc
    with torch.inference_mode():
        layer(torch.randn(1, WIDE.n_embd))
    packed = [k for lin in kernels.attached(model) for _, _, k in lin.kernel.by_rows]
    assert all(k.packed for k in packed) and len(threads) == len(kernels.linear_weights(model)) == 4 * WIDE.n_layer + 1
    assert threading.get_ident() not in threads
    assert not any(k.packed for lin in kernels.attached(other) for _, _, k in lin.kernel.by_rows)


def test_a_path_no_call_takes_is_never_packed(wide_dir, monkeypatch):
    """One row on the packing path, more on the plain one: a prompt's forward packs nothing, the
    first one-row step packs each layer once."""
    path = "fbgemm-fp16" if kernels.works("fbgemm-fp16") else "native-int8"
    fmt = {"fbgemm-fp16": "fp16", "native-int8": "int8"}[path]
    model = FastGPT2.holding(plain_with_format_values(wide_dir, fmt))
    int8 = {w: int8_per_channel(w) for w in kernels.linear_weights(model)} if fmt == "int8" else None
    kernels.attach_kernels(model, int8=int8, fp16=fmt == "fp16", choose=lambda *a: [(1, path), (math.inf, "linear")])
    assert paths_used(model) == {path, "linear"}
    builds = count_builds(monkeypatch)
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(6))
    logits(model, idx)
    assert built_for(builds, model) == []
    logits(model, idx[:, :1])
    assert built_for(builds, model) == [path] * len(kernels.linear_weights(model))


# ---------------------------------------------------------------------------------------------
# Measured once per machine, kept in the user's cache folder


def fake_timings(monkeypatch, cost: dict) -> list:
    """Replace the timing with chosen costs (path -> seconds at every row count): the list of
    timing calls made."""
    calls = []

    def time_kernels(named, in_features, dtype, rows=kernels.ROW_COUNTS, repeats=5):
        calls.append(sorted(named))
        return {name: {m: cost.get(name.split("/")[-1], 1.0) for m in rows} for name in named}

    monkeypatch.setattr(kernels, "time_kernels", time_kernels)
    return calls


def test_the_choice_is_measured_once_and_read_by_later_runs(wide_dir, kernel_cache_file, monkeypatch, capsys):
    monkeypatch.setattr(device, "_NOTES_SHOWN", set())
    calls = fake_timings(monkeypatch, {"onednn": 2.0, "mm": 1.0, "linear": 3.0})
    model = load_accelerated(wide_dir, dtype="float32")
    err = capsys.readouterr().err.splitlines()
    assert len(calls) == 1 and choice_of(model) == MM_BELOW_PROMPTS
    assert err[0].startswith("measuring which kernel runs float32 weights [2048, 512] fastest on this machine, "
                             f"once: the choice is kept in {kernel_cache_file}"), err
    assert model.kernel_choice.startswith("float32: 1-16 rows: mm, 17+ rows: onednn (measured now, kept in")
    entry, = json.loads(kernel_cache_file.read_text())["entries"]
    assert entry["kind"] == "kernels" and entry["value"]["choice"] == [[16, "mm"], [None, "onednn"]]
    key = json.loads(entry["key"])
    assert key["machine"]["cpu"] == kernel_cache.cpu_name() and key["machine"]["torch"] == torch.__version__
    assert key["machine"]["threads"] == torch.get_num_threads() and key["what"]["shape"] == [2048, 512]
    # A later run (this process forgets what it read): the kept choice, even though the timings
    # would now say otherwise, and nothing timed.
    monkeypatch.setattr(kernel_cache, "_KEPT", {})
    fake_timings(monkeypatch, {"onednn": 1.0, "mm": 2.0})
    calls.clear()
    model = load_accelerated(wide_dir, dtype="float32")
    assert choice_of(model) == MM_BELOW_PROMPTS and calls == []
    assert "measured here before, kept in" in model.kernel_choice


def test_another_machine_threads_torch_or_emulation_measures_again(kernel_cache_file, monkeypatch):
    kernel_cache.store("kernels", {"shape": [8, 4]}, "kept")
    assert kernel_cache.lookup("kernels", {"shape": [8, 4]}) == "kept"
    assert kernel_cache.lookup("kernels", {"shape": [4, 8]}) is None  # another shape
    for change in (lambda m: m.setattr(torch, "get_num_threads", lambda: 64),
                   lambda m: m.setattr(torch, "__version__", "9.9.9"),
                   lambda m: m.setenv("ONEDNN_MAX_CPU_ISA", "SSE41"),
                   lambda m: m.setattr(kernel_cache, "cpu_name", lambda: "another CPU"),
                   lambda m: m.setattr(kernel_cache, "cpu_flags", lambda: ("avx2",))):
        with monkeypatch.context() as m:
            m.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
            m.setattr(kernel_cache, "_KEPT", {})
            change(m)
            assert kernel_cache.lookup("kernels", {"shape": [8, 4]}) is None


def test_an_unreadable_cache_is_moved_aside_and_measured_again(wide_dir, kernel_cache_file, monkeypatch, capsys):
    fake_timings(monkeypatch, {"onednn": 1.0})
    kernel_cache_file.parent.mkdir(parents=True)
    for garbage in ('{"entries": [{"key": "not json"', '{"entries": 3}', "\xff\xfe binary"):
        kernel_cache_file.write_text(garbage, encoding="latin-1")
        monkeypatch.setattr(kernel_cache, "_KEPT", {})
        model = load_accelerated(wide_dir, dtype="float32")
        err = capsys.readouterr().err
        notes = [line for line in err.splitlines() if "could not be read" in line]
        assert len(notes) == 1 and "Traceback" not in err, err
        assert notes[0].startswith(f"note: the kernel choice cache {kernel_cache_file} could not be read (")
        assert f"moved aside to {kernel_cache_file}.unreadable" in notes[0]
        assert Path(f"{kernel_cache_file}.unreadable").read_text(encoding="latin-1") == garbage  # kept, not lost
        assert paths_used(model) == {"onednn"}
        assert len(json.loads(kernel_cache_file.read_text())["entries"]) == 1  # measured again, kept


def test_writes_are_whole_or_not_at_all(kernel_cache_file, monkeypatch, capsys):
    kernel_cache.store("compiled", {"step": 1}, True)
    before = kernel_cache_file.read_text()

    def crash(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    kernel_cache.store("compiled", {"step": 5}, False)
    note = capsys.readouterr().err
    assert note.startswith(f"note: could not save the kernel choice to {kernel_cache_file} (OSError: No space "
                           "left on device); it holds for this process only") and note.count("\n") == 1
    assert kernel_cache_file.read_text() == before  # the old file, whole
    assert [p.name for p in kernel_cache_file.parent.iterdir()] == ["kernels.json"]  # no half-written file left
    assert kernel_cache.lookup("compiled", {"step": 5}) is False  # this process keeps it


def test_decide_once_keeps_any_kind_of_choice(kernel_cache_file, capsys):
    """The cache API the other "which is faster here" decisions use (e.g. a compiled decode step)."""
    measured = []
    value, now = kernel_cache.decide_once("compiled-decode", {"n_embd": 64}, lambda: measured.append(1) or
                                          {"faster": True}, "whether compiled decoding is faster")
    assert (value, now, measured) == ({"faster": True}, True, [1])
    assert capsys.readouterr().err.startswith("measuring whether compiled decoding is faster on this machine, once")
    assert kernel_cache.decide_once("compiled-decode", {"n_embd": 64}, lambda: 1 / 0, "never") == ({"faster": True}, False)
    assert capsys.readouterr().err == ""


def test_measuring_on_a_busy_machine_says_so(kernel_cache_file, monkeypatch, capsys):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 8.0, 7.0))
    kernel_cache.decide_once("kernels", {"shape": [1]}, lambda: 1, "which kernel")
    line, = capsys.readouterr().err.splitlines()
    assert line.endswith("; the machine is busy (load average 9.0 on 2 cores), so the timings may mislead: "
                         "remeasure when it is quieter")
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    kernel_cache.decide_once("kernels", {"shape": [2]}, lambda: 1, "which kernel")
    assert "the machine is busy" not in capsys.readouterr().err


def test_remeasure_forgets_this_machines_choices_and_measures_them_again(wide_dir, kernel_cache_file,
                                                                          monkeypatch, capsys):
    from gpt2.speed.kernel_report import main

    fake_timings(monkeypatch, {"onednn": 2.0, "mm": 1.0})
    kernel_cache.store("compiled-decode", {"n_embd": 64}, True)
    assert choice_of(load_accelerated(wide_dir, dtype="float32")) == MM_BELOW_PROMPTS
    fake_timings(monkeypatch, {"onednn": 1.0, "mm": 2.0})  # the machine changed (say, new memory)
    main(["--remeasure"])
    out = capsys.readouterr().out
    assert f"forgot 2 choice(s) kept for this machine in {kernel_cache_file}" in out
    assert "kernels format float32, shape [2048, 512], dtype float32: 1+ rows: onednn" in out
    assert "compiled-decode n_embd 64: measured again when next needed" in out
    assert kernel_cache.lookup("compiled-decode", {"n_embd": 64}) is None
    assert choice_of(load_accelerated(wide_dir, dtype="float32")) == [(math.inf, "onednn")]


def test_the_tests_never_touch_the_users_cache():
    assert Path(os.environ["GPT2_KERNEL_CACHE"]).parent.name.startswith("gpt2-kernel-cache-")
    assert not str(kernel_cache.cache_path()).startswith(str(Path.home() / ".cache"))
