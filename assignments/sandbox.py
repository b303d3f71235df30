"""The sandbox every check's child process runs in: the student's code cannot write its own grade,
read what the grader keeps from it, or outlive its check.

The grader starts one "zygote" process (assignments/zygote.py: torch imported, waiting) per
Sandbox and asks it to fork one child per check. How far the children are shut in is the best
this machine allows, `Isolation.level`:

- "namespaces": the grader runs as root and util-linux `unshare` works (a Linux machine or VM, a
  container with CAP_SYS_ADMIN). The zygote starts in new PID, mount, network, IPC and UTS
  namespaces, builds a root folder holding only the system's programs and libraries, Python and
  its packages (an installed copy of this project masked out) and the sandbox's own folder, and
  chroots into it. Each child then drops to a user of its own (`student-sandbox`, made with
  useradd if absent) before any student code runs. It sees no other process of the machine,
  no network, none of the grader's files.
- "user": root, but no namespaces (a Docker container without CAP_SYS_ADMIN, such as
  Gradescope's). Each child drops to the sandbox user: it cannot signal, trace or read the memory
  of the grader's processes, nor write any file the grader reads; it can list the machine's
  processes and read files every user can read (the exported run_autograder makes the grader's
  own root's alone). A seccomp filter (refuse_network) leaves it no socket but a Unix one, and
  after each check what the sandbox user left in the machine's shared scratch folders is removed.
- "userns": the grader is not root, but unprivileged user namespaces work (most Linux desktops).
  The zygote starts in a new user namespace as well (its root is the grader's user outside it) and
  builds the same root folder; each child then drops every capability (bounding set included, no
  new privileges), so it cannot remount, trace the zygote or undo the chroot. It runs as the
  grader's user outside the namespace, but sees no other process of the machine, no network and
  none of the grader's files, and it dies with its check: the zygote, the namespace's init,
  kills every other process in it.
- "none": the grader is not root and user namespaces do not work (switched off, or restricted by
  AppArmor). The child runs as the grader's own user; the grader says so in one line and the
  report is unofficial.

Whatever the level, a check ends the same way: when its child exits or its time is up, every
process of the sandbox user is killed (in "userns": every process of the namespace but its init;
in "none": the child's session), so nothing a check
started can write, spin or hold a pipe open after its verdict; between gradings the sandbox's
home and temporary folders are emptied, so one submission leaves nothing for the next.

Each check's child also, before any student code (enter): joins the sandbox's memory cgroup
(memory.SandboxMemory: one limit for all its processes, the out-of-memory killer's first choice)
and its cpu cgroup (cpu.SandboxCPU: one equal CPU share per sandbox, however many processes),
gets fresh tmpfs on /tmp, its home and /dev/shm in a mount namespace of its own (with namespaces),
and a new session keyring, the sandbox user's own keyrings emptied (fresh_keyrings).
"""

import ctypes
import fcntl
import json
import os
import pwd
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cpu import SandboxCPU
from .memory import SANDBOX_OOM_SCORE_ADJ, SandboxMemory, used_too_much_memory

USER = "student-sandbox"  # the unprivileged user student code runs as (one per concurrent grader: -1, -2, ...)
LEVELS = ("namespaces", "userns", "user", "none")  # best first; "userns" is for a grader that is not root
OFFICIAL = ("namespaces", "userns")  # a grade made at these levels can be trusted
UNSHARE = ["--pid", "--fork", "--mount", "--net", "--ipc", "--uts", "--propagation", "private", "--kill-child"]
USER_UNSHARE = ["--user", "--map-root-user", *UNSHARE]  # the same, for a grader that is not root
LOCKS = Path("/run/assignments-sandbox")  # root's: which sandbox users are taken (flock)
OUTPUT_HEAD, OUTPUT_TAIL = 6000, 2000  # characters of a child's output kept (start and end)
MAX_VALUES_BYTES = 16 * 2**20  # a probe's answer larger than this is refused
MAX_PROCESSES = 512  # a child's RLIMIT_NPROC (counts threads): stops a fork bomb, not torch
MAX_FILE_BYTES = 256 * 2**20  # RLIMIT_FSIZE: a file written in the sandbox's folders


