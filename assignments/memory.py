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
import time
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


# ------------------------------------------------------------------------------------------------
# The sandbox's own memory limit: a memory cgroup its checks' processes join
# ------------------------------------------------------------------------------------------------

DEFAULT_SANDBOX_BYTES = 2 * 2**30  # at most; never more than half of what the grader may use
SANDBOX_OOM_SCORE_ADJ = 1000  # the out-of-memory killer's first choice: a check's process, never the grader


def default_sandbox_limit() -> int:
    """The memory all of one check's processes may use together: DEFAULT_SANDBOX_BYTES, or half
    of the grader's own limit (its container's) or of the machine's memory, if less: the grader
    keeps the other half."""
    total = memory_limit() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(DEFAULT_SANDBOX_BYTES, total // 2)


def _mounts(fstype: str) -> list[tuple[str, str, str]]:
    """(mount point, root inside the hierarchy, super options) of each cgroup mount of `fstype`."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] == fstype:
            found.append((fields[4], fields[3], tail[2]))
    return found


def _own_cgroup(version: str, controller: str = "memory") -> Path | None:
    """This process's cgroup folder in the v2 hierarchy, or in v1's hierarchy of `controller`."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (version == "v2" and controllers == "") or (version == "v1" and controller in controllers.split(",")):
            for point, root, options in _mounts("cgroup2" if version == "v2" else "cgroup"):
                if version == "v1" and controller not in options.split(","):
                    continue
                inside = path if root == "/" else (path[len(root):] if path.startswith(root) else None)
                if inside is not None and Path(point, inside.lstrip("/")).is_dir():
                    return Path(point, inside.lstrip("/"))
    return None


class SandboxMemory:
    """A memory cgroup for one sandbox's checks (made by the grader as root, removed by close):
    its limit (memory.max in cgroup v2, memory.limit_in_bytes in v1; no swap) holds every process
    of a check together, so the kernel's out-of-memory killer ends the check, never the grader.
    The check's child joins it itself, through the file `procs` opened here (passed to the
    zygote), before any student code runs. Where none can be made (not root, no writable memory
    hierarchy, or cgroup v2 without the memory controller delegated), `folder` is None, `why_not`
    says why, and each check's process gets an address-space limit (RLIMIT_AS) instead."""

    def __init__(self, limit: int | None = None):
        self.limit = limit or default_sandbox_limit()
        self.folder, self.version, self.why_not = None, None, None
        reasons = []
        for version in ("v2", "v1"):
            try:
                self.folder = self._make(version)
                self.version = version
                return
            except (OSError, ValueError) as error:  # ValueError: a /proc file this code cannot read
                reasons.append(f"cgroup {version}: {getattr(error, 'strerror', None) or error}")
        self.why_not = "; ".join(reasons)

    def _make(self, version: str) -> Path:
        parent = _own_cgroup(version)
        if parent is None:
            raise OSError(0, "no memory hierarchy mounted")
        if version == "v2":
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in enabled:
                raise OSError(0, f"the memory controller is not enabled below {parent}")
        _remove_stale(parent)
        folder = parent / f"assignments-sandbox-{_pid_namespace()}-{os.getpid()}-{id(self):x}"
        folder.mkdir()
        try:
            if version == "v2":
                (folder / "memory.max").write_text(str(self.limit))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (folder / name).exists():
                        (folder / name).write_text(value)
            else:
                (folder / "memory.limit_in_bytes").write_text(str(self.limit))
                if (folder / "memory.memsw.limit_in_bytes").exists():
                    (folder / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
            self.procs = os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            folder.rmdir()
            raise
        return folder

    def set_limit(self, limit: int) -> None:
        """A new limit for the checks to come."""
        self.limit = limit
        if self.folder is not None:
            names = ("memory.max",) if self.version == "v2" else ("memory.memsw.limit_in_bytes",
                                                                  "memory.limit_in_bytes")
            for name in sorted(names, key=lambda n: (limit < self._read(n), n)):  # memsw never below the limit
                if (self.folder / name).exists():
                    (self.folder / name).write_text(str(limit))

    def _read(self, name: str) -> int:
        try:
            return int((self.folder / name).read_text())
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int | None:
        """How many processes the out-of-memory killer ended in the cgroup so far."""
        if self.folder is None:
            return None
        return _field(self.folder / ("memory.events" if self.version == "v2" else "memory.oom_control"), "oom_kill")

    def for_child(self) -> dict:
        """What a check's child needs (sandbox.join_memory): the procs file's descriptor (the zygote
        inherits it), or the address-space limit to set instead."""
        return {"procs_fd": self.procs if self.folder is not None else None, "limit": self.limit}

    def line(self, address_limit: bool = True) -> str:
        """One line for the grader's log: the limit, and how it holds (address_limit: whether each
        process gets RLIMIT_AS where there is no cgroup; not at level "none")."""
        if self.folder is not None:
            return f"memory: {_mib(self.limit)} for every process of a check together (a memory cgroup of its own)"
        limit = f"{_mib(self.limit)} of address space for each process of a check" if address_limit else "no limit"
        return (f"memory: {limit} (no memory cgroup could be made: {self.why_not}); the check's processes are the "
                f"out-of-memory killer's first choice")

    def describe(self) -> str:
        where = "every process of the check together" if self.folder is not None else "each process of the check"
        return f"{_mib(self.limit)} for {where}"

    def close(self) -> None:
        """Remove the cgroup (its processes are dead: the sandbox killed them)."""
        if self.folder is None:
            return
        os.close(self.procs)
        _remove_when_empty(self.folder)
        self.folder = None


def _pid_namespace() -> int:
    """This process's PID namespace (its inode): a pid means something only inside it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _remove_when_empty(folder: Path) -> None:
    """Remove a cgroup whose processes were just killed: refused until the kernel has let the last
    one go, so tried for up to five seconds."""
    for _ in range(100):
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.05)


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups a grader killed outright left (named with its PID namespace and
    pid: one of this namespace whose process is gone)."""
    for folder in parent.glob(f"assignments-sandbox-{_pid_namespace()}-*-*"):
        pid = folder.name.split("-")[3]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                folder.rmdir()  # refused while a process is in it
            except OSError:
                pass


def used_too_much_memory(limit: str) -> str:
    """The verdict of a check whose processes the out-of-memory killer ended in the sandbox's cgroup."""
    return (f"ran out of memory: your code used too much memory, and the kernel's out-of-memory killer ended the "
            f"check's processes (the limit is {limit}). Does your code build something far larger than the "
            f"inputs (a tensor per token pair, a list that keeps growing in a loop), or start processes that do?")
