"""Which kernel runs each of GPT-2's linear layers on this CPU. gpt2/model.py is plain PyTorch
(nn.Linear, F.linear); gpt2.speed.accelerate replaces each linear layer and the head by a FastLinear
(gpt2/speed/fast_model.py, `attach_kernels` here), which runs the same function of the same
weights on the kernel chosen for this machine. `python -m
gpt2.speed.kernel_report` prints what was chosen and why.

Three questions, each answered on the machine in use, never from a number written into the code:

  1. Which fast paths work here? (`probe`) Each one (pre-packed oneDNN bfloat16, fbgemm's float16
     weights, int8 packing, ...) is tried once per process, on a tiny tensor, the first time it is
     needed, and its result checked against float64. A path that raises, or computes something
     else, is never used; the reason is kept for the report. oneDNN's bfloat16 path, for example,
     needs AVX-512 (or AVX-NE-CONVERT): most laptops' CPUs lack it, and then it raises.
  2. Which working kernel is fastest for a decode step (1 row) and for a verification (2 to 16
     rows)? (`attach_kernels`, `choose_by_rows`) Each candidate runs on the model's own weights,
     a few layers' worth so they come from memory as in a real step, at ROW_COUNTS rows; each row
     count gets its winner. Which one wins depends on the CPU (docs/linear_kernels.md).
  3. Which weight format is fastest here for this model, among those that stay close to
     float32? (`fastest_format`, behind dtype="auto") The same measurement on weights of the
     model's shapes, once per format that works; the winner must also keep its next-token
     distributions within FIDELITY_MAX_KL of float32's on the model's own weights (`fidelity`).
     Every format auto can pick returns float32 logits (AUTO_FORMATS), w8a8 (int8 weights and
     inputs rounded to int8 in blocks) included.

A kernel that packs its weight (oneDNN's blocked bfloat16, fbgemm's float16) packs it on the
path's first call (`PackedOnFirstCall`), not at load, every layer of the model at once, side by
side on PyTorch's threads (`pack_all`): loading then costs what the plain face's does, and the
first step pays the packing, once.

Questions 2 and 3 are measured once per machine (CPU, flags, torch version, threads) and shape,
the first time such a model is loaded, and kept in the user's cache folder (gpt2/speed/kernel_cache.py):
every later run reads the choice, so a machine runs the same kernels, and rounds alike, every
time. `python -m gpt2.speed.kernel_report --remeasure` measures again.

Switches (environment variables):
  GPT2_FAST_LINEAR=0     every FastLinear runs F.linear on its values (a decoded copy where its
                         weight is held in another layout): the plain computation, for comparison.
  GPT2_MEASURE_KERNELS=0 time nothing: each format's default kernel (its first candidate), and
                         float32 for dtype="auto" (the tests set it: no result depends on timing).
  GPT2_CPU=avx2          act as a CPU without AVX-512, AVX-VNNI and bfloat16 instructions (an AMD
                         Zen 2/3, an Intel consumer CPU before Alder Lake), so that one machine can
                         test both kinds of paths; GPT2_CPU=avx2-vnni the same with AVX-VNNI (Intel
                         consumer CPUs since Alder Lake), where the CPU has it. Use it with PyTorch's
                         and oneDNN's own switches, set before torch is imported:

    GPT2_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m gpt2.speed.kernel_report
"""

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import fast_linear, kernel_cache, native
from .fast_model import FastEmbedding, FastGPT2, FastLinear
from .stored_weights import StoredWeight, give_back_freed_memory
from .kernel_cache import cpu_flags, cpu_name  # noqa: F401 (the report names the CPU through here)

EMULATIONS = {"avx2": "a CPU without AVX-512 or bfloat16 instructions (GPT2_CPU=avx2)",
              "avx2-vnni": "a CPU with AVX2 and AVX-VNNI, without AVX-512 or bfloat16 instructions (GPT2_CPU=avx2-vnni)"}
# oneDNN sets up each call; below this many weights plain F.linear is quicker, and a layer this
# small is per-call overhead, not reading weights, so no format or kernel choice pays. Every
# linear layer of the real GPT-2 sizes is above it; only toy test models are below.
ONEDNN_MIN_WEIGHTS = 1 << 18
# Rows timed: a decode step, and verifications of 1, 4 and 8 draft tokens. A call with
# other rows uses the winner of the nearest of these (ROW_LIMITS); above the last, a prompt: the
# format's default kernel.
ROW_COUNTS = (1, 2, 5, 9)
ROW_LIMITS = (1, 3, 7, 16)
# Bytes of weights each timing pass reads: more than most CPUs' caches hold, so they come from
# memory, as in a decode step of a real model (a few server CPUs have caches larger still).
TIMING_BYTES = 256 * 2**20
# A format must beat each more exact one (AUTO_FORMATS is in that order: float32, float16 weights,
# bfloat16, int8) by this fraction to be picked by "auto": closer than that, the difference is
# within timing noise and the more exact format keeps its numerics.
AUTO_MARGIN = 0.1
# Likewise, another kernel replaces a format's default (its first candidate) for some row count
# only if it is faster by this fraction: a near-tie is noise, and one kernel for all rows rounds
# alike.
KERNEL_MARGIN = 0.05

