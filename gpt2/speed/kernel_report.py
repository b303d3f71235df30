"""What this machine's CPU can run and which kernel runs where: `python -m gpt2.speed.kernel_report`.

    python -m gpt2.speed.kernel_report                      # the capability probe, and the kept choices
    python -m gpt2.speed.kernel_report --model gpt2-large   # + kernels per format and rows, and "auto",
                                                      #   for that size (measured if not kept yet;
                                                      #   by speed alone: no weights to check)
    python -m gpt2.speed.kernel_report --model runs/standins/target   # a checkpoint folder: "auto"
                                                      #   as loading it decides, speed and fidelity
    python -m gpt2.speed.kernel_report --remeasure          # forget this machine's kept choices and
                                                      #   measure them again
    GPT2_CPU=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m gpt2.speed.kernel_report
                                                      # as on a CPU without AVX-512 / bfloat16
    python -m gpt2.speed.kernel_report --cache              # the weight cache's files only
    python -m gpt2.speed.kernel_report --clear-cache        # delete them (gpt2/speed/weight_cache.py)

The decisions themselves are gpt2/speed/kernels.py's, kept by gpt2/speed/kernel_cache.py; this only prints
them (CI prints it too, so every test log says what it tested).
"""

import argparse
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from . import kernel_cache, kernels, weight_cache
from ..config import GPT2Config
from ..checkpoints import CheckpointError, resolve_checkpoint
from .accelerator import format_logits


def report(config: GPT2Config | None = None, logits_in=None) -> str:
    """The probe's findings and this machine's kept choices; with a config, also the kernel
    fastest per format and row count on weights of its c_fc shape (as loading such a model
    chooses, and keeps), and what dtype="auto" picks (logits_in: the model's logits per format,
    gpt2.loading.format_logits, for the fidelity check; None: by speed alone)."""
    lines = [f"CPU: {kernel_cache.cpu_name() or 'unknown'}; flags: {' '.join(kernel_cache.cpu_flags()) or 'none found'}",
             f"torch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
             f"{torch.get_num_threads()} threads"
             + (f"; acting as {kernels.EMULATIONS[kernels.emulated_cpu()]}" if kernels.emulated_cpu() else ""),
             f"bfloat16 instructions: {'yes' if kernels.cpu_has_bf16_instructions() else 'no'}",
             "kernel paths:"]
    for path, what in kernels.PATHS.items():
        why = kernels.probe(path)
        lines.append(f"  {'works ' if why is None else 'absent'}  {path:12s} {what}" + (f"  ({why})" if why else ""))
    if config is not None:
        lines += model_choices(config, logits_in)
    kept = kernel_cache.entries_here()
    lines.append(f"choices kept for this machine in {kernel_cache.shown_path()}: {len(kept)} (each load_gpt2 "
                 f"logs its model's to the 'gpt2.speed' logger at INFO; the scripts print it)")
    for entry in kept:
        lines.append(f"  {entry['measured']}  {entry['kind']} {describe_what(entry['what'])}: "
                     f"{describe_value(entry['kind'], entry['value'])}")
    return "\n".join(lines)


def model_choices(config, logits_in=None) -> list[str]:
    """The kernels loading chooses per format for a model of this config (kept or measured now),
    with their times, and dtype="auto"'s format with its speed and fidelity."""
    shape = (4 * config.n_embd, config.n_embd)
    lines = [f"fastest kernel per format and rows on weights of shape {list(shape)} (ms per pass over "
             f"{kernels.TIMING_BYTES >> 20} MiB of them, fastest of 5 interleaved passes):"]
    for fmt, paths in kernels.format_paths().items():
        if not paths:
            lines.append(f"  {fmt}: no fast path here")
            continue
        dtype = kernels.AUTO_FORMATS[fmt][0]
        choice, how = kernels.rows_choice(fmt, shape, dtype, paths, lambda: timing_sample(shape, fmt, dtype))
        lines.append(f"  {fmt}: {kernels.describe_choice(choice)} ({how})")
        kept = kernel_cache.lookup("kernels", kernels.rows_what(fmt, shape, dtype, paths))
        for p, by_rows in (kept or {}).get("ms", {}).items():
            lines.append(f"    {p:12s} " + "  ".join(f"M={m}: {t:7.2f}" for m, t in by_rows.items()))
    fmt, why = kernels.fastest_format(config, logits_in)
    lines.append(f'dtype="auto" picks {fmt}: {why or "not measured (a model this small, or GPT2_MEASURE_KERNELS=0)"}')
    return lines