@dataclass
class Isolation:
    """How the student's code is shut in (module docstring), and why not better."""

    level: str
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    why_not: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the printed report."""
        why = "; ".join(self.why_not)
        if self.level == "namespaces":
            return (f"sandbox: the student's code ran as user {self.user}, in its own PID, mount and network "
                    f"namespaces, seeing only its copy")
        if self.level == "userns":
            return ("sandbox: the student's code ran in its own user, PID, mount and network namespaces, with no "
                    "capabilities (your own user outside them), seeing only its copy")
        if self.level == "user":
            return (f"sandbox: the student's code ran as user {self.user}, without namespaces ({why}): it could "
                    f"list this machine's processes and read its world-readable files")
        return f"NOT ISOLATED: the student's code ran as your own user ({why})"

    def to_json(self) -> dict:
        return {"level": self.level, "user": self.user, "why_not": self.why_not, "line": self.line()}


def detect(requested: str = "auto", python: str = sys.executable) -> Isolation:
    """The best isolation this machine allows, or the `requested` level if it allows that.
    Claims a sandbox user (see claim_user) for the levels that use one."""
    from .definition import AssignmentError

    if requested not in ("auto", *LEVELS):
        raise AssignmentError(f"sandbox level {requested!r}: one of auto, {', '.join(LEVELS)}")
    allowed, refused = _levels(python, requested)
    level = allowed[0] if requested == "auto" else requested
    if level not in allowed:
        raise AssignmentError(f"cannot sandbox at level {requested!r} here: {refused[requested]}")
    own = ("namespaces", "user") if os.geteuid() == 0 else ("userns",)  # the levels a grader like this one has
    why = list(dict.fromkeys(refused[better] for better in LEVELS[:LEVELS.index(level)] if better in refused
                             and better in own))
    if level != allowed[0]:
        why.append(f"level {requested!r} was asked for")
    if level == "user":
        why += [f"an installed copy of this project ({copy}) is readable by it" for copy in installed_copies(python)]
    isolation = Isolation(level, why_not=why)
    if level in ("namespaces", "user"):
        isolation.user, isolation.uid, isolation.gid = claim_user()
    return isolation


def _levels(python: str, requested: str) -> tuple[list[str], dict[str, str]]:
    """The levels this machine allows, best first, and why it refuses the others."""
    refused = {}
    if os.geteuid() == 0:
        refused["userns"] = "it is for a grader that is not root (as root, level 'namespaces' gives each check a user of its own)"
        if not namespaces_work():
            refused["namespaces"] = "`unshare --pid --mount --net` does not work here (no CAP_SYS_ADMIN?)"
        if "namespaces" in refused or requested == "user":
            blocked = unreadable_python(python)
            if blocked:
                refused["user"] = f"{blocked} cannot be read by other users, so no sandbox user could run Python"
    else:
        not_root = "the grader is not running as root: run it as root (e.g. in a container) to sandbox it"
        refused["namespaces"] = refused["user"] = not_root
        why = user_namespaces_refused()
        if why:
            refused["userns"] = f"the grader is not root, and {why}"
    return [level for level in LEVELS if level not in refused], refused


_NAMESPACES_WORK = None


def namespaces_work() -> bool:
    global _NAMESPACES_WORK
    if _NAMESPACES_WORK is None:
        unshare = shutil.which("unshare", path=SYSTEM_PATH)
        try:
            _NAMESPACES_WORK = unshare is not None and subprocess.run(
                [unshare, *UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _NAMESPACES_WORK = False
    return _NAMESPACES_WORK


_USER_NAMESPACES_REFUSED = None


def user_namespaces_refused() -> str | None:
    """Why a grader that is not root cannot build the "userns" sandbox here, or None if it can
    (util-linux `unshare` makes the namespaces and mounts a fresh /proc in them)."""
    global _USER_NAMESPACES_REFUSED
    if _USER_NAMESPACES_REFUSED is None:
        _USER_NAMESPACES_REFUSED = _try_user_namespaces() or ""
    return _USER_NAMESPACES_REFUSED or None


def _try_user_namespaces() -> str | None:
    unshare = shutil.which("unshare", path=SYSTEM_PATH)
    if unshare is None:
        return "util-linux `unshare` is not installed"
    try:
        done = subprocess.run([unshare, *USER_UNSHARE, "--mount-proc", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`unshare --user` failed ({error})"
    if done.returncode == 0:
        return None
    for setting, off, what in (("user/max_user_namespaces", "0", "user namespaces are switched off"),
                               ("kernel/unprivileged_userns_clone", "0", "unprivileged user namespaces are switched off"),
                               ("kernel/apparmor_restrict_unprivileged_userns", "1",
                                "AppArmor restricts unprivileged user namespaces")):
        try:
            if Path("/proc/sys", setting).read_text().strip() == off:
                return f"{what} (sysctl {setting.replace('/', '.')} = {off})"
        except OSError:
            pass
    error = done.stderr.decode(errors="replace").strip().splitlines()
    return f"`unshare --user --map-root-user --pid --mount` does not work here ({error[-1] if error else done.returncode})"


def unreadable_python(python: str) -> str | None:
    """The first folder of the interpreter's installation (its program, the folders its imports
    come from) that other users cannot enter, if any."""
    for path in [Path(os.path.realpath(python)).parent, *map(Path, interpreter_path(python))]:
        for folder in [path, *path.parents]:
            if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH:
                return str(folder)
    return None


_CLAIMED: dict[str, int] = {}  # user name -> the lock file held while this process uses it


def claim_user() -> tuple[str, int, int]:
    """A sandbox user no other grader on this machine is using (flock on a root-only file, held
    until release_user): every process of that user may then be killed at the end of a check.
    Made with useradd when absent."""
    LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(LOCKS, 0o700)
    for slot in range(64):
        name = USER if slot == 0 else f"{USER}-{slot}"
        if name in _CLAIMED:
            continue
        fd = os.open(LOCKS / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid, gid = _user_ids(name, slot)
        if uid in (0, os.getuid()):
            raise OSError(f"the sandbox user {name} has the grader's user id {uid}")
        _CLAIMED[name] = fd
        kill_processes_of(uid)  # left by a grader that was killed itself
        return name, uid, gid
    raise OSError("64 graders are running on this machine already")


SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _user_ids(name: str, slot: int) -> tuple[int, int]:
    """The user's ids: made with useradd when absent; where there is no useradd, a user id no
    account has (a number is all setuid needs)."""
    try:
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        pass
    useradd = shutil.which("useradd", path=SYSTEM_PATH)
    if useradd:
        subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", "--comment", "runs students' code for the grader", name],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    uid = 64000 + slot
    while _has_account(uid):
        uid += 64
    return uid, uid


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def release_user(name: str) -> None:
    fd = _CLAIMED.pop(name, None)
    if fd is not None:
        os.close(fd)


# ------------------------------------------------------------------------------------------------
# Killing: every process of the sandbox user
# ------------------------------------------------------------------------------------------------

def processes_of(uid: int) -> list[int]:
    """Live processes with `uid` as their real, effective, saved or filesystem user id."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uids = {int(u) for u in fields.get("Uid", "").split()}
        dead = fields.get("State", "").strip().startswith(("Z", "X")) and fields.get("Threads", "1").strip() == "1"
        if uid in uids and not dead:
            found.append(int(entry.name))
    return found


