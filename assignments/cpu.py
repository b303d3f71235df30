"""The CPU share of one sandbox's checks, set by the grader: a cpu cgroup of the sandbox's own.

The scheduler shares the CPU between runnable processes, so a check that starts a hundred
spinning processes would take a hundred times the CPU of an honest check graded beside it (a
--jobs batch). Kernels with autogroup scheduling share by session instead, which happens to be
fair to the check (its child starts a session of its own), but autogroup is a kernel setting the
grader does not control. So every check's processes join their sandbox's cpu cgroup before any
student code runs, and sibling cgroups of equal weight share the CPU equally, however many
processes each holds: cgroup v2's cpu.weight (in the sandbox's one cgroup, the memory cgroup of
memory.SandboxMemory) or cgroup v1's cpu.shares (a cgroup in the cpu hierarchy). Where neither
can be made (not root, no cpu controller delegated), `why_not` says why and the share is left to
the kernel (autogroup, where it is on).
"""

import os

from .memory import _own_cgroup, _pid_namespace, _remove_stale, _remove_when_empty

WEIGHT_V2, SHARES_V1 = 100, 1024  # the default weights: every sandbox alike


class SandboxCPU:
    """The CPU weight of one sandbox (module docstring). memory: the sandbox's SandboxMemory (in
    cgroup v2 its folder is the one cgroup a check's processes are in). for_child() is what the
    check's child needs to join (sandbox.join_cpu); close() removes a cgroup made here."""

    def __init__(self, memory):
        self.folder, self.procs, self.made, self.why_not = None, None, False, None
        if memory.folder is not None and memory.version == "v2":
            weight = memory.folder / "cpu.weight"
            if weight.exists():  # the cpu controller is enabled below the grader's cgroup
                weight.write_text(str(WEIGHT_V2))
                self.folder = memory.folder  # joined with the memory cgroup
                return
            self.why_not = f"cgroup v2: the cpu controller is not enabled below {memory.folder.parent}"
            return
        try:
            self._make_v1()
        except OSError as error:
            self.why_not = f"cgroup v1: {error.strerror or error}"

    def _make_v1(self) -> None:
        parent = _own_cgroup("v1", "cpu")
        if parent is None or not (parent / "cpu.shares").exists():
            raise OSError(0, "no cpu hierarchy mounted")
        _remove_stale(parent)
        folder = parent / f"assignments-sandbox-{_pid_namespace()}-{os.getpid()}-{id(self):x}"
        folder.mkdir()
        try:
            (folder / "cpu.shares").write_text(str(SHARES_V1))
            self.procs = os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            folder.rmdir()
            raise
        self.folder, self.made = folder, True

    def for_child(self) -> dict | None:
        """The descriptor of the cgroup's procs file, for the child to join (v1); None where the
        memory cgroup's join puts it there too (v2), or where there is none."""
        return {"procs_fd": self.procs} if self.procs is not None else None

    def line(self) -> str:
        """One line for the grader's log."""
        if self.folder is not None:
            return "cpu: every sandbox's processes share one equal weight (a cpu cgroup of its own)"
        return f"cpu: the share of each check is left to the kernel (no cpu cgroup could be made: {self.why_not})"

    def close(self) -> None:
        """Remove the cgroup made here (its processes are dead: the sandbox killed them)."""
        if not self.made:
            return
        os.close(self.procs)
        _remove_when_empty(self.folder)
        self.made, self.folder, self.procs = False, None, None
