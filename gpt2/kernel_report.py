"""What this machine's CPU can run and which kernel runs where: `python -m gpt2.kernel_report`.

    python -m gpt2.kernel_report                      # the capability probe (instant)
    python -m gpt2.kernel_report --model gpt2-large   # + kernels per format and rows, and "auto"
    GPT2_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m gpt2.kernel_report
                                                      # as on a CPU without AVX-512 / bfloat16

The decisions themselves are gpt2/kernels.py's; this only prints them (CI prints it too, so every
test log says what it tested).
"""

import argparse
import sys

import torch

from . import kernels
from .config import GPT2Config


def report(config: GPT2Config | None = None) -> str:
    """The probe's findings; with a config, also the kernel measured fastest per format and row
    count on weights of its c_fc shape (as loading such a model would choose), and what
    dtype="auto" picks."""
    lines = [f"CPU: {kernels.cpu_name() or 'unknown'}; flags: {' '.join(kernels.cpu_flags()) or 'none found'}",
             f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
             f"{torch.get_num_threads()} threads"
             + (f"; acting as {kernels.EMULATIONS[kernels.emulated_cpu()]}" if kernels.emulated_cpu() else ""),
             f"bfloat16 instructions: {'yes' if kernels.cpu_has_bf16_instructions() else 'no'}",
             "kernel paths:"]
    for path, what in kernels.PATHS.items():
        why = kernels.probe(path)
        lines.append(f"  {'works ' if why is None else 'absent'}  {path:12s} {what}" + (f"  ({why})" if why else ""))
    if config is None:
        return "\n".join(lines)
    shape, weights32 = kernels.timing_weights(config)
    lines.append(f"fastest kernel per format and rows on {len(weights32)} weights of shape {list(shape)} "
                 f"(ms per pass over them, fastest of 5 interleaved passes):")
    for fmt, paths in kernels.format_paths().items():
        if not paths:
            lines.append(f"  {fmt}: no fast path here")
            continue
        dtype = kernels.AUTO_FORMATS[fmt][0]
        weights = [w.half().float() if fmt == "fp16" else w.to(dtype) for w in weights32]
        choice, times = kernels.choose_by_rows(weights, paths)
        lines.append(f"  {fmt}: {kernels.describe_choice(choice)}")
        for p in paths:
            cells = "  ".join(f"M={m}: {1000 * t:7.2f}" for m, t in times[p].items())
            lines.append(f"    {p:12s} {cells}")
    fmt, why = kernels.fastest_format(config)
    lines.append(f'dtype="auto" picks {fmt}: {why}')
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpt2.kernel_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="also measure kernels on this GPT-2 size's "
                        "shapes (gpt2, gpt2-medium, gpt2-large, gpt2-xl), as loading it would")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        print(report(GPT2Config.from_name(args.model) if args.model else None))
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