def kill_processes_of(uid: int) -> int:
    """SIGKILL every process of `uid` until none is left (a process that forks while it is being
    killed is caught on the next pass); the number killed."""
    if uid in (0, os.getuid()):
        raise ValueError(f"refusing to kill every process of user {uid} (root's or the grader's own)")
    killed = set()
    for attempt in range(1000):
        alive = processes_of(uid)
        if not alive:
            return len(killed)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.001 * min(attempt + 1, 20))
    raise OSError(f"processes of user {uid} kept appearing after 1,000 rounds of killing")


# ------------------------------------------------------------------------------------------------
# The child's side (in the zygote): the root folder, dropping privileges
# ------------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 4, 24, 28, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECURE_NOROOT_ALL = 0xEF  # securebits: no capabilities for uid 0, none kept, fixed up or raised ambient; locked
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWIPC, CLONE_NEWNS = 0x08000000, 0x00020000


def _call(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _call(_libc.mount(enc(source), enc(str(target)), enc(fstype), flags, enc(data)), f"mount {source} on {target}")


def build_root(spec: dict) -> None:
    """In the zygote (root, in its own mount namespace): mount the sandbox's root folder and chroot
    into it. spec (root_spec): the folders bound read-only, those bound writable, the masks
    (installed copies of the project, shown empty), symlinks to recreate."""
    new = spec["root"]
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m")
    # In a user namespace the flags of a mount made outside it are locked: a remount must keep them.
    kept = _mount_flags if spec.get("userns") else (lambda path: 0)

    for link, target in spec["symlinks"]:
        os.symlink(target, new + link)
    for source, target, read_only, recursive in spec["binds"]:
        os.makedirs(new + target, exist_ok=True)
        _mount(source, new + target, None, MS_BIND | (MS_REC if recursive else 0))
        _mount(None, new + target, None,
               MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0) | kept(source))
    for path in spec["masks"]:
        if os.path.isdir(new + path):
            _mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=755,size=4k")
        else:
            _mount("/dev/null", new + path, None, MS_BIND)
    os.makedirs(new + "/proc", exist_ok=True)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's
    os.makedirs(new + "/dev", exist_ok=True)
    _mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for device in ("null", "zero", "full", "random", "urandom"):
        Path(new, "dev", device).touch()
        _mount(f"/dev/{device}", f"{new}/dev/{device}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{new}/dev/{name}")
    os.makedirs(new + "/dev/shm")
    _mount(spec["tmp"], new + "/dev/shm", None, MS_BIND)
    os.chroot(new)
    os.chdir("/")


def _mount_flags(path: str) -> int:
    """The flags of the mount `path` is on (read-only, noexec, atime...), as mount(2) takes them."""
    flags = os.statvfs(path).f_flag
    pairs = ((os.ST_RDONLY, MS_RDONLY), (os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
             (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
             (os.ST_RELATIME, MS_RELATIME))
    return sum(ms for st, ms in pairs if flags & st)


def drop_capabilities() -> None:
    """In "userns", where the child is root inside its user namespace: give up every capability
    for good (effective, permitted, inheritable, ambient, the bounding set; uid 0 gets none back
    on exec), so it cannot remount the read-only folders, leave the chroot or trace the zygote."""
    _call(_libc.prctl(PR_SET_SECUREBITS, SECURE_NOROOT_ALL, 0, 0, 0), "prctl(SET_SECUREBITS)")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) if os.path.exists(
        "/proc/sys/kernel/cap_last_cap") else 63
    for capability in range(last + 1):
        _call(_libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), f"prctl(CAPBSET_DROP, {capability})")
    _call(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(CAP_AMBIENT_CLEAR_ALL)")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    nothing = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice 32 bits each
    _call(_libc.capset(header, nothing), "capset")


def capabilities_left() -> list[str]:
    """The capability sets of this process that are not empty (/proc/self/status)."""
    sets = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("Cap"))
    return [name for name, value in sets.items() if int(value, 16)]