# Paths: name -> what it is. The kernel each builds from a weight is in KERNELS.
PATHS = {
    "linear": "F.linear (PyTorch's default; MKL on x86)",
    "mm": "torch.mm(W, x.T) (the weight as the left operand)",
    "onednn": "oneDNN inner product, float32",
    "onednn-packed": "oneDNN, float32 weights pre-packed once for a verification's few rows (a second copy)",
    "onednn-bf16": "oneDNN, bfloat16 weights pre-packed once",
    "fbgemm-fp16": "fbgemm, float16 weights, float32 math",
    "native-fp16": "our C kernel (gpt2/speed/csrc/rows_linear.c), float16 weights, float32 math, reads each weight once for all rows",
    "native-f32": "our C kernel (gpt2/speed/csrc/rows_linear.c), float32 weights, reads each weight once for all rows",
    "int8pack": "torch._weight_int8pack_mm, int8 weights, bfloat16 activations",
    "int8-bf16": "int8 weights as bfloat16 integers, oneDNN pre-packed, scale fused: int8pack's numbers",
    "native-int8": "our C kernel (gpt2/speed/csrc/rows_linear.c), int8 weights: int8pack's numbers, reads each weight once for all rows",
    "native-w8a8": "our C kernel (gpt2/speed/csrc/rows_linear.c), int8 weights and inputs rounded to int8 in blocks, integer dot products (AVX512-VNNI or AVX2)",
}
# Paths whose kernel copies the weight into another layout or format (oneDNN's blocked bfloat16,
# fbgemm's packed float16, a contiguous int8 copy, ...): made on the path's first call, for every
# layer at once (PackedOnFirstCall).
PACKED_PATHS = ("onednn-bf16", "fbgemm-fp16", "int8pack", "onednn-packed", "int8-bf16", "native-fp16", "native-f32",
                "native-int8", "native-w8a8")
KERNELS = {
    "linear": fast_linear.PlainLinear,
    "mm": fast_linear.TransposedMM,
    "onednn": fast_linear.OneDNNLinear,
    "onednn-packed": fast_linear.OneDNNPackedForRows,
    "onednn-bf16": fast_linear.OneDNNPackedWeight,
    "fbgemm-fp16": fast_linear.FP16Weight,
    "native-fp16": lambda weight: fast_linear.NativeRowsLinear(weight, torch.float16),
    "native-f32": lambda weight: fast_linear.NativeRowsLinear(weight, torch.float32),
}
# Weight formats -> the paths that can run them, in order of preference when nothing is measured
# (the first working one is also the default for prompts). A format's kernels all compute the
# same function of the parameters' values: "fp16" weights are float32 parameters holding
# float16-rounded values, "int8" ones hold the dequantized values.
# int8 is ONE computation, float32 throughout: y = (x @ q.T) * scale + bias, each output's sum of
# q * x in float32 in one fixed order, times its float32 scale (our C kernel, NativeInt8Linear, in
# its AVX2 and AVX-512 builds, the same bits, and a row the same bits alone as among others). The
# library's int8 products are not among its kernels: _weight_int8pack_mm ("int8pack") and the
# oneDNN bfloat16 matmul ("int8-bf16") take bfloat16 activations and return bfloat16 outputs (an
# int8 head's logits on a bfloat16 grid, where two top tokens often tie exactly), and
# _weight_int8pack_mm's float32 path adds in another order (other bits, and several times slower
# for a few rows). Without the C kernel the int8 format has no fast path: auto does not pick it,
# and --quantize int8 runs F.linear on the dequantized values.
CANDIDATES = {
    "float32": ("onednn", "mm", "linear", "onednn-packed", "native-f32"),
    "bfloat16": ("onednn-bf16", "mm", "linear"),
    "float16": ("mm", "linear"),
    # (only paths that read 16-bit weights: a float32 path would need a float32 copy beside them)
    "fp16": ("fbgemm-fp16", "native-fp16"),
    "int8": ("native-int8",),
    # int8's weights with inputs rounded to int8 too: another computation, so another format
    "w8a8": ("native-w8a8",),
}
# The layout each path's kernel reads (gpt2/speed/stored_weights.py): the weight itself ("plain"),
# the int8 bytes ("q"), or a copy it packs: our C kernel's "panels" (plain tensors, storable in a
# file) or a library's opaque "packed" weight (oneDNN's blocked layout, fbgemm's packed float16).
LAYOUTS = {"linear": "plain", "mm": "plain", "onednn": "plain", "onednn-packed": "packed",
           "onednn-bf16": "packed", "fbgemm-fp16": "packed", "native-fp16": "panels",
           "native-f32": "panels", "int8pack": "q", "int8-bf16": "packed", "native-int8": "panels",
           "native-w8a8": "panels"}
# Our C kernel's paths -> the dtype of the panels each reads (w8a8's: quad panels of q + 128).
PANEL_DTYPES = {"native-fp16": torch.float16, "native-f32": torch.float32, "native-int8": torch.int8,
                "native-w8a8": torch.uint8}
# The paths whose packed layout can be written to the weight cache and mapped back.
STORABLE_PATHS = tuple(p for p, layout in LAYOUTS.items() if layout == "panels")
# The kernels built from int8 weights' (q, scale): the int8 format's, and the library's int8
# products (for the benchmarks and the report).
INT8_KERNELS = {"native-int8": fast_linear.NativeInt8Linear, "native-w8a8": fast_linear.NativeW8A8Linear,
                "int8pack": fast_linear.Int8Weight,
                "int8-bf16": fast_linear.Int8AsBF16}
INT8_PATHS = tuple(INT8_KERNELS)
# Formats dtype="auto" chooses among on a CPU: name -> (model dtype, quantize). Each one's logits
# are float32 sums, never rounded to 16 bits: "int8" is weight-only int8 in a float32 model (the
# head too, on float32 sums). A bfloat16 model is not among them: its head, like every layer,
# returns bfloat16 logits (8 significant bits: near the top, two tokens' logits tie exactly often
# enough to part greedy speculative decoding from plain greedy decoding); --dtype bfloat16 still
# loads one.
AUTO_FORMATS = {"float32": (torch.float32, None), "fp16": (torch.float32, "fp16"),
                "int8": (torch.float32, "int8"), "w8a8": (torch.float32, "w8a8")}


def emulated_cpu() -> str | None:
    """The CPU kind GPT2_CPU asks to act as (None: this machine as it is)."""
    name = os.environ.get("GPT2_CPU", "").strip().lower()
    if name in ("", "native"):
        return None
    if name not in EMULATIONS:
        raise ValueError(f"GPT2_CPU={name!r} is not known: use GPT2_CPU=avx2 (act as a CPU without "
                         f"AVX-512/bfloat16), GPT2_CPU=avx2-vnni (the same with AVX-VNNI) or leave it unset")
    return name


