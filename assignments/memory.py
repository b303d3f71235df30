"""Whether a check's process ran out of memory, and the limit it ran into, from the kernel's own
counters (read by the grader: a process killed for memory cannot say so itself).

Two ways a check runs out of memory:
- an allocation fails (an address-space limit, RLIMIT_AS, or no memory left): Python raises
  MemoryError, torch a RuntimeError "can't allocate memory"; the check's process explains it
  (runner.explain -> out_of_memory);
- the kernel's out-of-memory killer sends SIGKILL (a container's memory limit, as on Gradescope,
  or the machine's memory): the process sends nothing back. The grader blames memory only when
  both say so: the check's process died of SIGKILL (the grader sends none before a child exits
  by itself), and the kill counter of the memory cgroups the check runs in (the grader's own and
  its parents': the check's process is in them) went up meanwhile. The machine's counter
  (/proc/vmstat) is never read: it counts every process of the machine, so another program's
  out-of-memory kill would be blamed on the student.
"""

import os
import resource
import signal
from pathlib import Path

NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a number near 2**63


def _memory_cgroups() -> list[Path]:
    """The memory cgroup folders of this process, its own first, then its ancestors (v2 or v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy
            root = Path("/sys/fs/cgroup")
            if not (root / "memory.max").exists() and not (root / path.lstrip("/") / "memory.max").exists():
                continue
        elif "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
        else:
            continue
        parts = Path(path.lstrip("/")).parts
        for i in range(len(parts), -1, -1):  # own cgroup, then up (a container sees itself as the root)
            folder = root.joinpath(*parts[:i])
            if folder.is_dir() and folder not in folders:
                folders.append(folder)
    return folders


def _field(path: Path, name: str) -> int | None:
    """The number after `name` in a "key value" file (memory.events, memory.oom_control, vmstat)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def oom_kills() -> tuple:
    """How many processes the out-of-memory killer has ended so far in each of this process's
    memory cgroups (cgroup v1 counts a kill only in the cgroup it happened in); None where a
    cgroup has no counter. Compare two readings with oom_killed_between."""
    return tuple(_field(folder / events, "oom_kill") for folder in _memory_cgroups()
                 for events in ("memory.events", "memory.oom_control"))


def oom_killed_between(before: tuple, after: tuple) -> bool:
    """Whether the out-of-memory killer ended a process between the two readings."""
    return any(a is not None and b is not None and a > b for b, a in zip(before, after))


def silent_end(exit_code: int | None, before: tuple, after: tuple) -> str:
    """The verdict of a check whose process ended without an answer. exit_code: as subprocess
    gives it (-9: SIGKILL); before, after: oom_kills() around the check."""
    if exit_code == -signal.SIGKILL:
        if oom_killed_between(before, after):
            return killed_for_memory()
        if not any(count is not None for count in after):  # no memory cgroup to ask
            return (f"the process was killed (SIGKILL) before the check could report: the kernel's out-of-memory "
                    f"killer does that when memory runs out ({describe_limit()}), or did your code kill itself?")
    return ("the process ended before the check could report: did your code call exit(), "
            "kill itself or crash Python?")


def memory_limit() -> int | None:
    """The smallest memory limit (bytes) on this process's cgroups, else None (the machine's
    memory is the limit)."""
    limits = []
    for folder in _memory_cgroups():
        for name in ("memory.max", "memory.limit_in_bytes"):
            try:
                text = (folder / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < NO_LIMIT:
                limits.append(int(text))
    return min(limits) if limits else None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def describe_limit(limit: int | None = None) -> str:
    """The limit in words: this container's, an address-space limit, or the machine's memory."""
    limit = memory_limit() if limit is None else limit
    if limit is not None:
        return f"the memory limit is {_mib(limit)} for the grader and every check together"
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"each check's process may use at most {_mib(soft)} of address space"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return f"no memory limit was set: the machine's {_mib(total)} ran out"


def killed_for_memory(limit: int | None = None) -> str:
    """The verdict of a check whose process the out-of-memory killer ended."""
    return (f"ran out of memory: the kernel's out-of-memory killer ended the check's process "
            f"({describe_limit(limit)}). Does your code build something far larger than the inputs "
            f"(a tensor per token pair, a list that keeps growing in a loop)?")


def out_of_memory(error: BaseException) -> str | None:
    """The message for an allocation that failed in the check's process, or None when `error`
    is not one."""
    text = str(error)
    if not (isinstance(error, MemoryError) or "can't allocate memory" in text or "out of memory" in text.lower()):
        return None
    first = text.splitlines()[0][:300] if text else type(error).__name__
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)  # the limit an allocation hits first
    limit = (f"each check's process may use at most {_mib(soft)} of address space"
             if soft != resource.RLIM_INFINITY else describe_limit())
    return (f"ran out of memory ({limit}): {type(error).__name__}: {first}. Does your code "
            f"build something far larger than the inputs (a tensor per token pair, a list that keeps "
            f"growing in a loop)?")