def enter(config: dict, tree: str, keep_fds: tuple[int, ...]) -> None:
    """In a check's child, before any student code: its cwd, its memory limit, fresh scratch
    folders and keyrings, its own IPC namespace, limits, then the sandbox user's ids for good
    (root's cannot come back: no setuid programs either), or in "userns" no capabilities for good."""
    os.chdir(tree)
    join_memory(config.get("memory"), address_limit=config["level"] != "none")
    join_cpu(config.get("cpu"))
    for fd in _open_fds():  # nothing of the zygote's: only stdin/stdout/stderr and the answer pipe
        if fd > 2 and fd not in keep_fds:
            try:
                os.close(fd)
            except OSError:
                pass
    if config["level"] == "none":
        fresh_keyrings(clear_user=False)  # the user's keyrings are the grader's own: left alone
        return
    _libc.unshare(CLONE_NEWIPC)  # shared memory and queues of its own (fails harmlessly without namespaces)
    if config["level"] in ("namespaces", "userns"):
        fresh_scratch(config["spec"], config["uid"], config["gid"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    if config["level"] == "userns":
        drop_capabilities()
        _call(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        os.umask(0o077)
        if capabilities_left():
            os._exit(111)
        fresh_keyrings(clear_user=_user_keyrings_per_namespace())
        return
    os.setgroups([])
    os.setgid(config["gid"])
    os.setuid(config["uid"])  # as root: real, effective and saved ids
    _call(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    if config["level"] == "user":  # no network namespace: no socket but a Unix one
        refuse_network()
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # its own /proc/self stays its own
    os.umask(0o077)
    if os.getuid() != config["uid"] or os.geteuid() != config["uid"] or _can_become_root():
        os._exit(111)
    fresh_keyrings(clear_user=True)


# seccomp: the child's sockets (level "user", which has no network namespace)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
EACCES, EPERM = 13, 1
AF_UNIX = 1
# (audit arch, socket(2), io_uring_setup(2)) by machine: io_uring can open sockets without socket(2)
_NETWORK_SYSCALLS = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def network_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The seccomp program (BPF: code, jump if true, jump if false, k) that refuses every socket
    but a Unix one (socket(2) fails with EACCES), io_uring, and every call of another ABI (32-bit
    or x32 calls on a 64-bit kernel could reach socketcall); None for a machine it does not know."""
    if machine not in _NETWORK_SYSCALLS:
        return None
    arch, socket_nr, io_uring = _NETWORK_SYSCALLS[machine]
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    deny, allow = SECCOMP_RET_ERRNO | EACCES, SECCOMP_RET_ALLOW
    return [
        (load, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, SECCOMP_RET_ERRNO | EPERM),  # another ABI: nothing
        (load, 0, 0, 0),  # seccomp_data.nr
        (jge, 5, 0, X32_SYSCALL_BIT),  # -> deny
        (jeq, 4, 0, io_uring),  # -> deny
        (jeq, 0, 2, socket_nr),  # -> load the domain, else allow
        (load, 0, 0, 16),  # seccomp_data.args[0], its low 32 bits (little-endian)
        (jeq, 0, 1, AF_UNIX),  # a Unix socket -> allow, else deny
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
    ]


def refuse_network() -> bool:
    """In a check's child, after no_new_privs and before any student code: only Unix sockets from
    now on, for it and every process it starts (network_filter; a seccomp filter cannot be
    removed). False where this machine's architecture is not known here (documented)."""
    program = network_filter(os.uname().machine)
    if program is None:
        return False
    filters = (_SockFilter * len(program))(*[_SockFilter(*row) for row in program])
    fprog = _SockFprog(len(program), filters)
    _call(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(SET_SECCOMP)")
    return True


def join_memory(memory: dict | None, address_limit: bool = True) -> None:
    """In a check's child: become the out-of-memory killer's first choice (oom_score_adj), and
    join the sandbox's memory cgroup (memory.SandboxMemory; writing 0 to its cgroup.procs moves
    the writer), or, where there is none (and address_limit: not at level "none", the student's
    own run), limit this process's address space to what it has now plus the limit (each process
    the student starts inherits that)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write(str(SANDBOX_OOM_SCORE_ADJ))
    except OSError:
        pass  # no /proc: the cgroup's limit still holds
    if not memory:
        return
    if memory.get("procs_fd") is not None:
        try:
            os.write(memory["procs_fd"], b"0")
            return
        except OSError:
            os._exit(113)  # outside its memory limit no student code runs
    if not address_limit:
        return
    size = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + memory["limit"], size + memory["limit"]))


def join_cpu(cpu: dict | None) -> None:
    """In a check's child: join the sandbox's cpu cgroup (cpu.SandboxCPU, cgroup v1; in v2 the
    memory cgroup's join did), so its processes together get one sandbox's share of the CPU."""
    if cpu and cpu.get("procs_fd") is not None:
        try:
            os.write(cpu["procs_fd"], b"0")
        except OSError:
            os._exit(115)  # outside its CPU share no student code runs


SCRATCH_BYTES = 256 * 2**20  # each of a check's fresh tmpfs: /tmp, its home, /dev/shm (memory: in its limit)


def fresh_scratch(spec: dict, uid: int | None, gid: int | None) -> None:
    """In a check's child, still privileged, with namespaces: a mount namespace of its own, with a
    fresh, empty, size-capped tmpfs on /tmp, its home and /dev/shm, gone with its last process:
    nothing one check writes there is seen by the next. The folders the zygote bound under /tmp (a
    virtualenv there) are bound again on the new /tmp, through descriptors opened before it hid them."""
    _call(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    under_tmp = sorted({target for _, target, _, _ in spec["binds"] if target.startswith("/tmp/")})
    top = [t for t in under_tmp if not any(t.startswith(other + "/") for other in under_tmp)]
    kept = [(target, os.open(target, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for target in top]
    owner = f",uid={uid},gid={gid}" if uid is not None else ""
    scratch = lambda path: _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,  # noqa: E731
                                  f"mode=700,size={SCRATCH_BYTES}{owner}")
    scratch("/tmp")
    scratch("/dev/shm")
    # The folders above a bound one (a virtualenv in /tmp/tmp.X/, as .ci/run makes) must let the
    # sandbox user pass whatever umask the grader runs under (run_autograder's is 077).
    umask = os.umask(0o022)
    try:
        for target, fd in kept:
            os.makedirs(target, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            os.close(fd)
    finally:
        os.umask(umask)
    scratch(spec["home"])  # after the binds: the sandbox's own folder may be one of them


# keyctl(2) and add_key(2) by architecture (no libkeyutils needed)
_KEY_SYSCALLS = {"x86_64": (250, 248), "aarch64": (219, 217), "i686": (288, 286), "ppc64le": (271, 269),
                 "s390x": (280, 278), "riscv64": (219, 217)}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5


def keyctl(operation: int, *args) -> int:
    """keyctl(2); -1 with errno set on failure (ENOSYS where the machine has no keyrings)."""
    numbers = _KEY_SYSCALLS.get(os.uname().machine)  # (no import here: it may run as the sandbox user)
    if numbers is None:
        ctypes.set_errno(38)  # ENOSYS
        return -1
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _libc.syscall(ctypes.c_long(numbers[0]), ctypes.c_long(operation), *converted)


def fresh_keyrings(clear_user: bool) -> None:
    """In a check's child, as the user its code runs as: a new, empty session keyring of its own
    (it would otherwise share the zygote's, the grader's login session's, whose keys its
    possessor may read), and (clear_user) the user's own keyrings emptied, so no key one
    submission stored there is there for the next. A machine without keyrings (ENOSYS), or whose
    seccomp policy refuses keyctl to everyone (EPERM), has none to carry anything over."""
    if keyctl(KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        if ctypes.get_errno() not in (1, 38):  # EPERM, ENOSYS
            os._exit(114)
        return
    if clear_user:
        for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
            keyctl(KEYCTL_CLEAR, keyring)


def _user_keyrings_per_namespace() -> bool:
    """Whether the kernel keeps a user keyring per user namespace (Linux 5.3 and later): in
    "userns" the child's user keyring is then its namespace's own, and may be cleared; before,
    it is the grader's user's."""
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 3)


def _can_become_root() -> bool:
    try:
        os.setuid(0)
    except PermissionError:
        return False
    return True


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


# ------------------------------------------------------------------------------------------------
# The grader's side
# ------------------------------------------------------------------------------------------------

def project_names(root: Path) -> list[str]:
    """The project's top-level packages and modules (gpt2, spec_decoding, ...): what an installed
    copy of it holds."""
    return sorted(p.name for p in Path(root).iterdir()
                  if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.is_file()))


def installed_copies(python: str) -> list[str]:
    """The project's packages installed in the interpreter's path (`pip install .`)."""
    from .make import ROOT

    return [os.path.join(folder, name) for folder in interpreter_path(python) if os.path.isdir(folder)
            and not os.path.realpath(folder).startswith(str(ROOT)) for name in project_names(ROOT)
            if os.path.exists(os.path.join(folder, name))]


_SYS_PATH: dict[str, list[str]] = {}


def interpreter_path(python: str) -> list[str]:
    """sys.path of `python -E -s` (how the zygote runs): the folders its imports come from."""
    if python not in _SYS_PATH:
        done = subprocess.run([python, "-E", "-s", "-c", "import json, sys; print(json.dumps(sys.path))"],
                              capture_output=True, text=True, cwd="/", check=True)
        _SYS_PATH[python] = [p for p in json.loads(done.stdout) if p]
    return _SYS_PATH[python]


def root_spec(python: str, folder: Path, hidden: list[Path]) -> dict:
    """What the sandbox's root holds: the system's programs, libraries and /etc, the interpreter
    and the folders on its path, read-only; the sandbox's folder (read-only, its home and tmp
    writable). `hidden`: folders of the grader (the project it grades from) never shown, and
    masked where they lie inside one of those folders; installed copies of the project are masked."""
    real = lambda p: os.path.realpath(p)  # noqa: E731
    hidden = [real(h) for h in hidden]
    inside = lambda p, q: p == q or p.startswith(q.rstrip("/") + "/")  # noqa: E731
    symlinks, wanted = [], []
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc"):
        path = f"/{name}"
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            wanted.append(path)
    python_folders = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                      os.path.dirname(real(python)), *interpreter_path(python)]
    for path in python_folders:
        path = real(path)
        if os.path.isdir(path) and path not in hidden:
            # one holding a hidden folder is bound with that folder masked (below); one inside a
            # hidden folder (a virtualenv in your checkout) is bound alone, the rest staying unseen
            wanted.append(path)
    wanted.append("/sys")
    read_only = []
    for path in sorted(set(wanted), key=len):
        if not any(inside(path, p) for p in read_only) and not any(inside(path, link) for link, _ in symlinks):
            read_only.append(path)
    masks = [h for h in hidden if any(inside(h, p) for p in read_only)]
    for site in interpreter_path(python):
        site = real(site)
        if os.path.isdir(site) and any(inside(site, p) for p in read_only):
            for root in hidden:
                for name in project_names(root) if os.path.isdir(root) else []:
                    if os.path.exists(os.path.join(site, name)) and site != root:  # an editable install names the hidden folder itself: not bound
                        masks.append(os.path.join(site, name))
    folder = str(folder)
    # (source, target, read-only, recursive), parents before what is mounted inside them
    binds = [(p, p, True, True) for p in read_only] + [
        (folder, folder, True, False), (f"{folder}/home", f"{folder}/home", False, False),
        (f"{folder}/tmp", "/tmp", False, False)]
    return {"root": f"{folder}/root", "symlinks": symlinks, "binds": sorted(binds, key=lambda b: len(b[1])),
            "masks": sorted(set(masks)), "tmp": f"{folder}/tmp", "home": f"{folder}/home"}


@dataclass
class ChildEnd:
    """How one check's child ended, as the grader saw it."""

    output: tuple[str, str, int]  # the start and end of what it printed, and how many characters
    answer: bytes  # what it wrote on the answer pipe (at most MAX_VALUES_BYTES)
    answer_size: int
    hung: bool  # still running at the timeout
    exit_code: int | None  # as subprocess gives it: negative for a signal; None if unknown
    seconds: float
    killed_after: int = 0  # processes it left running, killed when it ended
    stuck: list = field(default_factory=list)  # (pid, command) of processes holding its pipes after the kill
                                               # (only possible without a sandbox user)
    out_of_memory: str | None = None  # the verdict, when the out-of-memory killer ended one of its processes


def pipe_holders(inodes) -> list[tuple[int, str]]:
    """(pid, command line) of the processes holding the pipes with these inode numbers."""
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    holders = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if any(os.readlink(f"{entry.path}/fd/{fd}") in wanted for fd in os.listdir(f"{entry.path}/fd")):
                command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                holders.append((int(entry.name), command.strip()[:120]))
        except OSError:
            continue
    return holders


def _drain(stream, keep: list, limit: int) -> None:
    """Read a child's stream to its end, keeping the first `limit` characters and the last
    OUTPUT_TAIL (so a print in a loop cannot fill the grader's memory)."""
    head, tail, total = [], "", 0
    for chunk in iter(lambda: stream.read(8192), b""):
        text = chunk.decode(errors="replace")
        if total < limit:
            head.append(text[:limit - total])
        tail = (tail + text)[-OUTPUT_TAIL:]
        total += len(text)
    keep.append(("".join(head), tail, total))


def _read_answer(stream, keep: list) -> None:
    data, size = [], 0
    for chunk in iter(lambda: stream.read(65536), b""):
        size += len(chunk)
        if size <= MAX_VALUES_BYTES:
            data.append(chunk)
    keep.append((b"".join(data), size))


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
        stream.close()
    except (BrokenPipeError, OSError):
        pass


class Sandbox:
    """A sandbox user (when root), a private folder it may read (code, data, the copies it
    grades) and write (home, tmp), and the zygote process that forks a child per check.

    code: a stripped copy whose assignments/ package (the check definitions) the zygote imports.
    isolation: "auto" (the best this machine allows) or a level of LEVELS.
    hidden: folders the child must never see (default: the project this grader runs from).
    memory: bytes all the processes of one check may use together (memory.SandboxMemory)."""

    def __init__(self, code: Path, isolation: str = "auto", python: str | None = None, hidden=(),
                 memory: int | None = None):
        from .make import ROOT

        self.python = python or sys.executable
        self.isolation = detect(isolation, self.python)
        # every check's processes together: at most `memory` bytes (default: memory.default_sandbox_limit)
        self.memory = SandboxMemory(memory)
        self.cpu = SandboxCPU(self.memory)  # an equal CPU share per sandbox, however many processes a check starts
        self.folder = Path(tempfile.mkdtemp(prefix="sandbox-"))
        self.count = 0
        self._data: dict[str, Path] = {}
        self._mount_paths: set[Path] = set()
        try:
            self._lay_out(Path(code))
            try:
                self.process, self.sock = self._start_zygote([Path(ROOT), *map(Path, hidden)])
            except OSError as error:
                if isolation != "auto" or self.isolation.level != "userns":
                    raise
                # the probe passed, but this machine refused something the root folder needs
                reason = str(error).strip().splitlines()[-1][:200]
                self.isolation = Isolation("none", why_not=[f"the user-namespace sandbox could not be built ({reason})"])
                self.process, self.sock = self._start_zygote([Path(ROOT), *map(Path, hidden)])
        except BaseException:
            self._remove()
            raise

    # the folder -------------------------------------------------------------------------------
    def _lay_out(self, code: Path) -> None:
        f = self.folder
        shutil.copytree(code / "assignments", f / "code" / "assignments",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for sub in ("data", "trees", "home", "tmp", "root"):
            (f / sub).mkdir(exist_ok=True)
        if self.isolation.uid is not None:
            uid, gid = self.isolation.uid, self.isolation.gid
            os.chmod(f, 0o711)  # the user finds its way in, lists nothing
            for sub in ("code", "data"):
                _readable(f / sub)
            os.chmod(f / "trees", 0o711)
            os.chmod(f / "root", 0o700)
            for sub in ("home", "tmp"):
                os.chown(f / sub, uid, gid)
                os.chmod(f / sub, 0o700)

    def env(self) -> dict:
        """A scrubbed environment: nothing of the grader's (no PYTHONPATH, no paths to its tree)."""
        tmp = "/tmp" if self.isolation.level in ("namespaces", "userns") else str(self.folder / "tmp")
        return {"PATH": os.defpath, "HOME": str(self.folder / "home"), "TMPDIR": tmp, "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1"}

    def place_tree(self, pristine: Path, files: dict[str, Path]) -> Path:
        """The folder a submission's code runs in: a copy of the stripped copy `pristine` with the
        student's files put in, readable (not writable) by the sandbox user."""
        from .make import IGNORE
        from .submission_files import copy_submitted

        self.count += 1
        tree = self.folder / "trees" / str(self.count)
        shutil.copytree(pristine, tree, ignore=IGNORE)
        shutil.rmtree(tree / ".assignment", ignore_errors=True)  # shipped references: not the child's business
        for rel, path in files.items():
            copy_submitted(path, tree / rel)  # the file itself, never what a link points to
        write_bytecode(tree, skip=set(files))
        if self.isolation.uid is not None:
            _readable(tree)
        return tree

    def place_data(self, data: Path) -> Path:
        """The checkpoints, copied where the sandbox user can read them (once per folder)."""
        key = str(Path(data).resolve())
        if key not in self._data:
            target = self.folder / "data" / str(len(self._data))
            shutil.copytree(data, target)
            if self.isolation.uid is not None:
                _readable(target)
            self._data[key] = target
        return self._data[key]

    def done_with(self, tree: Path) -> None:
        """After a grading: no process of the sandbox user is left, its scratch folders are empty
        (nothing of one submission is there for the next), the tree is removed."""
        self.kill_all()
        self.clear_scratch()
        shutil.rmtree(tree, ignore_errors=True)

    def clear_scratch(self) -> None:
        """Once a check's processes are dead: the sandbox's home and tmp emptied and, at level
        "user" (no mount namespace: /tmp, /var/tmp, /dev/shm are the machine's), what the sandbox
        user left in the folders every user may write, and its System V IPC, removed. Nothing one
        check wrote is there for the next (with namespaces each check also has tmpfs of its own)."""
        for sub in ("home", "tmp"):
            empty_for_the_next(self.folder / sub, self._mount_paths)
        if self.isolation.level == "user":
            _remove_ipc_of(self.isolation.uid)
            for shared in SHARED_SCRATCH:
                _remove_files_of(Path(shared), self.isolation.uid)

    # the zygote -------------------------------------------------------------------------------
    def _start_zygote(self, hidden: list[Path]):
        sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {"level": self.isolation.level, "uid": self.isolation.uid, "gid": self.isolation.gid,
                  "memory": self.memory.for_child(), "cpu": self.cpu.for_child()}
        inherited = [theirs.fileno()] + ([self.memory.procs] if self.memory.folder is not None else []) + (
            [self.cpu.procs] if self.cpu.procs is not None else [])
        command = [self.python, "-E", "-s", "-m", "assignments.zygote", str(theirs.fileno())]
        if self.isolation.level in ("namespaces", "userns"):
            spec = config["spec"] = root_spec(self.python, self.folder, hidden)
            spec["userns"] = self.isolation.level == "userns"
            self._mount_paths = mount_paths(spec)
            unshare = USER_UNSHARE if self.isolation.level == "userns" else UNSHARE
            command = [shutil.which("unshare", path=SYSTEM_PATH), *unshare] + command
        process = subprocess.Popen(command + [json.dumps(config)], cwd=self.folder / "code", env=self.env(),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   pass_fds=inherited, start_new_session=True)
        theirs.close()
        ready = _receive(sock, timeout=300)
        if ready != {"ready": True}:
            error = process.stderr.read().decode(errors="replace")[-3000:] if process.poll() is not None else ""
            process.kill()
            raise OSError(f"the sandbox's zygote process did not start: {ready or error}")
        threading.Thread(target=process.stderr.read, daemon=True).start()  # never blocks it
        return process, sock

    def run(self, check: str, tree: Path, data: Path, inputs, timeout: float, served: socket.socket) -> ChildEnd:
        """Fork a child in `tree` that runs `check`'s probe on `inputs`; wait until it exits or
        `timeout` seconds pass; then kill every process it left; return what it sent. served: the
        child's end of a socket to the grader (assignments/serving.py)."""
        kills = self.memory.oom_kills()  # before the child exists: it may be killed at once
        stdin_read, stdin_write = os.pipe()
        output_read, output_write = os.pipe()
        answer_read, answer_write = os.pipe()
        socket.send_fds(self.sock, [json.dumps({"check": check, "data": str(data), "tree": str(tree)}).encode()],
                        [stdin_read, output_write, answer_write, served.fileno()])
        for fd in (stdin_read, output_write, answer_write):
            os.close(fd)  # the grader keeps no write end: end of file once the child's side is gone
        pid = None
        while pid is None:
            message = _receive(self.sock, timeout=60)
            if message is None:
                raise OSError("the sandbox's zygote process ended")
            pid = message.get("pid")
        start = time.perf_counter()
        pipes = [os.fstat(fd).st_ino for fd in (output_read, answer_read)]
        output, answer = [], []
        jobs = [(_drain, (os.fdopen(output_read, "rb"), output, OUTPUT_HEAD)),
                (_read_answer, (os.fdopen(answer_read, "rb"), answer)),
                (_feed, (os.fdopen(stdin_write, "wb"), json.dumps(inputs).encode()))]
        threads = [threading.Thread(target=job, args=args, daemon=True) for job, args in jobs]
        for t in threads:
            t.start()
        exit_code, deadline = None, start + timeout
        while exit_code is None:
            message = _receive(self.sock, timeout=max(0.0, deadline - time.perf_counter()))
            if message is None:
                break
            if message.get("exited") == pid:
                exit_code = message["code"]
        seconds = time.perf_counter() - start
        hung = exit_code is None
        killed = self.kill_all(pid)  # the child (if hung) and everything it started
        self.clear_scratch()  # nothing this check wrote is there for the next one
        holders = []
        for t in threads[:2]:
            t.join(10)
            while t.is_alive() and not holders:  # a busy machine: read on while nothing else holds the pipes
                if pipe_holders(pipes):
                    # One more sweep first: a process can appear in the first sweep's wake (a fork
                    # it did not see); only one that outlives a second sweep is reported.
                    killed += self.kill_all(pid)
                    t.join(1)
                    holders = pipe_holders(pipes) if t.is_alive() else []
                else:
                    t.join(1)
        after = self.memory.oom_kills()
        memory = used_too_much_memory(self.memory.describe()) if after is not None and after > kills else None
        return ChildEnd(output[0] if output else ("", "", 0), *(answer[0] if answer else (b"", 0)), hung, exit_code,
                        seconds, killed - hung, holders, memory)

    def alive(self) -> bool:
        """Whether the zygote still runs (a grading that raised may have ended it)."""
        return self.process.poll() is None and self.sock.fileno() >= 0

    def kill_all(self, session: int | None = None) -> int:
        """Kill every process of the sandbox user; in "userns" every process of the namespace but
        the zygote (it does it: it is the namespace's init); without either, the session `session`
        leads."""
        if self.isolation.level == "userns":
            if self.sock.fileno() < 0:
                return 0  # closed: the zygote ended, and the kernel killed its namespace with it
            self.sock.send(json.dumps({"kill": True}).encode())
            while True:
                message = _receive(self.sock, timeout=60)
                if message is None:
                    raise OSError("the sandbox's zygote process did not answer when asked to end a check")
                if "killed" in message:
                    return message["killed"]
        if self.isolation.uid is not None:
            return kill_processes_of(self.isolation.uid)
        if session is not None:
            try:
                os.killpg(session, signal.SIGKILL)
                return 1
            except (ProcessLookupError, PermissionError):
                pass
        return 0

    def close(self) -> None:
        """Stop the zygote (and with it every process of its namespaces), remove the folder."""
        try:
            self.sock.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.kill_all()
        finally:
            self._remove()

    def _remove(self) -> None:
        self.cpu.close()
        self.memory.close()
        if self.isolation.level == "user":
            _remove_ipc_of(self.isolation.uid)
            for shared in SHARED_SCRATCH:
                _remove_files_of(Path(shared), self.isolation.uid)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.isolation.user:
            release_user(self.isolation.user)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _receive(sock: socket.socket, timeout: float) -> dict | None:
    """The zygote's next message, or None (it ended, or nothing came within `timeout` seconds)."""
    ready, _, _ = select.select([sock], [], [], timeout)
    if not ready:
        return None
    data = sock.recv(65536)
    return json.loads(data) if data else None


_BYTECODE: dict[bytes, bytes] = {}  # sha256 of a source file -> its compiled .pyc (hash-checked)
_TREES = [0]  # trees placed by this process


def write_bytecode(tree: Path, skip: set[str]) -> None:
    """Compiled bytecode beside the tree's .py files, but for the student's (`skip`, relative
    paths): a check's child runs with PYTHONDONTWRITEBYTECODE, so without it every check compiled
    each module it imports afresh. The .pyc files are checked against their source's hash (PEP
    552), never its time stamp, so one compiled here serves every tree with the same file (kept
    for this process), and a source that differs from what was compiled is compiled afresh by the
    child, as without them. The student's files are never compiled here: the grader does not parse
    them. From a process's second tree on (a batch): compiling them all costs more than one
    grading's checks save."""
    import hashlib
    import importlib.util
    import py_compile

    _TREES[0] += 1
    if _TREES[0] < 2:
        return
    for path in tree.rglob("*.py"):
        if path.is_symlink() or path.relative_to(tree).as_posix() in skip:
            continue
        source = path.read_bytes()
        key = hashlib.sha256(source).digest()
        cached = Path(importlib.util.cache_from_source(str(path)))
        if key in _BYTECODE:
            cached.parent.mkdir(exist_ok=True)
            cached.write_bytes(_BYTECODE[key])
            continue
        try:
            py_compile.compile(str(path), str(cached), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
        except py_compile.PyCompileError:
            continue  # the child reports it, as it would have
        _BYTECODE[key] = cached.read_bytes()


def _readable(folder: Path) -> None:
    """Make a folder of the grader's readable (not writable) by other users."""
    os.chmod(folder, 0o755)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, 0o755 if path.is_dir() else 0o644)


def mount_paths(spec: dict) -> set[Path]:
    """The folders in the sandbox's tmp that are (or lead to) a folder the zygote bound under
    /tmp (a virtualenv in a temporary folder, as .ci/run makes), as the grader sees them."""
    tmp, paths = Path(spec["tmp"]), set()
    for _, target, _, _ in spec["binds"]:
        if target.startswith("/tmp/"):
            path = tmp / target[len("/tmp/"):]
            paths |= {path, *[p for p in path.parents if tmp in p.parents]}
    return paths


def empty_for_the_next(folder: Path, keep: set[Path] = frozenset()) -> None:
    """Remove what a grading left in the sandbox's home or tmp, but for the zygote's mount points:
    the folders in `keep` (emptied of anything else) and root-owned folders (the sandbox user
    cannot make those). Removing one here would unmount the folder bound on it in the zygote's
    namespace: every later grading would fail to import what it holds."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if entry in keep:
                empty_for_the_next(entry, keep)
            elif entry.stat().st_uid != 0:
                shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# The folders every user may write on a usual Linux machine (sticky, world-writable): at level
# "user" what the sandbox user leaves there is removed after each check.
SHARED_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue")


def _remove_files_of(folder: Path, uid: int, depth: int = 3) -> None:
    """Remove what user `uid` left in a shared folder (/tmp: for the next check), and in the
    world-writable folders of others inside it (/tmp/.X11-unix), `depth` levels down."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != uid:
                if depth > 1 and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                    _remove_files_of(Path(entry.path), uid, depth - 1)
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _remove_ipc_of(uid: int) -> None:
    """Remove System V shared memory, queues and semaphores owned by `uid` (they outlive processes)."""
    for kind, flag in (("shm", "-m"), ("msg", "-q"), ("sem", "-s")):
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        header = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[0].split()
        for line in lines:
            row = dict(zip(header, line.split()))
            ipcrm = shutil.which("ipcrm", path=SYSTEM_PATH)
            if int(row.get("uid", -1)) == uid and ipcrm:
                subprocess.run([ipcrm, flag, row["id"]], capture_output=True)