def cpu_has_bf16_instructions() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX); False under
    GPT2_CPU=avx2 (or avx2-vnni). Without them bfloat16 is emulated, slower than float32."""
    if emulated_cpu() is not None:
        return False
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # an older or non-x86 build of PyTorch
        return False


# ---------------------------------------------------------------------------------------------
# 1. The probe

_PROBED: dict[str, str | None] = {}  # path -> None (works) or why not


def probe(path: str) -> str | None:
    """None if `path` works on this machine, else why not. Tried once per process, on a tiny
    weight, and checked against float64."""
    if path not in _PROBED:
        _PROBED[path] = _try(path)
    return _PROBED[path]


def works(path: str) -> bool:
    return probe(path) is None


def _try(path: str) -> str | None:
    if path not in PATHS:
        raise ValueError(f"unknown kernel path {path!r}: one of {', '.join(PATHS)}")
    if (path.startswith("onednn") or path == "int8-bf16") and not torch.backends.mkldnn.is_available():
        return "this PyTorch build has no oneDNN (mkldnn)"
    if path in ("onednn-bf16", "int8-bf16") and emulated_cpu() is not None:
        return f"acting as {EMULATIONS[emulated_cpu()]}"
    if path == "fbgemm-fp16" and "fbgemm" not in torch.backends.quantized.supported_engines:
        return "this PyTorch build has no fbgemm (x86 only)"
    if path.startswith("native") and (reason := native.why_not()):
        return reason
    g = torch.Generator().manual_seed(0)
    weight, bias, x = torch.randn(24, 64, generator=g), torch.randn(24, generator=g), torch.randn(3, 64, generator=g)
    dtype = torch.bfloat16 if path == "onednn-bf16" else torch.float32
    try:
        kernel = build_kernel(path, weight.to(dtype))
        y = kernel(x.to(dtype), bias.to(dtype)).double()
    except Exception as e:  # whatever the kernel's library raises on this CPU
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
    reference = x.double() @ weight.double().T + bias.double()
    error = (y - reference).abs().max().item() / reference.abs().max().item()
    if not error < 0.05:  # bf16 / int8 rounding is far below this; a wrong kernel far above
        return f"ran, but computed something else (relative error {error:.2g})"
    return None


def build_kernel(path: str, weight: torch.Tensor, int8=None):
    """The kernel of `path` for one weight [out, in]. int8: (q, scale) for INT8_PATHS (default:
    quantized from the weight)."""
    if path in INT8_PATHS:
        if int8 is None:
            int8 = weight.int8() if isinstance(weight, StoredWeight) else fast_linear.int8_per_channel(weight)
        return INT8_KERNELS[path](*int8)
    return KERNELS[path](weight.decode() if isinstance(weight, StoredWeight) else weight)


def kernel_from_layouts(path: str, weight) -> object | None:
    """The kernel of `path` built from a layout the stored weight already holds (our C kernel's
    panels, mapped from the weight cache): no packing. None if it holds no such layout."""
    panels = weight.layouts.get("panels") if isinstance(weight, StoredWeight) else None
    dtype = PANEL_DTYPES.get(path)
    if panels is None or panels.dtype != dtype:
        return None
    scale = weight.layouts.get("scale") if path in ("native-int8", "native-w8a8") else None
    cls = {"native-int8": fast_linear.NativeInt8Linear,
           "native-w8a8": fast_linear.NativeW8A8Linear}.get(path, fast_linear.NativeRowsLinear)
    return cls.from_panels(panels, weight.shape[0], scale)


def stored_form(path: str, kernel, weight: StoredWeight) -> tuple[dict, object]:
    """(layouts, decoder) a kernel of `path` holds for its weight: what replaces the layout it was
    packed from. decoder: () -> the plain weight, for a library's opaque layout (else None)."""
    layout = LAYOUTS[path]
    if layout == "panels":
        return {"panels": kernel.panels}, None
    if layout == "q":
        return {"q": kernel.q}, None
    packed = kernel.packed
    if path == "fbgemm-fp16":
        return {"packed": packed}, lambda: torch.ops.quantized.linear_unpack_fp16(packed)[0]
    if path == "int8-bf16":
        scale = weight.layouts["scale"]
        return {"packed": packed}, lambda: fast_linear.dequantize_int8(packed.to_dense().to(torch.int8), scale,
                                                                       weight.dtype)
    return {"packed": packed}, lambda: packed.to_dense()


# ---------------------------------------------------------------------------------------------
# 2. A FastLinear on each linear layer and the head


class PackedOnFirstCall:
    """A kernel that copies its weight into another layout (PACKED_PATHS), made on its first call
    instead of at load: packing every layer can cost more than reading the file (fbgemm's float16
    packing does), and a load that packed would be slower than the plain face's. The first step
    that runs this path pays it instead, once; a path no call takes (a row count this run never
    uses) is never packed. build: () -> the kernel. group: the model's kernels on the same path
    (a list this one is in), all packed together on the first call to any of them (pack_all)."""

    def __init__(self, build, group: list | None = None):
        self.build, self.kernel = build, None
        if group is not None:
            group.append(self)
        self.group = group

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.kernel is None:
            pack_all(self.group or [self])
        return self.kernel(x, bias)

    def pack(self) -> None:
        self.kernel, self.build = self.build(), None  # (dropping build frees what it held)

    @property
    def packed(self) -> bool:
        return self.kernel is not None


def pack_all(waiting: list[PackedOnFirstCall]) -> int:
    """Pack the kernels not packed yet, side by side on PyTorch's number of threads: a packing
    (fbgemm's float16 above all) is a serial loop, so one layer after another would leave every
    core but one idle. Returns how many it packed."""
    waiting = [kernel for kernel in dict.fromkeys(waiting) if not kernel.packed]
    workers = min(torch.get_num_threads(), len(waiting))
    if workers <= 1:
        for kernel in waiting:
            kernel.pack()
        return len(waiting)
    inference = torch.is_inference_mode_enabled()  # thread-local: the workers take the caller's

    def pack(kernel):
        with torch.inference_mode(inference):
            kernel.pack()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(pack, waiting))  # (list: a packing's error is raised here)
    return len(waiting)


