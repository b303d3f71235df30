"""Choosing a device and a dtype by name, and waiting for the device (so timers measure work, not
its launch).

dtype "auto" on a CPU is decided by measuring on this machine (gpt2/speed/kernels.py: the capability
probe and fastest_format); no speed measured elsewhere is written into the code. Figures from the
machines measured so far are in docs/weight_formats.md and docs/linear_kernels.md.
"""

import logging
import sys

import torch

from . import fast_model, kernels
from ..checkpoints import DTYPE_ALIASES, DTYPES, resolve_device  # noqa: F401 (the scripts' names for them)
from ..checkpoints import resolve_dtype as plain_dtype

def cpu_has_bf16_instructions() -> bool:
    """Whether this CPU computes in bfloat16 natively (gpt2.speed.kernels; False under GPT2_CPU=avx2)."""
    return kernels.cpu_has_bf16_instructions()


def auto_format(device: torch.device, config=None, logits_in=None) -> tuple[torch.dtype, str | None, str | None]:
    """What dtype="auto" picks for a model with this config on a device: (dtype, quantize, why;
    why is None where no choice was measured: a toy model, or its size not known yet).
    CPU: the format measured fastest here for the model's layer shapes (gpt2.speed.kernels.fastest_format):
    float32, float16 weights in a float32 model (quantize "fp16"), bfloat16, or int8 weights in a
    float32 model (quantize "int8"); float32 when the
    config is not known. CUDA: bfloat16 where the GPU supports it (same range as float32), else
    float16. MPS: float16 (bfloat16 needs a recent macOS)."""
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return dtype, None, "a GPU's native 16-bit format"
    if device.type == "mps":
        return torch.float16, None, "Apple GPUs' 16-bit format"
    if config is None or not fast_model.ENABLED:
        return torch.float32, None, None
    fmt, why = kernels.fastest_format(config, logits_in)
    dtype, quantize = kernels.AUTO_FORMATS[fmt]
    return dtype, quantize, why


def auto_dtype(device: torch.device, config=None) -> torch.dtype:
    """The dtype of auto_format (a model with float16 weights computes in float32)."""
    return auto_format(device, config)[0]


def resolve_dtype(dtype, device: torch.device, config=None) -> torch.dtype | None:
    """"auto" -> auto_dtype(device, config); anything else as gpt2.loading.resolve_dtype (a name or
    torch dtype -> the torch dtype, None -> None, else a ValueError that lists what works)."""
    if isinstance(dtype, str) and dtype.removeprefix("torch.").lower() == "auto":
        return auto_dtype(device, config)
    return plain_dtype(dtype)


def faster_here() -> str:
    """What to use on this CPU instead of a 16-bit dtype without a fast path."""
    if kernels.works("fbgemm-fp16"):
        return "--quantize fp16 (float16 weights on fbgemm's kernel) or --dtype auto"
    return "float32 (--dtype auto)"


def dtype_note(dtype: torch.dtype, device: torch.device) -> str | None:
    """One line for a user who picked a 16-bit dtype that has no fast path on this CPU (it then runs
    on PyTorch's plain path, slower than float32), else None."""
    if device.type != "cpu":
        return None
    if dtype == torch.bfloat16 and not kernels.works("onednn-bf16"):
        return (f"note: bfloat16 has no fast kernel on this CPU ({kernels.probe('onednn-bf16')}): it "
                f"runs on PyTorch's plain bfloat16 path, slower than float32. Faster here: "
                f"{faster_here()} (python -m gpt2.speed.kernel_report shows what works here)")
    if dtype == torch.float16:
        return (f"note: float16 has no packed CPU kernel: a float16 model's layers run on PyTorch's "
                f"plain float16 path. Faster here: {faster_here()} (python -m gpt2.speed.kernel_report)")
    return None


_NOTES_SHOWN: set[str] = set()
# Where each load's kernel choice goes: logging.basicConfig(level=logging.INFO) shows it; the
# scripts print it in their own summary, python -m gpt2.speed.kernel_report shows the kept choices.
LOG = logging.getLogger("gpt2.speed")


def log_kernel_choice(choice: str) -> None:
    """Log (INFO, logger "gpt2.speed") the kernels loading attached: choice is one line per format
    joined by "; ", e.g. "float32: 1-16 rows: native-f32, 17+ rows: onednn (measured here)"."""
    LOG.info("kernels: gpt2/speed/kernels.py, %s. Plain PyTorch (gpt2/model.py as written): "
             "load_gpt2(path) without speed options, or model.to_plain()", choice)


def note_once(note: str | None, file=None) -> None:
    """Print a note (one line) the first time it comes up in this process."""
    if note and note not in _NOTES_SHOWN:
        _NOTES_SHOWN.add(note)
        print(note, file=file if file is not None else sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not just its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
