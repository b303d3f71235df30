"""The weight cache: what the first load of a checkpoint in a format computed (int8 bytes and
scales, float16 or bfloat16 values, our C kernel's panels), kept as a safetensors file in the
user's cache folder, so that later loads map that file instead of computing it all again.

    ~/.cache/gpt2-spec/weights/*.safetensors   (the folder of kernels.json: gpt2/speed/kernel_cache.py,
                                                GPT2_KERNEL_CACHE and XDG_CACHE_HOME apply)
    GPT2_WEIGHT_CACHE=/path/to/folder           another folder; GPT2_WEIGHT_CACHE=0: no weight cache
    GPT2_WEIGHT_CACHE_GB=8                      the folder's size limit in GB (default DEFAULT_LIMIT_GB):
                                                past it, the files used longest ago are deleted
    python -m gpt2.speed.kernel_report --cache / --clear-cache   list / delete them

A file is named by a hash of its key: the checkpoint's content (`fingerprint`: its size, time of
change, and a hash of its header and of sampled blocks), the format, the kernel path whose layout
it holds, and the code that computes the format (`code_tag`: a hash of fast_linear.py and of the
C kernel's source, and STORAGE_VERSION). A changed checkpoint, kernel or format is a new key, so
an old file is never served for it (and ages out). Only layouts that are plain tensors are kept:
a library's packed weights (oneDNN's blocked layout, fbgemm's packed float16) are opaque objects,
packed again by each load from the kept values.

A later load memory-maps the file, one mapping per tensor (mapped pages count towards the
process's memory only once read, and a tensor dropped after packing gives its pages back).
Files are written whole to a temporary name, then renamed (a reader never sees half a file).
"""

import hashlib
import json
import mmap
import os
import struct
import sys
import time
from pathlib import Path

import numpy
import torch

from . import kernel_cache, native

# Bumped when what a file holds, or how, changes: older files are then never read.
STORAGE_VERSION = 1
DEFAULT_LIMIT_GB = 8.0
SAMPLED_BLOCKS, BLOCK_BYTES = 16, 1 << 16
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8, "U8": torch.uint8}


def folder() -> Path | None:
    """The cache folder (None: GPT2_WEIGHT_CACHE=0, no weight cache)."""
    setting = os.environ.get("GPT2_WEIGHT_CACHE", "").strip()
    if setting in ("0", "off"):
        return None
    return Path(setting).expanduser() if setting else kernel_cache.cache_path().parent / "weights"


def limit_bytes() -> int:
    """The folder's size limit (GPT2_WEIGHT_CACHE_GB, default DEFAULT_LIMIT_GB)."""
    text = os.environ.get("GPT2_WEIGHT_CACHE_GB", "")
    try:
        gb = float(text) if text else DEFAULT_LIMIT_GB
    except ValueError:
        raise ValueError(f"GPT2_WEIGHT_CACHE_GB={text!r} is not a number of GB (e.g. 8)") from None
    return int(gb * 1e9)


