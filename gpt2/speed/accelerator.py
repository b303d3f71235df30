"""The one step that makes a model fast, taken where a reader sees it:

    model = load_gpt2("gpt2")                          # gpt2/model.py as written, float32
    fast = gpt2.speed.accelerate(model, "auto")        # a FastGPT2: print(fast) says what runs where

or, reading the file one weight at a time (the peak memory of the format's bytes, not of a float32
model first; the weight cache maps a format computed before):

    fast = gpt2.speed.load_accelerated("gpt2", format="auto")

What the step does, on a CPU: the weights are held in the chosen format (float32, float16 weights,
int8 weights, bfloat16), as the bytes its kernel reads (gpt2/speed/stored_weights.py); every linear
layer becomes a FastLinear on the kernel measured fastest on this machine (gpt2/speed/kernels.py),
the tied head a FastLinear (`lm_head`), the token embedding a FastEmbedding where its weight is
held in another layout. compile adds a compiled, fused or CUDA-graph decode step (`decode_path`). On a
GPU the linear layers stay nn.Linear (PyTorch's kernels are the fast ones there); the dtype and the
decode path are the step.

Formats (`format`):
  "auto"      the fastest here among those whose logits stay within a KL bound of float32's on
              the model's own weights (gpt2.speed.kernels.fastest_format), said in one line
  "float32"   the weights as they are
  "fp16"      float16 weights in a float32 model (float32 math)
  "int8"      int8 weights, one float32 scale per output row, float32 math (our C kernel)
  "w8a8"      int8's weights, and each layer's inputs rounded to int8 in blocks of 32 (a float32
              scale each), multiplied in integers, summed in float32 (our C kernel): a verification's
              rows cost little more than a step's; further from float32 than int8
  "bfloat16", "float16"   a 16-bit model
"""

import sys
from pathlib import Path

import torch
import torch.nn as nn

from ..config import GPT2Config
from ..checkpoints import (CONV1D_SUFFIXES, CheckpointError, checkpoint_errors, check_tensor_names_and_shapes,
                       empty_model, inferred_config, read_header, read_tensor, resolve_checkpoint, resolve_device)
from ..model import GPT2
from . import kernels, weight_cache
from .device import auto_format, dtype_note, log_kernel_choice, note_once, resolve_dtype
from .fast_linear import INT8_FORMATS, QUANTIZE_CHOICES, int8_per_channel
from .fast_model import FastEmbedding, FastGPT2
from .stored_weights import STORABLE, StoredWeight, give_back_freed_memory

# format name -> (the model's dtype, the weights' format where not the dtype's)
FORMATS = {"float32": (torch.float32, None), "fp16": (torch.float32, "fp16"), "int8": (torch.float32, "int8"),
           "w8a8": (torch.float32, "w8a8"),
           "bfloat16": (torch.bfloat16, None), "float16": (torch.float16, None)}
FORMAT_NAMES = ("auto", *FORMATS)


