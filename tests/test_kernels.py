"""gpt2/kernels.py: the capability probe (a path that raises or miscomputes is never used), the
GPT2_CPU=avx2 switch, kernels chosen per number of rows (every choice computes the plain path's
logits), and bfloat16 on a CPU without its fast path (runs, slower, with one note).

These run on every CPU; .ci/run runs them a second time as on an AVX2-only CPU (GPT2_CPU=avx2
with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2), so each host tests both kinds of paths."""

import ast
import math
from pathlib import Path

import pytest
import torch

import gpt2.device as device
import gpt2.kernels as kernels
from conftest import ROOT
from gpt2 import GPT2Config, load_gpt2
from gpt2.fast_linear import int8_per_channel

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
    monkeypatch.setattr(kernels, "_CHOSEN", {})
    monkeypatch.setattr(device, "_NOTES_SHOWN", set())


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
    model = load_gpt2(wide_dir, dtype="bfloat16")  # runs, without the broken path
    assert len(calls) == 1  # tried once, never again in this process
    used = {path for w in kernels.linear_weights(model) for _, path in w.fast_linear.paths()}
    assert used and "onednn-bf16" not in used
    model32 = load_gpt2(wide_dir, dtype="float32")
    assert all("onednn" not in {p for _, p in w.fast_linear.paths()}
               for w in kernels.linear_weights(model32) if hasattr(w, "fast_linear"))
    idx = torch.randint(0, WIDE.vocab_size, (1, 7), generator=torch.Generator().manual_seed(0))
    reference = logits(model32, idx)
    with torch.inference_mode():  # the plain path no longer takes the miscomputing oneDNN either
        x = torch.randn(1, 3, 512)
        w = torch.randn(2048, 512)
        torch.testing.assert_close(kernels.linear(x, w, None), x @ w.T, rtol=1e-4, atol=1e-4)
    spread = (reference.max() - reference.min()).item()
    assert (logits(model, idx) - reference).abs().max() < 0.05 * spread


def test_gpt2_cpu_avx2_acts_as_a_cpu_without_bf16(fresh_probe, monkeypatch):
    monkeypatch.setenv("GPT2_CPU", "avx2")
    assert kernels.emulated_cpu() == "avx2" and not kernels.cpu_has_bf16_instructions()
    assert "GPT2_CPU=avx2" in kernels.probe("onednn-bf16")
    assert kernels.format_paths()["bfloat16"] == []  # auto never picks it
    assert kernels.works("linear")
    monkeypatch.setenv("GPT2_CPU", "avx9000")
    with pytest.raises(ValueError, match="GPT2_CPU='avx9000' is not known: use GPT2_CPU=avx2"):
        kernels.emulated_cpu()


def test_bfloat16_without_its_fast_path_runs_with_one_note(wide_dir, fresh_probe, monkeypatch, capsys):
    monkeypatch.setitem(kernels._PROBED, "onednn-bf16", "RuntimeError: needs avx512bw")
    model = load_gpt2(wide_dir, dtype=torch.bfloat16)
    load_gpt2(wide_dir, dtype="bf16")  # the same note is not said twice
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: bfloat16 has no fast kernel on this CPU")
    assert "Faster here:" in notes[0] and "needs avx512bw" in notes[0]
    idx = torch.randint(0, WIDE.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    reference = logits(load_gpt2(wide_dir, dtype="float32"), idx)
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


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_kernel_choice_gives_the_plain_paths_logits(wide_dir, fmt, fresh_probe, monkeypatch):
    """Whatever the measurement picks, the logits are the plain path's (F.linear / oneDNN on the
    parameters, which hold the format's values) up to rounding: each working path alone, and one
    path per range of rows (a decode step and a verification on different kernels)."""
    model = load_gpt2(wide_dir, **FORMATS[fmt])
    weights = kernels.linear_weights(model)
    dtype = weights[0].dtype
    paths = kernels.candidates(fmt if fmt in ("fp16", "int8") else str(dtype).removeprefix("torch."), dtype)
    assert paths and all(kernels.works(p) for p in paths)
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    with monkeypatch.context() as m:
        m.setattr(kernels, "ENABLED", False)
        plain_9, plain_1 = logits(model, idx), logits(model, idx[:, :1])
    spread = (plain_9.max() - plain_9.min()).item()
    # 16-bit activations (bfloat16, float16, int8's bf16 inputs) round differently per kernel
    tol = 1e-4 if fmt in ("float32", "fp16") else 0.02
    # the int8 weights: quantizing the dequantized values gives back the same (q, scale)
    int8 = {w: int8_per_channel(w) for w in weights} if fmt == "int8" else None
    choices = [[(math.inf, p)] for p in paths] + [[(1, paths[-1]), (math.inf, paths[0])]]
    for choice in choices:
        kernels.attach_kernels(model, int8=int8, fp16=fmt == "fp16", choose=lambda *a, c=choice: c)
        assert all(w.fast_linear.paths() == choice for w in weights if w.numel() >= kernels.ONEDNN_MIN_WEIGHTS)
        for got, plain in ((logits(model, idx), plain_9), (logits(model, idx[:, :1]), plain_1)):
            assert (got - plain).abs().max() <= tol * spread, (fmt, choice)


def test_the_report_lists_every_path():
    from gpt2.kernel_report import report
    text = report()
    assert text.startswith("CPU: ") and "ATen CPU capability" in text
    for path in kernels.PATHS:
        assert path in text


def test_no_import_cycle_between_the_model_and_its_kernels():
    """gpt2/model.py imports gpt2/kernels.py, which imports gpt2/fast_linear.py; neither imports back."""
    for name in ("kernels.py", "fast_linear.py"):
        tree = ast.parse(Path(ROOT / "gpt2" / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {f"{'.' * n.level}{n.module or ''}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any("model" in i or "loading" in i for i in imported), (name, imported)