def timing_sample(shape, fmt: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Weights of a shape in a format and dtype, enough of them to read TIMING_BYTES per pass
    (their values do not change these kernels' speed)."""
    n = max(1, math.ceil(kernels.TIMING_BYTES / (shape[0] * shape[1] * torch.finfo(dtype).bits // 8)))
    weights = [torch.full(tuple(shape), 0.01 * (i + 1)) for i in range(n)]
    return [w.half().float() if fmt == "fp16" else w.to(dtype) for w in weights]


def describe_what(what: dict) -> str:
    shown = [f"{k} {v}" for k, v in what.items() if k not in ("paths", "rows", "formats", "native", "fidelity")]
    if "fidelity" in what:
        shown.append("fidelity checked on its weights" if what["fidelity"] else "by speed alone")
    return ", ".join(shown)


def describe_value(kind: str, value) -> str:
    if kind == "kernels":
        return kernels.describe_choice([(math.inf if m is None else m, p) for m, p in value["choice"]])
    if kind == "format":  # [format, why, {"ms": .., "fidelity": {format: {"kl", "agreement"}} or None}]
        details = value[2] if len(value) > 2 else {}
        ms = ", ".join(f"{f} {t:.1f} ms" for f, t in details.get("ms", {}).items())
        fidelity = details.get("fidelity")
        checked = ("fidelity not checked (no weights)" if fidelity is None else "fidelity: " + (", ".join(
            f"{f} KL {v['kl']:.2g}, agreement {100 * v['agreement']:.1f}%" for f, v in fidelity.items()) or "none needed"))
        return f"{value[0]} ({ms}; {checked})" if ms else value[0]
    if kind in ("compiled", "fused_cpu", "cuda_graph"):  # a decode path chosen by compile="auto": [use, why]
        return f"{'taken' if value[0] else 'eager kept'}: {value[1]}"
    if kind == "fused_block_sizes":  # gpt2/speed/fused_step.py: one product's tuned launch
        rows, block_n, block_k, warps = value
        return f"{rows} rows a program, BLOCK_N {block_n}, BLOCK_K {block_k}, {warps} warps"
    if kind == "gamma costs":  # a CostModel (spec_decoding/costs.py), as JSON
        return (f"draft step {1000 * value['draft_step_s']:.2f} ms, target step "
                f"{1000 * value['target_score_s'][0]:.2f} ms")
    return str(value)


def remeasure(config: GPT2Config | None) -> list[str]:
    """Forget this machine's kept choices and measure the kernel and format ones again (and those
    of config, if given); a choice of another kind is measured again where it is next needed."""
    forgotten = kernel_cache.forget()
    lines = [f"forgot {len(forgotten)} choice(s) kept for this machine in {kernel_cache.shown_path()}"]
    for entry in forgotten:
        what = entry["what"]
        if entry["kind"] == "kernels":
            dtype = getattr(torch, what["dtype"])
            paths = kernels.candidates(what["format"], dtype)
            if len(paths) > 1:
                choice, _ = kernels.rows_choice(what["format"], tuple(what["shape"]), dtype, paths,
                                                lambda: timing_sample(what["shape"], what["format"], dtype))
                lines.append(f"  kernels {describe_what(what)}: {kernels.describe_choice(choice)}")
        elif entry["kind"] == "format":
            fmt, _ = kernels.fastest_format(SimpleNamespace(n_embd=what["n_embd"], n_layer=what["n_layer"]))
            lines.append(f"  format {describe_what(what)}: {fmt}")
        else:
            lines.append(f"  {entry['kind']} {describe_what(what)}: measured again when next needed")
    return lines


def cache_lines() -> list[str]:
    """The weight cache: its folder, its files (most recently used first) and its size limit."""
    where = weight_cache.folder()
    if where is None:
        return ["weight cache: off (GPT2_WEIGHT_CACHE=0)"]
    files = weight_cache.entries()
    total = sum(e["bytes"] for e in files)
    lines = [f"weight cache {where}: {len(files)} file(s), {total / 1e9:.2f} GB of "
             f"{weight_cache.limit_bytes() / 1e9:.1f} GB (GPT2_WEIGHT_CACHE_GB; the files used longest ago go first)"]
    return lines + [f"  {weight_cache.describe(e)}" for e in files]


def model_of(name: str):
    """(config, logits_in): a size name's shapes (logits_in None: no weights), or a checkpoint
    folder's config and its logits per format (gpt2.loading.format_logits)."""
    if not Path(name).expanduser().exists():
        return GPT2Config.from_name(name), None
    config, weights = resolve_checkpoint(name)
    if config is None:
        raise ValueError(f"{name} has no config.json beside its weights: pass its folder with config.json")
    return config, format_logits(weights, config, torch.device("cpu"))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpt2.speed.kernel_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="also choose kernels for this GPT-2 size's "
                        "shapes (gpt2, gpt2-medium, gpt2-large, gpt2-xl), as loading it does; or a "
                        "checkpoint folder: also the fidelity of the formats on its weights")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--remeasure", action="store_true", help="forget the choices kept for this "
                        "machine and measure them again")
    parser.add_argument("--cache", action="store_true", help="list the weight cache's files (what "
                        "loading computed once per checkpoint and format, and maps afterwards)")
    parser.add_argument("--clear-cache", action="store_true", help="delete the weight cache's files")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.clear_cache:
            gone = weight_cache.clear()
            print(f"deleted {len(gone)} file(s), {sum(e['bytes'] for e in gone) / 1e9:.2f} GB, from the weight cache "
                  f"{weight_cache.folder()}")
        if args.cache or args.clear_cache:
            print("\n".join(cache_lines()))
            return
        config, logits_in = model_of(args.model) if args.model else (None, None)
        if args.remeasure:
            print("\n".join(remeasure(config)))
        print(report(config, logits_in))
        print("\n".join(cache_lines()))
    except (ValueError, CheckpointError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