def accelerate(model: GPT2, format: str = "auto", compile=False) -> FastGPT2:
    """A fast model computing what `model` computes, in `format` (see the module docstring), on this
    machine's kernels: a new FastGPT2 (the plain model is left as it is; what both read as it is,
    they share). compile as in load_accelerated."""
    if isinstance(model, FastGPT2):
        raise ValueError("this model is accelerated already (a FastGPT2); accelerate its plain model "
                         "(model.to_plain(), or load_gpt2 without speed options)")
    if not isinstance(model, GPT2):
        raise TypeError(f"accelerate takes a GPT2 (gpt2/model.py), got {type(model).__name__}")
    if format not in FORMAT_NAMES:
        raise ValueError(f"format must be one of {', '.join(FORMAT_NAMES)}, got {format!r}")
    check_compile(compile)
    device = model.wpe.weight.device
    if format == "auto":
        def logits_in(fmt: str, tokens: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return accelerate(model, fmt)(tokens.to(device)).float().cpu()
        dtype, quantize = auto_choice(device, model.config, logits_in, "this model")
    else:
        dtype, quantize = FORMATS[format]
    state = model.state_dict()
    fast = build_fast_model(model.config, lambda name: state[name], device, dtype, quantize)
    if compile:
        attach_decode_path(fast, compile, device, "this model")
    return fast


def load_accelerated(name_or_path, device=None, format: str | None = None, dtype="auto", quantize=None,
                     compile=False) -> FastGPT2:
    """What accelerate(load_gpt2(name_or_path), format) gives, read from the file one weight at a
    time: the peak memory stays near the format's bytes, and a format computed before (int8 bytes,
    packed panels) is mapped from the weight cache (~/.cache/gpt2-spec/weights) instead of computed
    again.

    format: a name of FORMATS or "auto"; or, as load_gpt2 takes them, dtype ("auto", "float32",
    "bfloat16", "float16", None: the file's) with quantize (None, "int8", "fp16", "w8a8").
    compile: True gives the model a compiled decode step (gpt2.speed.compiled; on a CUDA GPU its block
    recorded as CUDA graphs, gpt2.speed.cuda_graph), "graph" the CUDA-graph path with the eager block (a
    CUDA GPU), "fused" every block in one call to C on a CPU (gpt2.speed.native_step: the int8 and w8a8
    formats) and that CUDA-graph path with five Triton kernels a block on a GPU (gpt2.speed.fused_step),
    "auto" the faster of eager and fused on a CPU (of eager and compiled where the model cannot take
    the fused step), of eager and CUDA graphs on a GPU, measured here (one line says which and why),
    False (default) keeps it eager."""
    if format is not None:
        if format not in FORMAT_NAMES:
            raise ValueError(f"format must be one of {', '.join(FORMAT_NAMES)}, got {format!r}")
        dtype, quantize = ("auto", None) if format == "auto" else FORMATS[format]
    device = resolve_device("cpu" if device is None else device)
    check_compile(compile)
    resolve_dtype(dtype, device)  # a bad dtype fails here, before anything is downloaded
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    if quantize == "fp16":
        dtype = fp16_weights_dtype(dtype, device)
    config, weights_path = resolve_checkpoint(name_or_path)
    model = load_fast_safetensors(weights_path, config, device=device, dtype=dtype, quantize=quantize)
    if compile:
        attach_decode_path(model, compile, device, Path(weights_path).parent.name)
    return model


def speed_line(model) -> str:
    """One line saying what runs a model: gpt2/model.py as written, or the speed step's format,
    kernels and decode path."""
    if not isinstance(model, FastGPT2):
        return "plain: gpt2/model.py as written (nn.Linear on PyTorch's kernels)"
    path = f"; decode path: {type(model.decode_path).__name__}" if model.decode_path is not None else ""
    return f"accelerated by gpt2.speed ({model.format}): {model.kernel_choice or 'PyTorch kernels'}{path}"


def check_compile(compile) -> None:
    if compile is not False:
        # The compiled paths (which register a custom op) are imported only when asked for: every
        # check a grader forks imports the project afresh.
        from .compiled import COMPILE_CHOICES
        if compile not in COMPILE_CHOICES:
            raise ValueError(f"compile must be one of {COMPILE_CHOICES}, got {compile!r}")


def attach_decode_path(model: FastGPT2, compile, device: torch.device, name: str) -> None:
    """compile (True, "graph", "fused" or "auto") on an accelerated model: sets its decode_path."""
    from .compiled import choose_compiled, compile_decode
    from .cuda_graph import choose_graphed, graph_decode
    from . import native_step

    if compile == "auto":
        # a GPU's choice is between eager and CUDA graphs; a CPU's between eager and the fused
        # step where the model can take it (no compiling), else eager and compiled
        if device.type == "cuda":
            choose = choose_graphed
        else:
            choose = native_step.choose_fused if native_step.why_not(model) is None else choose_compiled
        _, why = choose(model)
        note_once(f"note: compile auto for {name}: {why}", sys.stderr)
    elif compile == "fused" and device.type == "cpu":
        native_step.fused_decode(model)
    elif compile in ("graph", "fused"):
        graph_decode(model, fused=compile == "fused")
    elif device.type == "cuda":  # on a GPU, the compiled block recorded as CUDA graphs
        graph_decode(model, compiled=True)
    else:
        compile_decode(model)


def fp16_weights_dtype(dtype, device) -> torch.dtype:
    """quantize="fp16" keeps float16 weights in a float32 model (the kernel multiplies in float32):
    dtype "auto", None or float32 -> float32; anything else is a ValueError."""
    if dtype in ("auto", None) or resolve_dtype(dtype, device) == torch.float32:
        return torch.float32
    raise ValueError(f"quantize='fp16' stores the weights in float16 and computes in float32; it "
                     f"needs dtype 'float32' (or 'auto'), not {dtype!r}")


def load_fast_safetensors(path, config: GPT2Config | None = None, device=None, dtype=None,
                          quantize=None) -> FastGPT2:
    """A FastGPT2 from a safetensors file (either key layout). device, dtype and quantize as in
    load_accelerated, except that dtype None (the default) keeps the file's."""
    path = Path(path)
    device = resolve_device("cpu" if device is None else device)
    if quantize == "fp16":
        dtype = fp16_weights_dtype(dtype, device)
    resolve_dtype(dtype, device)  # a bad dtype fails before the file is opened
    with checkpoint_errors(path):
        prefix, shapes = read_header(path)
        config = config or inferred_config(shapes, path)
        dtype, quantize = resolve_format(dtype, quantize, device, config, path)
        expected = {name: tuple(p.shape) for name, p in empty_model(GPT2, config).state_dict().items()}
        check_tensor_names_and_shapes(shapes, expected, path)
        fmt = storage_format(dtype, quantize, path)
        plan = kernels.planned_path(fmt, dtype or torch.float32, config) if device.type == "cpu" else None
        # Kept only where the kernels' choice is known before the weights are read (not on the
        # load that measures it); float32 computes nothing to keep but its kernel's panels.
        key = (weight_cache.key(path, fmt, dtype or torch.float32, plan)
               if plan is not None and (fmt != "float32" or plan in kernels.STORABLE_PATHS) else None)
        cached, cache_file = (weight_cache.lookup(key) or (None, None)) if key else (None, None)
        model = build_fast_model(config, lambda name: read_tensor(path, prefix, name), device, dtype, quantize,
                                 fmt=fmt, plan=plan, cached=cached or {})
    if key is not None and device.type == "cpu":
        model.kernel_choice = "; ".join(filter(None, [model.kernel_choice, keep_weights(model, key, cached, cache_file)]))
    if model.kernel_choice:  # every load that put layers on kernels logs it, not only one keyed in the weight cache
        log_kernel_choice(model.kernel_choice)
    return model


def build_fast_model(config: GPT2Config, read, device: torch.device, dtype, quantize, fmt: str | None = None,
                     plan="unknown", cached: dict | None = None) -> FastGPT2:
    """A FastGPT2 of config whose weights are read(name) -> tensor ([out, in] for linear weights),
    one at a time: each linear weight is held in the format (int8 bytes and scales, float16
    values, or as it is), packed at once where the kernel that will read it is known (plan) and
    packs into a storable layout; cached: name -> layouts mapped from the weight cache, used as
    they are. Then gpt2.speed.kernels.attach_kernels puts each linear layer on its kernel (on a
    CPU; on a GPU the layers stay nn.Linear)."""
    fmt, cached = fmt or storage_format(dtype, quantize, None), cached or {}
    on_cpu = device.type == "cpu"
    if plan == "unknown":
        plan = kernels.planned_path(fmt, dtype or torch.float32, config) if on_cpu else None
    model = empty_model(FastGPT2, config)
    state, held = {}, {}
    for name, shape in {n: tuple(p.shape) for n, p in model.state_dict().items()}.items():
        if name in cached:  # mapped from the weight cache, nothing computed
            held[name] = held_weight(fmt, cached[name], shape, dtype)
            continue
        tensor = read(name)
        linear = name.endswith(CONV1D_SUFFIXES) or name == "wte.weight"
        kernel = kernels.path_for_weight(plan, fmt, dtype or torch.float32, tensor.numel()) if on_cpu else None
        if linear and on_cpu and (quantize is not None or kernel in kernels.STORABLE_PATHS):
            # what the format stores, packed now where the kernel's panels replace it (one
            # weight at a time: the peak stays near the size of what the model holds)
            layouts = format_layouts(tensor if quantize else tensor.to(dtype or tensor.dtype), quantize)
            if kernel in kernels.STORABLE_PATHS:
                layouts = kernels.packed_layouts(kernel, layouts)
            held[name] = held_weight(fmt, layouts, shape, dtype)
            big = tensor.numel() * tensor.element_size() >= TRIM_BYTES
            del tensor, layouts
            if big:  # (its float32 copy and temporaries go back now, not at the end of the load)
                give_back_freed_memory()
            continue
        if quantize is not None and linear:  # off a CPU: the format's values as plain weights
            tensor = quantized_values(tensor, quantize, dtype or tensor.dtype)
        state[name] = tensor.to(device=device, dtype=dtype or tensor.dtype).contiguous()
        del tensor
    plain = {name: t for name, t in held.items() if not isinstance(t, StoredWeight)}
    stored = {name: t for name, t in held.items() if isinstance(t, StoredWeight)}
    model.load_state_dict(state | plain, strict=False, assign=True)
    if "wte.weight" in stored:
        model.wte = FastEmbedding(stored["wte.weight"])
    model.format = fmt
    if on_cpu:
        model.kernel_choice = "; ".join(kernels.attach_kernels(model, held=stored))
    unplaced_to_plain(model, stored)
    del state, held
    give_back_freed_memory()
    return model.requires_grad_(False).eval()


def unplaced_to_plain(model: FastGPT2, stored: dict) -> None:
    """Weights held in a format that no kernel here runs (attach_kernels left their layers as
    nn.Linear): their decoded values become the layers' plain parameters."""
    for name, weight in stored.items():
        module = model.get_submodule(name.rpartition(".")[0])
        if type(module) in (nn.Linear, nn.Embedding) and module.weight.is_meta:
            module.weight = nn.Parameter(weight.decode(), requires_grad=False)


def quantized_values(tensor: torch.Tensor, quantize: str, dtype: torch.dtype) -> torch.Tensor:
    """The values a weight has in a format, as a plain tensor of dtype: int8's q * scale, fp16's
    float16-rounded values (w8a8: int8's; where no kernel runs it, its inputs are not rounded)."""
    if quantize in INT8_FORMATS:
        q, scale = int8_per_channel(tensor)
        return (q.float() * scale[:, None]).to(dtype)
    return tensor.to(torch.float16).to(dtype)


def storage_format(dtype, quantize, path) -> str:
    """The weight format a loaded model stores: "int8", "w8a8", "fp16" (float16 weights in a float32
    model), or the dtype's name ("float32", "bfloat16", "float16"; dtype None: the file's)."""
    if quantize is not None:
        return quantize
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    from safetensors import safe_open
    with safe_open(path, framework="pt", device="cpu") as f:
        return str(f.get_tensor(next(k for k in f.keys() if k.endswith("wpe.weight"))).dtype).removeprefix("torch.")


# A weight read from the file at least this large gives its freed copy back to the system at once
# (give_back_freed_memory), so that the freed blocks of many weights do not add up during the load.
TRIM_BYTES = 1 << 24
# Rows of a weight quantized at a time: the float32 temporaries of int8_per_channel stay small.
QUANTIZE_ROWS = 4096


def format_layouts(weight: torch.Tensor, quantize: str) -> dict[str, torch.Tensor]:
    """What a format stores of one weight [out, in] read from the file: int8 bytes and scales
    (quantized QUANTIZE_ROWS rows at a time: int8_per_channel is per row), float16 values, or
    (quantize None) the weight itself."""
    if quantize is None:
        return {"plain": weight.contiguous()}
    if quantize == "fp16":
        return {"half": weight.to(torch.float16)}
    q = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], QUANTIZE_ROWS):
        q[start:start + QUANTIZE_ROWS], scale[start:start + QUANTIZE_ROWS] = int8_per_channel(
            weight[start:start + QUANTIZE_ROWS])
    return {"q": q, "scale": scale}


