"""Choosing a device by name, and waiting for it (so timers measure work, not its launch)."""

import torch


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
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available here (no NVIDIA GPU, or a "
                             f"CPU-only PyTorch build). Use --device cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"--device {name}: Apple's MPS is not available here. Use --device cpu or auto.")
    elif device.type != "cpu":
        raise ValueError(f"--device {name}: only cpu, cuda and mps are supported")
    return device


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
