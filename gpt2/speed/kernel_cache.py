"""Choices measured once per machine and kept in the user's cache folder: which kernel runs a
weight shape fastest, which weight format dtype="auto" loads, or any other "which is faster here"
decision (a compiled decode step, say), and what gamma="auto" decides from (spec_decoding/costs.py's
CostModel.kept_for). Later runs read the choice instead of timing again, so the same machine runs
the same kernels every time, loading takes no time to decide, and a seeded run repeats its tokens.

    ~/.cache/gpt2-spec/kernels.json        ($XDG_CACHE_HOME/gpt2-spec/kernels.json where set)
    GPT2_KERNEL_CACHE=/path/to/file.json    another file (the tests use a temporary one)
    python -m gpt2.speed.kernel_report --remeasure   forget this machine's choices and measure again

A choice is kept under the machine it was measured on: the CPU's name and vector flags, the
switches that make PyTorch act as another CPU (GPT2_CPU, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA),
the torch version and the number of threads. Anything else a choice depends on (the weight shape,
the format, which kernels work here) is its `what`, given by the caller.

    decide_once("kernels", {"shape": [5120, 1280], ...}, measure, "which kernel ...")
        -> the kept value, or measure()'s (said in one line, then kept)

The file is JSON, readable by hand. It is written whole to a temporary file and renamed over the
old one, so a reader never sees half a file; a file that cannot be read is moved aside (never
overwritten) with one line saying so, and its choices are measured again.
"""

import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from .machine_load import load_average

# Bumped when the meaning of a kept value changes: older entries are then ignored.
VERSION = 1
EMULATION_SWITCHES = ("GPT2_CPU", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")

# This process's choices, by (file, entry key): what was read or measured here holds for the
# whole process, even where the file cannot be written.
_KEPT: dict[tuple[str, str], object] = {}


def cache_path() -> Path:
    """The cache file: GPT2_KERNEL_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/gpt2-spec/kernels.json."""
    if os.environ.get("GPT2_KERNEL_CACHE"):
        return Path(os.environ["GPT2_KERNEL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "gpt2-spec" / "kernels.json"


def shown_path() -> str:
    """cache_path() with the home folder written as ~, for messages."""
    path, home = str(cache_path()), str(Path.home())
    return "~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo; "" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The CPU's vector-instruction flags that matter here (from /proc/cpuinfo; [] elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ()
    return tuple(sorted(f for f in set(flags) if f in ("avx2", "fma", "f16c", "avx_ne_convert", "avx_vnni")
                        or f.startswith(("avx512", "amx"))))


def machine() -> dict:
    """What identifies this machine for a measured choice (a choice measured under other values
    does not hold here)."""
    return {"cpu": cpu_name() or "unknown", "flags": " ".join(cpu_flags()),
            "emulation": {k: os.environ[k] for k in EMULATION_SWITCHES if os.environ.get(k)},
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def entry_key(kind: str, what: dict) -> str:
    """One string for (this machine, kind, what): equal keys, same choice."""
    return json.dumps({"version": VERSION, "machine": machine(), "kind": kind, "what": what}, sort_keys=True)


def lookup(kind: str, what: dict):
    """The value kept for (this machine, kind, what), or None."""
    key = entry_key(kind, what)
    if (str(cache_path()), key) in _KEPT:
        return _KEPT[str(cache_path()), key]
    for entry in read_entries():
        if entry.get("key") == key:
            _KEPT[str(cache_path()), key] = entry["value"]
            return entry["value"]
    return None


def store(kind: str, what: dict, value) -> None:
    """Keep value (anything JSON can hold) for (this machine, kind, what), in this process and in
    the file. A file that cannot be written costs one line: the choice then holds for this process."""
    key = entry_key(kind, what)
    _KEPT[str(cache_path()), key] = value
    entries = [e for e in read_entries() if e.get("key") != key]
    entries.append({"key": key, "kind": kind, "what": what, "value": value,
                    "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    write_entries(entries)


def decide_once(kind: str, what: dict, measure, about: str) -> tuple[object, bool]:
    """(value, measured now): the value kept for (this machine, kind, what), or, if there is none,
    measure()'s, measured now (one line on stderr says what and where it is kept) and kept."""
    value = lookup(kind, what)
    if value is not None:
        return value, False
    print(f"measuring {about} on this machine, once: the choice is kept in {shown_path()} "
          f"(python -m gpt2.speed.kernel_report --remeasure measures again){busy_note()}", file=sys.stderr, flush=True)
    value = measure()
    store(kind, what, value)
    return value, True


def busy_note() -> str:
    """"; the machine is busy ..." when its load average is above its core count (other work then
    slows the timed kernels unevenly, and the kept choice may not be the fastest), else ""."""
    load, cores = load_average(), os.cpu_count() or 1
    return (f"; the machine is busy (load average {load:.1f} on {cores} cores), so the timings may mislead: "
            f"remeasure when it is quieter" if load is not None and load > cores else "")


def forget(kind: str | None = None) -> list[dict]:
    """Remove this machine's entries (of one kind, or all) from the file and this process; returns
    them (their kind and what, to measure again)."""
    entries = read_entries()
    mine = [e for e in entries_here(entries) if kind is None or e.get("kind") == kind]
    for entry in mine:
        _KEPT.pop((str(cache_path()), entry["key"]), None)
    if mine:
        write_entries([e for e in entries if e not in mine])
    return mine


def entries_here(entries: list[dict] | None = None) -> list[dict]:
    """This machine's entries in the file (or in entries)."""
    here = machine()
    return [e for e in (read_entries() if entries is None else entries) if json.loads(e["key"])["machine"] == here]


def read_entries() -> list[dict]:
    """The file's entries of this VERSION ([] if there is no file). A file that cannot be read as
    one is moved aside to NAME.unreadable, with one line saying so, and counts as empty."""
    path = cache_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = data["entries"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "key" in e and "value" in e
                                                    for e in entries):
            raise ValueError("its entries are not a list of {key, value}")
        for e in entries:
            json.loads(e["key"])["machine"]  # noqa: B018 (a key that is not ours fails here)
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        aside = path.with_name(path.name + ".unreadable")
        try:
            os.replace(path, aside)
            kept = f"moved aside to {aside}"
        except OSError:
            kept = "left as it is"
        print(f"note: the kernel choice cache {path} could not be read ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''}); it was {kept}, and choices are measured "
              f"again", file=sys.stderr, flush=True)
        return []
    return [e for e in entries if json.loads(e["key"]).get("version") == VERSION]


def write_atomically(path: Path, write) -> None:
    """write(temporary) a file beside path, then rename it over path: a reader finds the old file
    or the new one whole, never half of one. An OSError goes to the caller, the temporary file
    removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_entries(entries: list[dict]) -> None:
    """Write the file whole: to a temporary file beside it, then renamed over it (atomic)."""
    path = cache_path()
    text = json.dumps({"about": "gpt2-spec: choices measured once per machine (gpt2/speed/kernel_cache.py)",
                       "entries": entries}, indent=1)
    try:
        write_atomically(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    except OSError as e:
        print(f"note: could not save the kernel choice to {path} ({type(e).__name__}: {e.strerror or e}); "
              f"it holds for this process only", file=sys.stderr, flush=True)