def fingerprint(path: Path) -> str:
    """A cheap hash of a checkpoint's content: its size and time of change, its safetensors header
    and SAMPLED_BLOCKS blocks spread over the file (about 1 MB read, whatever its size)."""
    stat = path.stat()
    digest = hashlib.sha256(f"{stat.st_size} {stat.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        header = f.read(8)
        digest.update(header + f.read(struct.unpack("<Q", header)[0] if len(header) == 8 else 0))
        for i in range(SAMPLED_BLOCKS):
            f.seek(stat.st_size * i // SAMPLED_BLOCKS)
            digest.update(f.read(BLOCK_BYTES))
    return digest.hexdigest()[:32]


def code_tag() -> str:
    """A hash of the code that computes what a file holds (the formats' arithmetic in
    fast_linear.py, our C kernel's panels) and STORAGE_VERSION."""
    source = (Path(__file__).parent / "fast_linear.py").read_bytes()
    return hashlib.sha256(source + native.source_tag().encode() + str(STORAGE_VERSION).encode()).hexdigest()[:12]


def key(checkpoint: Path, fmt: str, dtype, path: str | None) -> dict:
    """What a file's content depends on."""
    return {"checkpoint": fingerprint(checkpoint), "file": str(checkpoint.resolve()), "format": fmt,
            "dtype": str(dtype).removeprefix("torch."), "kernel": path, "code": code_tag()}


def file_for(key_: dict) -> Path | None:
    where = folder()
    if where is None:
        return None
    name = hashlib.sha256(json.dumps({k: v for k, v in key_.items() if k != "file"}, sort_keys=True).encode())
    return where / f"{name.hexdigest()[:24]}.safetensors"


# Every tensor's bytes start at a multiple of this in the file: a page, so that each maps on its
# own, and aligned as the kernels' vector loads expect of memory PyTorch allocates.
ALIGN = mmap.ALLOCATIONGRANULARITY
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def write_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write tensors as a safetensors file whose tensors each start at a multiple of ALIGN (the
    gaps filled by uint8 padding tensors named "pad:N", as the format allows no holes)."""
    header, order, offset = {"__metadata__": metadata}, [], 0
    for i, (name, tensor) in enumerate(tensors.items()):
        if offset % ALIGN:
            pad = ALIGN - offset % ALIGN
            header[f"pad:{i}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
            order.append(torch.zeros(pad, dtype=torch.uint8))
            offset += pad
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        order.append(tensor)
        offset += size
    text = json.dumps(header).encode()
    text += b" " * ((-(8 + len(text))) % ALIGN)  # the data then starts at a multiple of ALIGN too
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for tensor in order:
            f.write(tensor.contiguous().view(-1).view(torch.uint8).numpy().data)


def read_header(path: Path) -> tuple[dict, int]:
    """(the safetensors header, where its data starts)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(size)), 8 + size


def map_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, each a memory map of its own bytes (copy-on-write, so a
    tensor may be written without changing the file)."""
    header, start = read_header(path)
    tensors = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            if name == "__metadata__" or name.startswith("pad:"):
                continue
            begin, end = (start + o for o in info["data_offsets"])
            aligned = begin - begin % mmap.ALLOCATIONGRANULARITY
            if end == begin:
                tensors[name] = torch.empty(info["shape"], dtype=DTYPES[info["dtype"]])
                continue
            mapped = mmap.mmap(f.fileno(), end - aligned, offset=aligned, access=mmap.ACCESS_COPY)
            # (numpy's array keeps the mapping alive as long as the tensor: torch.frombuffer does not)
            raw = torch.from_numpy(numpy.frombuffer(mapped, numpy.uint8, count=end - begin, offset=begin - aligned))
            tensors[name] = raw.view(DTYPES[info["dtype"]]).view(info["shape"])
    return tensors


def lookup(key_: dict) -> tuple[dict[str, dict[str, torch.Tensor]], Path] | None:
    """({parameter name: {layout: tensor}}, the file) kept for key_, memory-mapped; None if there
    is none (or it cannot be read: it is then deleted, with one line saying so)."""
    path = file_for(key_)
    if path is None or not path.is_file():
        return None
    try:
        header, _ = read_header(path)
        kept = json.loads(header.get("__metadata__", {}).get("key", "null")) or {}
        if {k: v for k, v in kept.items() if k != "file"} != {k: v for k, v in key_.items() if k != "file"}:
            return None  # (a hash collision, or a file renamed by hand)
        tensors = map_file(path)
    except (OSError, ValueError, KeyError, struct.error) as e:
        print(f"note: the weight cache file {path} could not be read ({type(e).__name__}: {e}); it is "
              f"deleted and computed again", file=sys.stderr, flush=True)
        path.unlink(missing_ok=True)
        return None
    os.utime(path)  # used now: the eviction keeps it longest
    layouts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        param, layout = name.rsplit(":", 1)
        layouts.setdefault(param, {})[layout] = tensor
    return layouts, path


def store(key_: dict, layouts: dict[str, dict[str, torch.Tensor]]) -> Path | None:
    """Keep {parameter name: {layout: tensor}} for key_ (written whole, then renamed), then evict
    the files used longest ago past the size limit. None where there is no cache or it cannot be
    written (one line says why; the load goes on)."""
    path = file_for(key_)
    if path is None or not layouts:
        return None
    tensors = {f"{name}:{layout}": t.contiguous() for name, held in layouts.items() for layout, t in held.items()}
    about = {"key": json.dumps(key_, sort_keys=True), "about": "gpt2-spec weight cache (gpt2/speed/weight_cache.py)"}
    try:
        kernel_cache.write_atomically(path, lambda temporary: write_file(temporary, tensors, about))
    except OSError as e:
        print(f"note: could not keep the computed weights in {path.parent} ({type(e).__name__}: "
              f"{e.strerror or e}); the next load computes them again", file=sys.stderr, flush=True)
        return None
    evict(keep=path)
    return path


def entries() -> list[dict]:
    """The cache's files, most recently used first: {path, bytes, used (time), key}."""
    where = folder()
    found = []
    for path in sorted(where.glob("*.safetensors")) if where is not None and where.is_dir() else []:
        try:
            header, _ = read_header(path)
            key_ = json.loads(header.get("__metadata__", {}).get("key", "null"))
            stat = path.stat()
        except (OSError, ValueError, struct.error):
            key_, stat = None, path.stat()
        found.append({"path": path, "bytes": stat.st_size, "used": stat.st_mtime, "key": key_})
    return sorted(found, key=lambda e: -e["used"])


def evict(keep: Path | None = None) -> list[Path]:
    """Delete the files used longest ago until the folder is within the size limit (never `keep`,
    the file just written). Returns the deleted files."""
    files, limit, deleted = entries(), limit_bytes(), []
    total = sum(e["bytes"] for e in files)
    for entry in reversed(files):
        if total <= limit:
            break
        if entry["path"] != keep:
            entry["path"].unlink(missing_ok=True)
            total -= entry["bytes"]
            deleted.append(entry["path"])
    return deleted


def clear() -> list[dict]:
    """Delete every file of the cache; returns their entries."""
    files = entries()
    for entry in files:
        entry["path"].unlink(missing_ok=True)
    return files


def describe(entry: dict) -> str:
    """One line for the report: size, last use, format, kernel, checkpoint."""
    key_ = entry["key"] or {}
    used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["used"]))
    return (f"{entry['bytes'] / 1e9:6.2f} GB  used {used}  {key_.get('format', '?')} ({key_.get('kernel') or 'no kernel'})"
            f"  {key_.get('file', '?')}  {entry['path'].name}")
