"""Helpers the benchmark scripts share: stand-in checkpoints, timing, memory bandwidth, tables.

The Hugging Face hub is out of reach here, so every checkpoint is a random-weight stand-in of the
official shape, written in the hub's exact layout by offline.random_weights. How long a forward pass
takes does not depend on the weight values, so the timings are those of the real models.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from gpt2 import OFFICIAL_CONFIGS, encode
from gpt2.speed.device import synchronize
from offline.random_weights import save_agreeing_pair, save_random_checkpoint

DEFAULT_CHECKPOINTS = Path("checkpoints/standins")
BYTES_PER_GB = 1e9


def add_output_options(parser, name: str, quick: str) -> None:
    """The options every benchmark script has: --out (default runs/NAME) and --quick, a smoke run
    (quick says what it shrinks)."""
    parser.add_argument("--out", type=Path, default=Path("runs") / name, help=f"output folder (default runs/{name})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")


def has_checkpoint(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def standin_checkpoint(name: str, root: Path = DEFAULT_CHECKPOINTS, seed: int = 0) -> Path:
    """checkpoints/standins/<name>: a random checkpoint of the official shape, made once."""
    folder = Path(root) / name
    if not has_checkpoint(folder):
        print(f"  writing a random {name} checkpoint to {folder} (once; reused next time) ...", flush=True)
        save_random_checkpoint(folder, OFFICIAL_CONFIGS[name], seed=seed)
    return folder


def standin_pair(root: Path, target_name: str, draft_n_layer: int, damping: float,
                 embedding_std: float, seed: int = 0) -> tuple[Path, Path]:
    """A target of an official shape and a draft made of its first draft_n_layer blocks
    (offline.random_weights.save_agreeing_pair), under a folder named after the settings."""
    folder = Path(root) / f"pair-{target_name}-K{draft_n_layer}-d{damping:g}-e{embedding_std:g}-s{seed}"
    target_dir, draft_dir = folder / "target", folder / "draft"
    if not (has_checkpoint(target_dir) and has_checkpoint(draft_dir)):
        print(f"  writing the agreeing pair to {folder} (once; reused next time) ...", flush=True)
        save_agreeing_pair(target_dir, draft_dir, OFFICIAL_CONFIGS[target_name], draft_n_layer,
                           damping=damping, seed=seed, embedding_std=embedding_std)
    return target_dir, draft_dir


def random_prompt(length: int, seed: int, vocab_size: int = 50257) -> list[int]:
    """Random token ids (avoiding <|endoftext|>, 50256, which would end HF's generation)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab_size, 50256), (length,), generator=g).tolist()


def timed(device, fn, *args, **kwargs):
    """(fn's result, wall seconds) of one call, with a GPU device synchronized on both sides
    (device None or cpu: nothing to wait for)."""
    if device is not None:
        synchronize(device)
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    if device is not None:
        synchronize(device)
    return result, time.perf_counter() - start


def gamma_order(gamma):
    """Sort key for benchmark gammas: fixed ones (ints) by size, then policies (auto, heuristic)."""
    return (0, gamma, "") if isinstance(gamma, int) else (1, 0, gamma)


def median(values):
    return statistics.median(values) if values else float("nan")


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a batch-1 decoding step must read: every parameter once (wte twice in
    principle, as embedding row and as the output head, but the row is tiny), except the position
    embedding, of which one row is read."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    # an accelerated model's weights held as their kernels' bytes, counted as the values they hold
    stored = {id(m.stored): m.stored for m in model.modules() if getattr(m, "stored", None) is not None}
    total += sum(w.numel() * w.dtype.itemsize for w in stored.values())
    wpe = model.wpe.weight
    return total - wpe.numel() * wpe.element_size() + wpe.shape[1] * wpe.element_size()


def measure_read_bandwidth(gib: float = 1.0, repeats: int = 7, device=None) -> dict:
    """The machine's memory read bandwidth as PyTorch sees it: time x.sum() over a large fp32
    tensor (far larger than any cache), with torch's default threads (device: a GPU's memory
    instead). Median of several runs."""
    x = torch.ones(int(gib * 2**30) // 4, device=device)
    x.sum()  # touch every page once
    times = [timed(device, x.sum)[1] for _ in range(repeats)]
    nbytes = x.numel() * 4
    return {"bytes": nbytes, "seconds_median": median(times), "seconds_best": min(times),
            "gb_per_s_median": nbytes / median(times) / BYTES_PER_GB,
            "gb_per_s_best": nbytes / min(times) / BYTES_PER_GB, "threads": torch.get_num_threads()}


def markdown_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out_dir: Path, results: dict, markdown: str) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    (out_dir / "results.md").write_text(markdown)
    print(f"\nWrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")


def machine_info() -> dict:
    """What a result was measured on. transformers' version only where it is installed (a test-only
    reference: requirements.txt, enough for every benchmark of this project's code, lacks it)."""
    import importlib.metadata
    import os
    import platform

    try:
        transformers = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        transformers = None
    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "gpu": gpu, "torch": torch.__version__, "transformers": transformers,
            "python": platform.python_version(), "load_average": os.getloadavg()}


def transformers_missing(what: str) -> str | None:
    """None where transformers can be imported, else a line saying that `what` needs it and how to
    get it (it is a test-only reference, in requirements-dev.txt, not requirements.txt)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return (f"{what} needs Hugging Face transformers, which is not installed: "
                f"pip install -r requirements-dev.txt (or pip install transformers)")
    return None


def read_prompts(path: Path) -> list[list[int]]:
    """The prompts of a text file, one per line, as token ids (before any model is loaded, so a
    missing file or tokenizer fails fast)."""
    try:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as e:
        sys.exit(f"error: cannot read the prompts file: {e}")
    if not texts:
        sys.exit(f"error: {path} holds no prompts (one per line)")
    try:
        return [encode(t) for t in texts]
    except RuntimeError as e:  # the tokenizer's files are missing or changed; the message says what to do
        sys.exit(f"error: {e}")
