"""Is this machine busy? Speed on a CPU depends on what else runs: with other programs keeping
the cores busy, every timing is noisy, and PyTorch's threads (one per core by default) wait for
each other at every step, so one thread is often faster. The scripts that time or train things
say so in one line, with what to do (spec_decoding_generate.py, benchmark.py, offline.train_pair).
"""

import os

import torch


def load_average() -> float | None:
    """The 1-minute load average: processes running or waiting for a core (None where the OS does
    not say)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def busy_note(threads_option: str = "--threads 1") -> str | None:
    """One line when the load average is above the number of cores (others are using them), else
    None. threads_option: how the script's user asks for one thread."""
    load, cores = load_average(), os.cpu_count() or 1
    if load is None or load <= cores:
        return None
    threads = torch.get_num_threads()
    advice = (f"try {threads_option} (PyTorch runs {threads} threads here, which wait for each other "
              f"when a core is taken)" if threads > 1 else "PyTorch already runs one thread")
    return (f"note: machine busy (load {load:.1f} on {cores} cores): timings will be noisy; {advice}")