def held_weight(fmt: str, layouts: dict, shape, dtype) -> torch.Tensor | StoredWeight:
    """What the model holds for one weight held as `layouts`: the plain tensor itself, or a
    StoredWeight of shape [out, in] decoding to dtype (float32 where the file's dtype is kept)."""
    if set(layouts) == {"plain"}:
        return layouts["plain"]
    return StoredWeight(fmt, layouts, shape, dtype or torch.float32)


def held_weights(model: FastGPT2) -> dict:
    """{parameter name in the checkpoint: the model's weight as held (a tensor or a StoredWeight)}
    for the token embedding and every linear layer (the tied lm_head is the embedding's)."""
    found = {}
    for name, module in model.named_modules():
        if name == "lm_head" or not (name == "wte" or isinstance(module, (nn.Linear, kernels.FastLinear))):
            continue
        stored = getattr(module, "stored", None)
        found[f"{name}.weight"] = stored if stored is not None else (
            module.plain_weight if isinstance(module, kernels.FastLinear) else module.weight)
    return found


def keep_weights(model: FastGPT2, key: dict, cached, cache_file) -> str:
    """The load line's part about the weight cache. A load that mapped the cache says so; any
    other keeps what it computed (the stored weights' plain-tensor layouts: int8 bytes and scales,
    16-bit values, our C kernel's panels) in the cache."""
    if cached:
        return (f"weights mapped from the weight cache {weight_cache_name(cache_file)} ({key['format']}, "
                f"nothing quantized or packed again)")
    held = {}
    for name, weight in held_weights(model).items():
        if isinstance(weight, StoredWeight):
            kept = {layout: t for layout, t in weight.layouts.items()
                    if layout in STORABLE and not (layout == "plain" and key["format"] == "float32")}
        elif key["format"] != "float32":
            kept = {"plain": weight.data}  # (a bfloat16 or float16 model's values, cast from the file)
        else:
            continue
        if kept:
            held[name] = kept
    written = weight_cache.store(key, held)
    if written is None:
        return f"{key['format']} weights computed now (no weight cache)"
    return (f"{key['format']} weights computed now and kept in {weight_cache_name(written)} "
            f"(the next load maps them)")


