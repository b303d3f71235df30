"""What an accelerated model holds (gpt2/speed/stored_weights.py, gpt2/speed/accelerator.py): in
each weight format, the tensors of a model loaded by gpt2.speed.load_accelerated (parameters,
buffers, its layers' stored weights, and the kernels' own packed tensors, each storage counted
once) add up to what the format stores, computed here from the config alone; no float32 shadow of
int8 or float16 weights, no plain weight beside its packed copy. And the model still computes what
the plain model (load_gpt2) holding the format's values computes.

The accounting below walks the model itself (not gpt2.speed.kernels.held_bytes, which the
benchmark uses), so the code it checks cannot make it pass.
"""

import math

import pytest
import torch
import torch.nn as nn

import gpt2.speed.kernels as kernels
from conftest import plain_with_format_values
from gpt2 import GPT2, GPT2Config, load_gpt2
from gpt2.speed import kernel_cache, load_accelerated

# Every linear weight at least ONEDNN_MIN_WEIGHTS (512 x 512), so every one gets the format's kernel.
WIDE = GPT2Config(n_layer=1, n_head=8, n_embd=512, n_positions=32, vocab_size=1024)
FORMATS = {"int8": dict(quantize="int8"), "fp16": dict(quantize="fp16"), "bfloat16": dict(dtype="bfloat16"),
           "float32": dict(dtype="float32"), "w8a8": dict(quantize="w8a8")}
# Largest |logit - the same format's logits with plain weights| relative to their spread: the
# kernels' own rounding (float32 sums in another order; bfloat16's outputs).
# w8a8 rounds each layer's inputs too (tests/test_w8a8.py holds it to its own computation bit for
# bit): here only near its weights' values.
TOLERANCE = {"int8": 1e-5, "fp16": 1e-5, "bfloat16": 0.02, "float32": 1e-5, "w8a8": 0.02}


@pytest.fixture(autouse=True)
def own_weight_cache(tmp_path, monkeypatch):
    """Each test its own empty weight cache: every load here is a first load unless a test loads twice."""
    monkeypatch.setenv("GPT2_WEIGHT_CACHE", str(tmp_path / "weights"))


@pytest.fixture(scope="module")
def wide_dir(make_checkpoint):
    return make_checkpoint(WIDE, seed=9, std=0.05, embedding_std=0.3)


