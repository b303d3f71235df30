"""Choosing a device and a dtype by name, and waiting for the device (so timers measure work, not
its launch).

dtype "auto" is the one place that says which number format runs fastest where (auto_dtype); the
measurements behind it are in the README ("Precision") and come from
`python -m benchmarks.model_speed --dtypes float32 bfloat16 float16`.
"""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "half": "float16"}

# Measured on this project's CPU (2-core AMD EPYC, Zen 4; torch 2.13.0, 2 threads) on a
# gpt2-large-shaped model, run C of the README's Precision table: (one decoding step, one 5-token
# verification), each relative to one float32 step; float32's own verification costs
# CPU_FLOAT32_VERIFY5 steps. The machine was shared, and runs disagree (README).
CPU_MEASURED = {torch.bfloat16: (0.92, 1.21), torch.float16: (0.95, 1.90)}
CPU_FLOAT32_VERIFY5 = 1.38


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


def auto_dtype(device: torch.device) -> torch.dtype:
    """What dtype="auto" picks on a device: the fastest format measured to be faster in practice.
    CPU: float32, because half precision is not faster on the CPUs measured here (README,
    "Precision"). CUDA: bfloat16 where the GPU supports it (same range as float32), else float16.
    MPS: float16 (bfloat16 needs a recent macOS)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def resolve_dtype(dtype, device: torch.device) -> torch.dtype | None:
    """"auto" -> auto_dtype(device); a name ("float32", "bfloat16", "float16", or fp32/bf16/fp16)
    or one of those torch dtypes -> the torch dtype; None -> None (keep the checkpoint's dtype).
    Anything else is a ValueError that lists what works."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").lower()
        if name == "auto":
            return auto_dtype(device)
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
    step, verify = CPU_MEASURED[dtype]
    if step < 0.95 and verify < 0.95 * CPU_FLOAT32_VERIFY5:
        return None  # measurably faster at both
    name = str(dtype).removeprefix("torch.")
    return (f"note: {name} was measured no faster than float32 on this project's CPU: one decoding "
            f"step {step:.2f}x float32's time, verifying 5 tokens {verify:.2f}x a float32 step "
            f"(float32: {CPU_FLOAT32_VERIFY5:.2f}x); --dtype auto picks float32 on CPU (README, Precision)")


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