class RowsAwareKernel:
    """One weight's kernels, one per range of row counts: by_rows is [(max_rows, path, kernel)],
    ascending, the last one for any number of rows."""

    def __init__(self, by_rows: list[tuple[float, str, object]]):
        self.by_rows = by_rows

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        for max_rows, _, kernel in self.by_rows:
            if rows <= max_rows:
                return kernel(x, bias)
        raise AssertionError("the last range covers every row count")

    def paths(self) -> list[tuple[float, str]]:
        return [(max_rows, path) for max_rows, path, _ in self.by_rows]

    def describe(self) -> str:
        return describe_choice(self.paths())

    def __repr__(self):
        return f"RowsAwareKernel({self.describe()})"


def linear_layers(model, held: dict | None = None
                  ) -> list[tuple[nn.Module, str, torch.Tensor | StoredWeight, torch.Tensor | None]]:
    """(parent, name, weight, bias) of every linear layer of a model: each nn.Linear (the child
    `name` of `parent`), and a FastGPT2's tied output head ("lm_head", on the token embedding's
    weight). held: {"h.0.mlp.c_fc.weight": StoredWeight, ...}, weights held for layers whose own
    parameter is a placeholder (a model built on the meta device)."""
    held = held or {}
    layers = [(parent, name, held.get(f"{prefix}.{name}.weight".lstrip("."), child.weight), child.bias)
              for prefix, parent in model.named_modules()
              for name, child in parent.named_children() if type(child) is nn.Linear]
    if isinstance(model, FastGPT2) and model.lm_head is None:
        layers.insert(0, (model, "lm_head", model.embedding_weight(), None))
    return layers


def linear_weights(model) -> list:
    """The weight of every linear layer of model, as held: each FastLinear's (its parameter or its
    StoredWeight; a FastGPT2's lm_head is the tied token embedding's), then linear_layers(model)'s
    (the layers not on a kernel yet)."""
    fast = [layer.stored if layer.stored is not None else layer.plain_weight for layer in attached(model)]
    return fast + [weight for _, _, weight, _ in linear_layers(model)]


def attached(model) -> list[FastLinear]:
    """The FastLinear layers of model (none: a plain model)."""
    return [m for m in model.modules() if isinstance(m, FastLinear)]


def weight_format(weight: torch.Tensor, int8: dict | None, fp16: bool) -> str:
    if isinstance(weight, StoredWeight):
        return weight.format
    if int8 is not None and weight in int8:
        return "int8"
    if fp16 and weight.dtype == torch.float32:
        return "fp16"
    return str(weight.dtype).removeprefix("torch.")


def candidates(fmt: str, dtype: torch.dtype) -> list[str]:
    """The working paths for a weight format (dtype: the parameters'; int8 has paths of its own)."""
    return [p for p in CANDIDATES.get(fmt, ()) if works(p)]


def measuring() -> bool:
    """Whether choices may be timed (GPT2_MEASURE_KERNELS=0: no; each format's default kernel)."""
    return os.environ.get("GPT2_MEASURE_KERNELS", "1") != "0"


def attach_kernels(model, int8: dict | None = None, fp16: bool = False, choose=None, held: dict | None = None
                   ) -> list[str]:
    """Put a CPU model's linear layers on this machine's kernels: each nn.Linear child becomes a
    FastLinear on the same weight and bias, and a FastGPT2's tied head its `lm_head` (a FastLinear
    on the token embedding's weight). int8: weight -> (q, scale) for weights quantized before
    (whose tensors hold the dequantized values); fp16: the float32 model's linear weights hold
    float16-rounded values. A weight its kernel packs into another layout becomes a StoredWeight
    that the FastLinear holds (the token embedding then a FastEmbedding on it). held: weights held
    as StoredWeights for layers built on the meta device (linear_layers).

    Per format, the kernel for each range of rows is the fastest of the working candidates on the
    format's most-read weight shape, measured once per machine and kept (rows_choice); choose: a
    function (format, sample weights, paths, int8) -> [(max_rows, path)] to use instead (tests).
    Weights below ONEDNN_MIN_WEIGHTS are not measured: a 16-bit or int8 format gets its own
    kernel, float32 and float16 stay plain. Kernels that pack a weight (PACKED_PATHS) do it on the
    path's first call (every layer at once), not here. Returns one line per format saying what runs
    where, and one naming the paths that pack on first call (empty: nothing attached, the model
    stays plain)."""
    groups: dict[str, list[tuple]] = {}
    for layer in linear_layers(model, held):
        if layer[2].device.type == "cpu":
            groups.setdefault(weight_format(layer[2], int8, fp16), []).append(layer)
    said, packing_groups = [], {}
    plain_to_stored = {}
    for fmt, layers in groups.items():
        dtype = layers[0][2].dtype
        paths = candidates(fmt, dtype)
        small = {id(w) for _, _, w, _ in layers if w.numel() < ONEDNN_MIN_WEIGHTS}
        if fmt in ("float32", "float16"):  # per-call overhead: the plain path
            layers = [layer for layer in layers if layer[2].numel() >= ONEDNN_MIN_WEIGHTS]
        if not paths or not layers:
            continue
        large = [w for _, _, w, _ in layers if w.numel() >= ONEDNN_MIN_WEIGHTS]
        choice, how = [(math.inf, paths[0])], "the format's default"
        if large and len(paths) > 1:
            shape, sample = most_read_shape(large)
            if choose is not None:
                choice, how = choose(fmt, sample, paths, int8), "as given"
            elif measuring():
                measured, how = rows_choice(fmt, shape, dtype, paths, lambda: sample, int8)
                choice = one_layout(measured)
                if choice != measured:
                    how += f"; measured {describe_choice(measured)}, run on the 1-row kernel's layout only"
            else:
                how = "the format's default: GPT2_MEASURE_KERNELS=0"
        for parent, name, weight, bias in layers:
            weight_choice = [(math.inf, paths[0])] if id(weight) in small else choice
            weight = stored_for(model, name, weight, weight_choice, plain_to_stored)
            kernel = _rows_aware(weight, weight_choice, int8, packing_groups, head=name == "lm_head")
            setattr(parent, name, FastLinear(weight, bias, kernel, fmt))
        said.append(f"{fmt}: {describe_choice(choice)} ({how})")
    note = packing_note({path for layer in attached(model) for _, path, k in layer.kernel.by_rows
                         if isinstance(k, PackedOnFirstCall) and not k.packed})
    return said + [note] if said and note else said