def weight_cache_name(path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text.startswith(home + "/") else text


def auto_choice(device, config: GPT2Config, logits_in, name: str) -> tuple[torch.dtype, str | None]:
    """(dtype, quantize) of format "auto" for a model of config on device (gpt2.speed.device.auto_format),
    said in one line where it was measured."""
    dtype, quantize, why = auto_format(device, config, logits_in)
    if why is not None and device.type == "cpu":
        described = {"fp16": "float16 weights (float32 math)", "int8": "int8 weights (float32 model)",
                     "w8a8": "int8 weights and int8 inputs in blocks (w8a8, float32 sums)"}.get(
            quantize, str(dtype).removeprefix("torch."))
        note_once(f"note: dtype auto for {name}: {described}, {why}", sys.stderr)
    return dtype, quantize


def resolve_format(dtype, quantize, device, config: GPT2Config, path) -> tuple[torch.dtype | None, str | None]:
    """(dtype, quantize) to load with, now that the model's shapes are known. "auto" without a
    quantize option is decided here (auto_choice); a 16-bit dtype without a fast path on this CPU
    gets its one-line note."""
    if isinstance(dtype, str) and dtype.lower() == "auto" and quantize is None:
        return auto_choice(device, config, format_logits(path, config, device), Path(path).parent.name or str(path))
    dtype = resolve_dtype(dtype, device, config)
    if dtype is not None and quantize not in INT8_FORMATS:
        note_once(dtype_note(dtype, device), sys.stderr)
    return dtype, quantize


def format_logits(path, config: GPT2Config, device):
    """(format, tokens [B, T]) -> logits [B, T, vocab] of the model at path loaded in one of
    gpt2.speed.kernels.AUTO_FORMATS: what format "auto" measures a format's fidelity to float32
    with (one model at a time, freed before the next)."""
    def logits_in(fmt: str, tokens: torch.Tensor) -> torch.Tensor:
        dtype, quantize = kernels.AUTO_FORMATS[fmt]
        model = load_fast_safetensors(path, config, device=device, dtype=dtype, quantize=quantize)
        with torch.inference_mode():
            return model(tokens.to(device)).float().cpu()
    return logits_in


__all__ = ["accelerate", "load_accelerated", "speed_line", "FORMATS", "CheckpointError"]
