"""Choosing a device and a dtype by name, and waiting for the device (so timers measure work, not
its launch).

dtype "auto" is the one place that says which number format runs fastest where (auto_dtype); the
measurements behind it are in the README ("Weight formats on CPU", "Precision") and come from
`python -m benchmarks.weight_formats` and `python -m benchmarks.model_speed --dtypes ...`.
"""

import torch

from . import fast_linear

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "half": "float16"}

# Measured on this project's CPU (2-core AMD EPYC, Zen 4 with AVX512-BF16; torch 2.13.0, 2 threads)
# on a gpt2-large-shaped model, `python -m benchmarks.weight_formats` on the idle machine (README,
# "Weight formats on CPU", runs 3 and 4 of docs/weight_formats.md): (one decoding step, one
# 5-token verification), each relative to one float32 step; float32's own verification costs
# CPU_FLOAT32_VERIFY5 steps. bfloat16 runs on oneDNN with pre-packed weights (gpt2/fast_linear.py);
# a float16 model has no such path (float16 *weights* in a float32 model do: quantize="fp16").
CPU_MEASURED = {torch.bfloat16: (0.57, 0.55), torch.float16: (0.56, 2.05)}
CPU_FLOAT32_VERIFY5 = 1.53
# bfloat16 pays on a CPU only where reading the weights dominates a step: a model of GPT-2 Small's
# size or larger. Small models spend their step in per-operation overhead, which bf16 does not cut.
CPU_BF16_MIN_PARAMETERS = 100_000_000


def cpu_has_bf16_instructions() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX). Without them oneDNN
    emulates bfloat16 and it is slower than float32."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # an older or non-x86 build of PyTorch
        return False


def resolve_device(name: str = "auto") -> torch.device:
    """"auto" -> cuda, then mps, then cpu. A named device must exist on this machine; otherwise a
    ValueError says what is missing and what to pass instead."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(name)!r}: CUDA is not available here (no NVIDIA GPU, or a "
                             f"CPU-only PyTorch build). Use cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(name)!r}: this machine has {torch.cuda.device_count()} "
                             f"CUDA device(s), numbered from 0")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {str(name)!r}: Apple's MPS is not available here. Use cpu or auto.")
    elif device.type != "cpu":
        raise ValueError(f"device {str(name)!r}: only cpu, cuda and mps are supported")
    return device


def auto_dtype(device: torch.device, num_parameters: int | None = None) -> torch.dtype:
    """What dtype="auto" picks on a device for a model of num_parameters: the fastest format
    measured to be faster in practice.
    CPU: bfloat16 for models of GPT-2 Small's size and up (num_parameters >=
    CPU_BF16_MIN_PARAMETERS) on a CPU with bfloat16 instructions, where the pre-packed oneDNN
    kernels (gpt2/fast_linear.py) make a step about 0.6 of a float32 one (README, "Weight formats
    on CPU"); float32 otherwise (and when the size is not known). CUDA: bfloat16 where the GPU
    supports it (same range as float32), else float16. MPS: float16 (bfloat16 needs a recent macOS)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    if (num_parameters is not None and num_parameters >= CPU_BF16_MIN_PARAMETERS
            and fast_linear.ENABLED and torch.backends.mkldnn.is_available()
            and cpu_has_bf16_instructions()):
        return torch.bfloat16
    return torch.float32


def resolve_dtype(dtype, device: torch.device, num_parameters: int | None = None) -> torch.dtype | None:
    """"auto" -> auto_dtype(device, num_parameters); a name ("float32", "bfloat16", "float16", or fp32/bf16/fp16)
    or one of those torch dtypes -> the torch dtype; None -> None (keep the checkpoint's dtype).
    Anything else is a ValueError that lists what works."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").lower()
        if name == "auto":
            return auto_dtype(device, num_parameters)
        dtype = DTYPES.get(DTYPE_ALIASES.get(name, name), dtype)
    if dtype in DTYPES.values():
        return dtype
    raise ValueError(f"dtype {dtype!r} is not supported: use auto (the default), float32, "
                     f"bfloat16 or float16. The model runs in floating point only (no int8 etc.).")


def dtype_note(dtype: torch.dtype, device: torch.device) -> str | None:
    """One line for a user who picked a format measured no faster here than float32 at a decoding
    step or at a 5-token verification (what speculative decoding runs), else None."""
    if device.type != "cpu" or dtype not in CPU_MEASURED:
        return None
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.bfloat16 and not cpu_has_bf16_instructions():
        return (f"note: this CPU has no bfloat16 instructions (AVX512-BF16 or AMX), so {name} is "
                f"emulated and slower than float32 here; --dtype auto picks float32 on it")
    step, verify = CPU_MEASURED[dtype]
    if step < 0.95 and verify < 0.95 * CPU_FLOAT32_VERIFY5:
        return None  # measurably faster at both
    return (f"note: {name} was measured no faster than float32 on this project's CPU: one decoding "
            f"step {step:.2f}x float32's time, verifying 5 tokens {verify:.2f}x a float32 step "
            f"(float32: {CPU_FLOAT32_VERIFY5:.2f}x); --dtype auto picks float32 or bfloat16 on CPU "
            f"(README, Precision)")


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