def planned_path(fmt: str, dtype: torch.dtype, config) -> str | None:
    """The path whose layout attach_kernels will give the large weights of a model of this config
    in this format (one_layout of the kept choice), known before its weights are read: the weight
    cache is keyed by it. None: not known without measuring (the first load of such a model), or
    no kernel (a float32 model too small for any)."""
    paths = candidates(fmt, dtype)
    if not paths:
        return None
    shape = (4 * config.n_embd, config.n_embd)
    if shape[0] * shape[1] < ONEDNN_MIN_WEIGHTS:
        return None if fmt in ("float32", "float16") else paths[0]
    if len(paths) == 1 or not measuring():
        return paths[0]
    kept = kernel_cache.lookup("kernels", rows_what(fmt, shape, dtype, paths))
    return None if kept is None else one_layout([(m, p) for m, p in kept["choice"]])[0][1]


def path_for_weight(plan: str | None, fmt: str, dtype: torch.dtype, numel: int) -> str | None:
    """The path attach_kernels will run a weight of numel elements on, where planned_path gave
    plan for the model's large weights: below ONEDNN_MIN_WEIGHTS, the format's default (float32
    and float16 weights: none, they stay plain)."""
    if numel >= ONEDNN_MIN_WEIGHTS:
        return plan
    paths = candidates(fmt, dtype)
    return None if fmt in ("float32", "float16") or not paths else paths[0]


def packed_layouts(path: str, layouts: dict) -> dict:
    """A weight's layouts ({"q", "scale"}, {"half"} or {"plain"}) as our C kernel of `path`
    packs them: {"panels"} (and the int8 scale), the source dropped."""
    source = layouts.get("q", layouts.get("half", layouts.get("plain")))
    panels = (native.pack_quad_panels(source) if path == "native-w8a8"
              else native.pack_panels(source, PANEL_DTYPES[path]))
    return {"panels": panels} | ({"scale": layouts["scale"]} if "scale" in layouts else {})


def most_read_shape(weights: list[torch.Tensor]) -> tuple[tuple, list[torch.Tensor]]:
    """(shape, its weights): the shape whose weights a step reads most of (in GPT-2, the MLP's;
    not the head, the largest single matrix but read once per step)."""
    by_shape: dict[tuple, list[torch.Tensor]] = {}
    for w in weights:
        by_shape.setdefault(tuple(w.shape), []).append(w)
    return max(by_shape.items(), key=lambda kv: len(kv[1]) * kv[1][0].numel())


def layout_key(path: str) -> str:
    """Paths with equal keys read the same bytes: the plain weight, the int8 bytes, or (a packing
    path) the copy that path packs."""
    return LAYOUTS[path] if LAYOUTS[path] in ("plain", "q") else path