def held_bytes(model) -> int:
    """Bytes of every tensor the model holds: parameters and buffers, the stored weights of its
    FastLinear and FastEmbedding layers (the layouts each holds), and the tensors of its kernels,
    each storage once; an opaque oneDNN tensor as its elements, fbgemm's packed float16 as 2 bytes
    a weight."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if hasattr(t, "layouts"):
            for layout in t.layouts.values():
                add(layout)
            return
        if isinstance(t, torch.Tensor):
            key, size = ((id(t), t.numel() * t.element_size()) if t.is_mkldnn
                         else (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        elif isinstance(t, torch.ScriptObject):
            key, size = id(t), torch.ops.quantized.linear_unpack_fp16(t)[0].numel() * 2
        else:
            return
        if key not in seen:
            seen.add(key)
            total += size

    for t in [*model.parameters(), *model.buffers()]:
        add(t)
    for module in model.modules():
        if getattr(module, "stored", None) is not None:
            add(module.stored)
    for layer in kernels.attached(model):
        for _, _, kernel in layer.kernel.by_rows:
            kernel = getattr(kernel, "kernel", kernel) if type(kernel).__name__ == "PackedOnFirstCall" else kernel
            for value in vars(kernel).values() if kernel is not None else ():
                add(value)
    return total


def expected_bytes(config: GPT2Config, fmt: str, path: str) -> int:
    """What a model of this config stores in a format whose linear weights run on `path`: each
    linear weight [out, in] once in the bytes that kernel reads (our C kernel's panels pad `out`
    to 16 rows, w8a8's `in` to a multiple of 4; int8 and w8a8 add a float32 scale per row), every other parameter in the model's dtype.
    The tied wte beside a library's opaque packing of it keeps its values too: the embedding
    reads its rows. Each FastLinear adds its handle, one int64 buffer that names it to the compiled
    decode path (gpt2/speed/fast_model.py)."""
    n, v = config.n_embd, config.vocab_size
    linear = [(v, n)] + [(3 * n, n), (n, n), (4 * n, n), (n, 4 * n)] * config.n_layer
    other = config.n_positions * n + 2 * n + config.n_layer * (4 * n + 3 * n + n + 4 * n + n)
    model_bytes = 2 if fmt == "bfloat16" else 4
    per_weight = {"native-int8": 1, "native-w8a8": 1, "native-fp16": 2, "native-f32": 4, "fbgemm-fp16": 2, "onednn-bf16": 2,
                  "onednn": 4}.get(path, model_bytes if kernels.LAYOUTS[path] == "plain" else None)
    total = other * model_bytes
    for out, inputs in linear:
        rows = 16 * math.ceil(out / 16) if path.startswith("native") else out
        inputs = 4 * math.ceil(inputs / 4) if path == "native-w8a8" else inputs  # its quads
        total += rows * inputs * per_weight + (4 * out if fmt in ("int8", "w8a8") else 0)
    if kernels.LAYOUTS[path] == "packed":
        total += v * n * 2  # the embedding's 16-bit rows
    return total + 8 * len(linear)


def logits(model, idx):
    with torch.inference_mode():
        return model(idx).float()


def the_path(model) -> str:
    paths = {p for layer in kernels.attached(model) for _, p in layer.kernel.paths()}
    assert len(paths) == 1, paths
    return paths.pop()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_model_holds_its_format_once(wide_dir, fmt):
    """Loaded by load_accelerated, after a prompt and a step (every kernel packed), the model holds
    exactly what its format stores, and computes what the same format computes on plain weights
    (gpt2/model.py as written, whose parameters hold the format's values).
    Fails on a model that keeps float32 parameters beside the int8 bytes or float16 values, or a
    plain weight beside its packed copy: with float32 parameters beside the kernels' copies, this
    model held 4.9x its int8 bytes, 2.6x its fp16 bytes and 1.75x its bfloat16 bytes (float32 on
    the plain weight: 1.0x, as now)."""
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    model = load_accelerated(wide_dir, **FORMATS[fmt])
    assert len(kernels.attached(model)) == 4 * WIDE.n_layer + 1
    fast = logits(model, idx)
    logits(model, idx[:, :1])  # a step: every kernel packed by now
    path = the_path(model)
    assert held_bytes(model) == expected_bytes(WIDE, fmt, path), (fmt, path, held_bytes(model) / expected_bytes(WIDE, fmt, path))
    plain = logits(plain_with_format_values(wide_dir, fmt), idx)
    spread = (plain.max() - plain.min()).item()
    assert (fast - plain).abs().max().item() <= TOLERANCE[fmt] * spread


def test_float32_on_its_packed_kernel_holds_the_panels_only(wide_dir, kernel_cache_file):
    """float32 whose kept kernel choice is our C kernel's panels (native-f32): the panels replace
    the plain weights (no second float32 copy), and the logits equal the plain model's within 1e-5
    of their spread (float32 sums in another order). Fails where the packed copy sits beside the
    parameter (2x the bytes)."""
    if not kernels.works("native-f32"):
        pytest.skip(f"native-f32 does not work here: {kernels.probe('native-f32')}")
    shape, paths = (4 * WIDE.n_embd, WIDE.n_embd), kernels.candidates("float32", torch.float32)
    kernel_cache.store("kernels", kernels.rows_what("float32", shape, torch.float32, paths),
                       {"choice": [[None, "native-f32"]], "ms": {}})
    idx = torch.randint(0, WIDE.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    model = load_accelerated(wide_dir, dtype="float32")
    fast = logits(model, idx)
    assert the_path(model) == "native-f32"
    assert held_bytes(model) == expected_bytes(WIDE, "float32", "native-f32")
    plain = logits(load_gpt2(wide_dir), idx)
    assert (fast - plain).abs().max().item() <= 1e-5 * (plain.max() - plain.min()).item()


@pytest.mark.parametrize("fmt", ["int8", "fp16", "w8a8"])
def test_what_a_learner_inspects_is_the_plain_weight(wide_dir, fmt):
    """model.h[0].mlp.c_fc.weight answers in PyTorch terms: its shape and dtype are the plain
    model's, and its values (decoded on demand from what the layer stores), the embedding's rows
    and a matmul with it are the plain model's (holding the format's values) bit for bit; what
    the layer stores holds no float32 copy of the weight."""
    model = load_accelerated(wide_dir, **FORMATS[fmt])
    plain = plain_with_format_values(wide_dir, fmt)
    layer, reference = model.h[0].mlp.c_fc, plain.h[0].mlp.c_fc.weight
    weight = layer.weight
    assert weight.shape == reference.shape and weight.dtype == reference.dtype == torch.float32
    assert torch.equal(layer.stored.decode(), reference) and torch.equal(weight, reference)
    assert torch.equal(weight.float() * 1, reference)
    x = torch.randn(3, WIDE.n_embd)
    torch.testing.assert_close(x @ weight.T, x @ reference.T, rtol=1e-5, atol=1e-5)  # (BLAS: rounding only)
    idx = torch.tensor([[0, 17, WIDE.vocab_size - 1]])
    assert torch.equal(model.wte(idx), plain.wte(idx))
    held = [t for t in layer.stored.layouts.values() if isinstance(t, torch.Tensor) and t.numel() >= weight.numel()]
    assert held and all(t.element_size() < 4 for t in held)  # no float32 copy of the weight


# ---------------------------------------------------------------------------------------------
# Load once, map afterwards: the weight cache (gpt2/speed/weight_cache.py)


def load_quietly(folder, capsys, monkeypatch, **kwargs):
    """(model, what the load said: its notes on stderr and its kernel line, which is logged and
    kept on the model), every note said anew."""
    from gpt2.speed import device

    monkeypatch.setattr(device, "_NOTES_SHOWN", set())
    capsys.readouterr()
    model = load_accelerated(folder, **kwargs)
    return model, capsys.readouterr().err + getattr(model, "kernel_choice", "")


def mapped_from(tensor: torch.Tensor, path) -> bool:
    """Whether tensor's bytes lie in a memory map of the file at path (/proc/self/maps)."""
    address = tensor.data_ptr()
    for line in open("/proc/self/maps"):
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high and len(fields) >= 6 and fields[5] == str(path):
            return True
    return False


def computed(monkeypatch) -> list:
    """Record every weight loading computes in its format (quantized, cast) or packs (they still
    run): the list of what was done."""
    import gpt2.speed.accelerator as accelerator

    calls, compute, pack = [], accelerator.format_layouts, kernels.packed_layouts
    monkeypatch.setattr(accelerator, "format_layouts", lambda *a: calls.append("compute") or compute(*a))
    monkeypatch.setattr(kernels, "packed_layouts", lambda *a: calls.append("pack") or pack(*a))
    return calls


@pytest.mark.parametrize("fmt", ["int8", "fp16", "w8a8"])
def test_a_second_load_maps_what_the_first_computed(wide_dir, tmp_path, fmt, monkeypatch, capsys):
    """The first load in a format computes the format (quantizes, packs) and keeps it in the
    weight cache; the second computes nothing, its weights are memory maps of that file, its load
    line says so, and its logits are the first load's bit for bit. Fails where every load
    quantizes and packs again (no weight cache)."""
    calls = computed(monkeypatch)
    first, said = load_quietly(wide_dir, capsys, monkeypatch, **FORMATS[fmt])
    assert "computed now and kept in" in said and calls
    files = list((tmp_path / "weights").glob("*.safetensors"))
    assert len(files) == 1
    calls.clear()
    second, said = load_quietly(wide_dir, capsys, monkeypatch, **FORMATS[fmt])
    assert "mapped from the weight cache" in said and calls == []
    layouts = second.h[0].mlp.c_fc.stored.layouts
    assert all(mapped_from(t, files[0].resolve()) for t in layouts.values() if isinstance(t, torch.Tensor))
    idx = torch.randint(0, WIDE.vocab_size, (1, 7), generator=torch.Generator().manual_seed(8))
    assert torch.equal(logits(first, idx), logits(second, idx))


def test_a_changed_checkpoint_is_not_served_the_old_file(wide_dir, tmp_path, monkeypatch, capsys):
    """A checkpoint rewritten with other values (same names, shapes and size) is computed anew, and
    the model is the new checkpoint's. Fails where the cache is keyed by the path or the shapes."""
    from safetensors.torch import load_file, save_file
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(wide_dir, folder)
    old, _ = load_quietly(folder, capsys, monkeypatch, quantize="int8")
    tensors = load_file(folder / "model.safetensors")
    tensors["h.0.mlp.c_fc.weight"] = -tensors["h.0.mlp.c_fc.weight"]
    save_file(tensors, folder / "model.safetensors")
    new, said = load_quietly(folder, capsys, monkeypatch, quantize="int8")
    assert "mapped from the weight cache" not in said and "computed now" in said
    idx = torch.randint(0, WIDE.vocab_size, (1, 7), generator=torch.Generator().manual_seed(9))
    plain_new = logits(plain_with_format_values(folder, "int8"), idx)
    spread = (plain_new.max() - plain_new.min()).item()
    assert (logits(new, idx) - plain_new).abs().max().item() <= 1e-5 * spread
    assert (logits(old, idx) - plain_new).abs().max().item() > 1e-3 * spread


def test_a_changed_kernel_or_code_is_not_served_the_old_file(wide_dir, kernel_cache_file, monkeypatch, capsys):
    """Another kept kernel choice (fbgemm's packing, then our C kernel's panels) or another version
    of the format's code is a new file: the load computes its format again and runs the kernel now
    chosen. Fails where the cache is keyed by the checkpoint and format alone."""
    from gpt2.speed import weight_cache

    shape, paths = (4 * WIDE.n_embd, WIDE.n_embd), kernels.candidates("fp16", torch.float32)
    if not {"fbgemm-fp16", "native-fp16"} <= set(paths):
        pytest.skip(f"needs both fp16 kernels here, has {paths}")
    what = kernels.rows_what("fp16", shape, torch.float32, paths)
    kernel_cache.store("kernels", what, {"choice": [[None, "fbgemm-fp16"]], "ms": {}})
    load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    _, said = load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    assert "mapped from the weight cache" in said
    kernel_cache.store("kernels", what, {"choice": [[None, "native-fp16"]], "ms": {}})
    model, said = load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    assert "computed now" in said and the_path(model) == "native-fp16"
    assert "panels" in model.h[0].mlp.c_fc.stored.layouts
    _, said = load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    assert "mapped from the weight cache" in said
    monkeypatch.setattr(weight_cache, "STORAGE_VERSION", weight_cache.STORAGE_VERSION + 1)
    _, said = load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    assert "computed now" in said


def test_the_cache_is_bounded_shown_and_cleared(wide_dir, tmp_path, monkeypatch, capsys):
    """Past GPT2_WEIGHT_CACHE_GB the file used longest ago is deleted; kernel_report --cache lists
    what is kept and --clear-cache deletes it. A file cut short is deleted with a note, and
    computed again. Fails where the cache grows without bound."""
    from gpt2.speed import kernel_report

    one_file = None
    for fmt in ("int8", "fp16"):
        load_quietly(wide_dir, capsys, monkeypatch, **FORMATS[fmt])
        files = list((tmp_path / "weights").glob("*.safetensors"))
        one_file = one_file or files[0].stat().st_size
        monkeypatch.setenv("GPT2_WEIGHT_CACHE_GB", str(1.5 * one_file / 1e9))  # room for the int8 file only
    assert len(files) == 1 and files[0].stat().st_size != one_file  # the fp16 file replaced the int8 one
    kernel_report.main(["--cache"])
    out = capsys.readouterr().out
    assert "1 file(s)" in out and files[0].name in out and "fp16" in out
    with open(files[0], "r+b") as f:
        f.truncate(files[0].stat().st_size // 2)
    _, said = load_quietly(wide_dir, capsys, monkeypatch, quantize="fp16")
    assert "could not be read" in said and "computed now" in said
    kernel_report.main(["--clear-cache"])
    assert "deleted 1 file(s)" in capsys.readouterr().out
    assert list((tmp_path / "weights").glob("*.safetensors")) == []


@pytest.mark.parametrize("fmt", ["int8", "fp16", "w8a8"])
def test_the_plain_model_is_unchanged(wide_dir, tmp_path, fmt):
    """load_gpt2 keeps plain PyTorch (ordinary float32 parameters, nothing attached) and keeps
    nothing in the weight cache; an accelerated model's to_plain() is plain PyTorch too: ordinary
    float32 parameters holding the format's values, nothing attached. Fails if the stored weights
    leak into the model a learner steps through."""
    model = load_gpt2(wide_dir)
    assert type(model) is GPT2 and not kernels.attached(model)
    assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in model.parameters())
    assert not (tmp_path / "weights").exists()
    back = load_accelerated(wide_dir, **FORMATS[fmt]).to_plain()
    assert type(back) is GPT2 and not kernels.attached(back)
    assert all(type(m) is nn.Linear for m in back.modules() if isinstance(m, nn.Linear))
    assert all(type(p) is nn.Parameter and p.dtype == torch.float32 for p in back.parameters())
    expected = plain_with_format_values(wide_dir, fmt).state_dict()
    got = back.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[name], expected[name]) for name in expected)