def one_layout(choice: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """A measured choice with every row count on kernels that read one layout, the 1-row kernel's
    (a decode step, which most calls are): a range whose fastest kernel reads another layout runs
    the 1-row kernel instead. A weight is then held once, never as the plain weight beside a
    packed copy of it (or the int8 bytes beside their panels)."""
    first = choice[0][1]
    return merge_ranges([(m, p if layout_key(p) == layout_key(first) else first) for m, p in choice])


def merge_ranges(choice: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """Neighbouring ranges of [(max_rows, path)] with the same path become one."""
    merged = [choice[0]]
    for item in choice[1:]:
        if item[1] == merged[-1][1]:
            merged[-1] = (item[0], item[1])
        else:
            merged.append(item)
    return merged


def stored_for(model, name: str, weight, choice, done: dict):
    """The weight the kernels of `choice` run on: a plain weight whose one kernel packs it
    (onednn-bf16, native-f32, ...) becomes a StoredWeight, so that the packed copy can replace it
    (the token embedding, the tied head's weight, then a FastEmbedding on it); any other weight as
    it is. done: id(plain) -> its StoredWeight (the tied head and wte are one weight)."""
    fmt = str(weight.dtype).removeprefix("torch.")
    if isinstance(weight, StoredWeight) or fmt not in CANDIDATES or not {p for _, p in choice} <= set(CANDIDATES[fmt]) \
            or len({layout_key(p) for _, p in choice}) != 1 or LAYOUTS[choice[0][1]] in ("plain", "q"):
        return weight  # (a weight given with its int8 bytes or as float16 values is kept as given)
    if id(weight) not in done:
        done[id(weight)] = StoredWeight(fmt, {"plain": weight.detach()}, weight.shape, weight.dtype)
        if name == "lm_head":
            model.wte = FastEmbedding(done[id(weight)])
    return done[id(weight)]


def _rows_aware(weight, choice, int8, groups: dict[str, list], head: bool = False) -> RowsAwareKernel:
    """groups: path -> the PackedOnFirstCall kernels of this model on that path (filled here).
    A stored weight whose kernels all read one layout gives the packed copy's bytes in place of
    the layout it was packed from (head: the model's tied head, whose wte rows the embedding
    reads: it keeps them beside a library's opaque packing)."""
    built = {}
    replaces = isinstance(weight, StoredWeight) and len({layout_key(p) for _, p in choice}) == 1
    for _, path in choice:
        if path not in built:
            qs = int8.get(weight) if int8 and path in INT8_PATHS else None
            if path not in PACKED_PATHS:
                built[path] = build_kernel(path, weight, qs)
            elif (ready := kernel_from_layouts(path, weight)) is not None:
                built[path] = ready
            else:
                keep = head and LAYOUTS[path] == "packed"
                built[path] = PackedOnFirstCall(
                    lambda path=path, qs=qs: pack_in_place(path, weight, qs, replaces and not keep),
                    groups.setdefault(path, []))
    return RowsAwareKernel([(max_rows, path, built[path]) for max_rows, path in choice])


def pack_in_place(path: str, weight, int8, replace: bool):
    """build_kernel(path, weight, int8), then (replace) the stored weight holds the kernel's packed
    layout in place of the one it was packed from."""
    kernel = build_kernel(path, weight, int8)
    if replace:
        layouts, decoder = stored_form(path, kernel, weight)
        weight.replace(tuple(n for n in ("q", "half", "plain", "panels", "packed") if n not in layouts),
                       layouts, decoder)
        give_back_freed_memory()  # the layout it replaced, and the packing's temporaries
    return kernel


def pack_now(model, paths=None) -> int:
    """Pack now every attached kernel of model that would pack on its first call (or those on
    `paths`): to pay it up front, e.g. before timing a first step that must not include it, or to
    keep our C kernel's panels in the weight cache. Returns how many it packed."""
    return pack_all([k for layer in attached(model) for _, path, k in layer.kernel.by_rows
                     if isinstance(k, PackedOnFirstCall) and (paths is None or path in paths)])


def packing_note(said_paths: set[str]) -> str:
    """What the load line says about packing: which of the attached paths pack their weights on a
    path's first call (so the first step, not the load, pays it); "" if none does."""
    packed = [p for p in PACKED_PATHS if p in said_paths]
    return (f"{' and '.join(packed)} {'packs' if len(packed) == 1 else 'pack'} every layer's weights on its "
            f"first call, side by side on {torch.get_num_threads()} threads, so the first step pays that, not "
            f"the load" if packed else "")


def describe_choice(paths: list[tuple[float, str]]) -> str:
    """[(max_rows, path)] -> "1 row: onednn, 2-3 rows: mm, ..."."""
    parts, low = [], 1
    for max_rows, path in paths:
        rows = f"{low}+" if math.isinf(max_rows) else (f"{low}" if low == max_rows else f"{low}-{max_rows}")
        parts.append(f"{rows} {'row' if rows == '1' else 'rows'}: {path}")
        low = max_rows + 1 if not math.isinf(max_rows) else low
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# 3. Kernels per number of rows, measured once per machine and shape


def rows_what(fmt: str, shape, dtype: torch.dtype, paths: list[str]) -> dict:
    """What a kernel choice depends on besides the machine (its key in the cache)."""
    what = {"format": fmt, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
            "paths": paths, "rows": list(ROW_COUNTS)}
    return what | native_tag(paths)


def native_tag(paths) -> dict:
    """{"native": the C kernel's source hash} if our C kernel is among paths (an edited kernel is
    measured again), else {}."""
    return {"native": native.source_tag()} if any(p.startswith("native") for p in paths) else {}


def rows_choice(fmt: str, shape: tuple, dtype: torch.dtype, paths: list[str], sample, int8=None
                ) -> tuple[list[tuple[float, str]], str]:
    """([(max_rows, path)], how it was decided) for weights of a format and shape: kept from an
    earlier run on this machine, else measured now by choose_by_rows on sample() (a list of
    weights of that shape) and kept. The cache keeps the times too (the report shows them)."""
    what = rows_what(fmt, shape, dtype, paths)

    def measure():
        choice, times = choose_by_rows(sample(), paths, int8)
        return {"choice": [[None if math.isinf(m) else m, p] for m, p in choice],
                "ms": {p: {str(m): round(1000 * t, 4) for m, t in by_m.items()} for p, by_m in times.items()}}

    kept, measured_now = kernel_cache.decide_once(
        "kernels", what, measure, f"which kernel runs {fmt} weights {list(shape)} fastest")
    choice = [(math.inf if m is None else m, p) for m, p in kept["choice"]]
    return choice, ("measured now" if measured_now else "measured here before") + f", kept in {kernel_cache.shown_path()}"


def choose_by_rows(sample: list[torch.Tensor], paths: list[str], int8=None, rows=ROW_COUNTS,
                   limits=ROW_LIMITS) -> tuple[list[tuple[float, str]], dict]:
    """Time each path on the sample weights (all of one shape) at each row count; return
    ([(max_rows, fastest path)], the times {path: {rows: seconds per pass}}). The first path is
    the default: another takes a row count only by winning by KERNEL_MARGIN."""
    copies = copies_for_timing(sample)
    kernels = {p: [build_kernel(p, w, int8.get(w) if int8 and p in INT8_PATHS else None) for w in copies]
               for p in paths}
    times = time_kernels(kernels, copies[0].shape[1], copies[0].dtype, rows)
    def fastest(m):
        best = min(paths, key=lambda p: times[p][m])
        return best if times[best][m] < (1 - KERNEL_MARGIN) * times[paths[0]][m] else paths[0]

    choice = [(limit, fastest(m)) for m, limit in zip(rows, limits)]
    choice.append((math.inf, paths[0]))
    return merge_ranges(choice), times


def copies_for_timing(sample: list[torch.Tensor]) -> list[torch.Tensor]:
    """Enough of the sample weights (repeated if need be) to read TIMING_BYTES per pass."""
    per_weight = sample[0].numel() * sample[0].dtype.itemsize  # (a StoredWeight: as it decodes)
    n = max(1, min(math.ceil(TIMING_BYTES / per_weight), 4 * len(sample)))
    return [sample[i % len(sample)] for i in range(n)]


@torch.inference_mode()
def time_kernels(kernels: dict[str, list], in_features: int, dtype, rows=ROW_COUNTS,
                 repeats: int = 5) -> dict[str, dict[int, float]]:
    """{name: [kernel per weight]} -> {name: {M: seconds of one pass over its kernels with M rows,
    the fastest of `repeats`}}. dtype: the inputs' dtype, or {name: dtype}. Every repeat runs every (path, M) once, in turn, so the samples of
    each are spread over the whole measurement and a busy spell of the machine hits them alike;
    noise only ever adds time, so the fastest pass is the kernel's own cost. A first pass of each
    warms up."""
    g = torch.Generator().manual_seed(0)
    xs = {m: torch.randn(1, m, in_features, generator=g) for m in rows}
    dtypes = dtype if isinstance(dtype, dict) else {name: dtype for name in kernels}
    inputs = {name: {m: x.to(dtypes[name]) for m, x in xs.items()} for name in kernels}
    times = {p: {m: [] for m in rows} for p in kernels}
    for repeat in range(repeats + 1):
        for m in rows:
            for path, ks in kernels.items():
                x = inputs[path][m]
                t0 = time.perf_counter()
                for k in ks:
                    k(x, None)
                if repeat:
                    times[path][m].append(time.perf_counter() - t0)
    return {p: {m: min(t) for m, t in by_m.items()} for p, by_m in times.items()}


# ---------------------------------------------------------------------------------------------
# 4. The weight format dtype="auto" picks on a CPU, measured once per machine and model shape


def fastest_format(config, logits_in=None) -> tuple[str, str | None]:
    """(format, why; None when nothing was measured): the fastest format of AUTO_FORMATS here whose
    next-token distributions stay within FIDELITY_MAX_KL of float32's on the model's own weights.
    Speed: weights of the model's c_fc shape [4 n_embd, n_embd] at 1 row (a decode step) and 5
    rows (verifying 4 draft tokens); a format must beat the more exact ones by AUTO_MARGIN.
    Fidelity (`format_fidelity`): logits_in(format, tokens [B, T]) -> the model's logits [B, T,
    vocab] when loaded in that format (gpt2/loading.py passes it), compared with float32's on
    FIDELITY_SHAPE random tokens; measured only for a format that would win on speed. Without
    logits_in (a model shape only) the choice is by speed alone and the why says so. Once per
    machine and shape, kept (gpt2/speed/kernel_cache.py). A model whose layers are below
    ONEDNN_MIN_WEIGHTS stays float32 unmeasured, as does every model under GPT2_MEASURE_KERNELS=0."""
    if config.n_embd * config.n_embd < ONEDNN_MIN_WEIGHTS or not measuring():
        return "float32", None  # layers this small cost per-call overhead, which no format cuts
    formats = format_paths()
    what = {"n_embd": config.n_embd, "n_layer": config.n_layer, "formats": formats,
            "fidelity": fidelity_what(config) if logits_in is not None else None}
    what |= native_tag([p for paths in formats.values() for p in paths])
    kept, measured_now = kernel_cache.decide_once(
        "format", what, lambda: list(_measure_formats(config, logits_in)),
        f'which weight format dtype="auto" loads for width {config.n_embd}')
    fmt, why = kept[:2]
    return fmt, why + ("" if measured_now else f" (measured here before, kept in {kernel_cache.shown_path()})")


def timing_weights(config) -> tuple[tuple[int, int], list[torch.Tensor]]:
    """Random float32 weights of the model's c_fc shape [4 n_embd, n_embd]: as many distinct ones
    as TIMING_BYTES holds (at most one per layer), so a pass over them reads memory, not cache."""
    shape = (4 * config.n_embd, config.n_embd)
    n = max(1, min(math.ceil(TIMING_BYTES / (shape[0] * shape[1] * 4)), config.n_layer))
    # Constant values: these kernels' speed does not depend on them, and filling is instant.
    return shape, [torch.full(shape, 0.01 * (i + 1)) for i in range(n)]


def format_paths() -> dict[str, list[str]]:
    """AUTO_FORMATS -> the working paths for each (empty: the format has no fast path here, and a
    16-bit format on the plain path is not a candidate)."""
    out = {}
    for fmt, (dtype, _) in AUTO_FORMATS.items():
        paths = candidates(fmt, dtype)
        if fmt != "float32" and (not paths or paths[0] != CANDIDATES[fmt][0]):
            paths = []
        out[fmt] = paths
    return out


def format_times(config) -> tuple[dict[str, float], str]:
    """({format: seconds of a 1-row plus a 5-row pass over the timing weights, on its fastest
    path}, what was timed): every format with a fast path here, timed together."""
    shape, weights32 = timing_weights(config)
    kernels, dtypes = {}, {}  # "format/path" -> kernels, activation dtype: all timed together
    for fmt, paths in format_paths().items():
        dtype = AUTO_FORMATS[fmt][0]
        weights = [w.half().float() if fmt == "fp16" else w.to(dtype) for w in weights32]  # int8: quantized by build_kernel
        for p in paths:
            kernels[f"{fmt}/{p}"], dtypes[f"{fmt}/{p}"] = [build_kernel(p, w) for w in weights], dtype
    times = time_kernels(kernels, shape[1], dtypes, rows=(1, 5))
    scores = {}
    for name, t in times.items():
        fmt = name.split("/")[0]
        best_of = scores.get(fmt, (math.inf, math.inf))
        scores[fmt] = (min(best_of[0], t[1]), min(best_of[1], t[5]))
    return ({fmt: t1 + t5 for fmt, (t1, t5) in scores.items()},
            f"{len(weights32)} weights of this model's c_fc shape {list(shape)}, a 1-row plus a 5-row pass")


def pick_format(scores: dict[str, float], faithful) -> str:
    """The format to load: from the most exact (AUTO_FORMATS' order), each format replaces the best
    so far if it is faster by AUTO_MARGIN and faithful(format) (its fidelity within the bound;
    asked only of such a format). scores: {format: seconds}, formats without a fast path absent."""
    best = "float32"
    for fmt in AUTO_FORMATS:
        if fmt in scores and scores[fmt] < (1 - AUTO_MARGIN) * scores[best] and faithful(fmt):
            best = fmt
    return best


def _measure_formats(config, logits_in=None) -> tuple[str, str, dict]:
    """(format, why, {"ms": .., "fidelity": ..}) for fastest_format."""
    scores, timed = format_times(config)
    fidelity = FormatFidelity(logits_in, config) if logits_in is not None else None
    best = pick_format(scores, fidelity.within_bound if fidelity else lambda fmt: True)
    ms = ", ".join(f"{f} {1000 * s:.1f} ms" for f, s in scores.items())
    missing = [f for f, p in format_paths().items() if not p]
    why = (f"measured fastest here on {timed}: {ms}" + (f"; no fast path here for {', '.join(missing)}" if missing else ""))
    if fidelity is None:
        why += "; fidelity to float32 not measured (no model's weights given: by speed alone)"
    else:
        why += "; " + fidelity.describe()
    return best, why, {"ms": {f: round(1000 * s, 3) for f, s in scores.items()},
                       "fidelity": fidelity.measured if fidelity else None}


# ---------------------------------------------------------------------------------------------
# 5. Fidelity: how far a format's next-token distributions move from float32's

# The bound a format must keep to be picked by "auto": the mean KL divergence KL(p_float32 ||
# p_format) of next-token distributions, in nats. By Pinsker's inequality a KL of 1e-2 moves a
# distribution's probabilities by at most sqrt(KL / 2) ~ 0.07 in total (in practice far less), so
# sampling draws from nearly float32's distribution and greedy text follows float32's up to its
# near-ties. Float16 weights and per-channel int8 weights with float32 sums stay inside it on
# GPT-2's shapes (docs/precision.md); a format with a few levels per weight (the planted one of
# tests/test_precision.py) is far outside.
FIDELITY_MAX_KL = 1e-2
# Random token sequences the fidelity is measured on: [sequences, tokens], from a fixed seed, so
# the measurement is the same on every machine (and in the tests).
FIDELITY_SHAPE = (4, 32)
FIDELITY_SEED = 0
# Kept with a choice: a change of the measurement (or of the bound) makes "auto" decide again.
FIDELITY_VERSION = 1


def fidelity_tokens(config) -> torch.Tensor:
    """The token ids fidelity is measured on: [FIDELITY_SHAPE] (fewer tokens for a model with fewer
    positions), uniform over the vocabulary."""
    shape = (FIDELITY_SHAPE[0], min(FIDELITY_SHAPE[1], config.n_positions))
    return torch.randint(0, config.vocab_size, shape, generator=torch.Generator().manual_seed(FIDELITY_SEED))


def fidelity_what(config) -> dict:
    """What a fidelity measurement depends on besides the machine (part of the format's cache key)."""
    return {"version": FIDELITY_VERSION, "max_kl": FIDELITY_MAX_KL, "tokens": list(fidelity_tokens(config).shape),
            "vocab_size": config.vocab_size}


def fidelity(target_logits: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    """target_logits (float32's), logits (a format's): [..., vocab] -> {"kl": mean KL(p_float32 ||
    p_format) over the positions, in nats; "agreement": the share of positions whose greedy token
    (argmax) is float32's}. Computed in float64."""
    p_log = F.log_softmax(target_logits.double(), dim=-1)
    q_log = F.log_softmax(logits.double(), dim=-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(-1)
    agreement = (target_logits.argmax(-1) == logits.argmax(-1)).double()
    return {"kl": max(kl.mean().item(), 0.0), "agreement": agreement.mean().item()}


class FormatFidelity:
    """Each format's fidelity to float32 on one model, measured on first request: logits_in(format,
    tokens) runs the model loaded in that format. measured: {format: fidelity()}."""

    def __init__(self, logits_in, config):
        self.logits_in, self.tokens = logits_in, fidelity_tokens(config)
        self.target_logits, self.measured = None, {}

    def of(self, fmt: str) -> dict[str, float]:
        if fmt not in self.measured:
            if self.target_logits is None:
                self.target_logits = self.logits_in("float32", self.tokens).float()
            self.measured[fmt] = fidelity(self.target_logits, self.logits_in(fmt, self.tokens).float())
        return self.measured[fmt]

    def within_bound(self, fmt: str) -> bool:
        return fmt == "float32" or self.of(fmt)["kl"] <= FIDELITY_MAX_KL

    def describe(self) -> str:
        shown = ", ".join(f"{fmt} KL {f['kl']:.2g} nats, greedy agreement {100 * f['agreement']:.1f}%"
                          + ("" if f["kl"] <= FIDELITY_MAX_KL else " (outside the bound)")
                          for fmt, f in self.measured.items())
        return (f"fidelity to float32 on this model's weights ({FIDELITY_SHAPE[0]} x {FIDELITY_SHAPE[1]} random "
                f"tokens, bound KL <= {FIDELITY_MAX_KL:g}): " + (shown or "no faster format to check"))


# ---------------------------------------------------------------------------------------------
# 5. What a model holds


def held_bytes(model) -> int:
    """The bytes of every tensor a model holds: its parameters and buffers, its FastLinear and
    FastEmbedding layers' StoredWeights (the layouts they hold) and its kernels' own tensors (packed copies, scales), each storage
    counted once (a kernel reading a parameter's own tensor adds nothing). A library's opaque
    packed weight counts as its elements' bytes."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, StoredWeight):
            for layout in t.layouts.values():
                add(layout)
            return
        if isinstance(t, torch.Tensor):
            key, size = ((id(t), t.numel() * t.element_size()) if t.is_mkldnn
                         else (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        elif isinstance(t, torch.ScriptObject):  # fbgemm's packed float16 weight: 2 bytes a weight
            key, size = id(t), torch.ops.quantized.linear_unpack_fp16(t)[0].numel() * 2
        else:
            return
        if key not in seen:
            seen.add(key)
            total += size

    for tensor in [*model.parameters(), *model.buffers()]:
        add(tensor)
    for module in model.modules():
        if isinstance(getattr(module, "stored", None), StoredWeight):
            add(module.stored)
    for layer in attached(model):
        for _, _, kernel in layer.kernel.by_rows:
            kernel = kernel.kernel if isinstance(kernel, PackedOnFirstCall) else kernel
            for value in (vars(kernel).values() if kernel is not None else ()):
                add(value)
    return total
