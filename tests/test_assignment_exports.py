"""The assignment kit's exports and batch grading, and its messages for memory and import errors
(assignments/export.py, batch.py, memory.py). Everything runs on gamma_cost_model, the cheapest
assignment: one Gradescope source folder (stripped copy, checkpoints, hidden references) and one
zygote are built per module and shared.

- Gradescope: run_autograder, run as root in a folder laid out like /autograder, writes a
  results.json whose top level shows no hidden score; a check killed by the out-of-memory killer
  under a container-like memory limit says so, with the limit; a seed the reference fails is refused.
- GitHub: a fresh clone of the exported starter repository has the checkpoints, and the
  workflow's own command line passes for the reference solution and fails for the stripped copy.
- Batch: Gradescope's "Export Submissions" zip graded into one CSV, with progress.
- Messages: a missing module, a bad import or a syntax error in the student's file is reported as
  itself (module, file and line); a failed allocation says it ran out of memory, with the limit."""

import csv
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from assignments import __main__ as cli
from assignments.batch import find_submissions
from assignments.definition import Failed
from assignments.export import gradescope_results, gradescope_source
from assignments.grade import CheckResult, Report, Zygote, grade_tree
from assignments.make import resolve
from assignments.memory import killed_for_memory, oom_killed_between, silent_end
from assignments.registry import ASSIGNMENTS
from assignments.sandbox import USER as SANDBOX_USER, detect

ROOT = Path(__file__).resolve().parents[1]
NAME = "gamma_cost_model"
ASSIGNMENT = ASSIGNMENTS[NAME]
THEORY = "spec_decoding/policies/theory.py"
BY_POSITION = "spec_decoding.policies.theory.expected_tokens_by_position"


def check_exercising_only(function: str) -> str:
    return next(c.name for c in ASSIGNMENT.checks if c.exercises == (function,))


def reference_texts() -> dict[str, str]:
    return {resolve(f).file: (ROOT / resolve(f).file).read_text() for f in ASSIGNMENT.functions}


def with_first_line_of(function: str, line: str) -> str:
    """The reference theory.py with `line` run first in `function`'s body (after its docstring)."""
    import ast

    text = (ROOT / THEORY).read_text()
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == function)
    first = node.body[1] if ast.get_docstring(node) else node.body[0]
    lines = text.splitlines(keepends=True)
    indent = " " * first.col_offset
    lines.insert(first.lineno - 1, f"{indent}{line}\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """What Gradescope unpacks into /autograder/source, for gamma_cost_model at the hidden seed
    (building it grades the reference solution first)."""
    return gradescope_source(NAME, tmp_path_factory.mktemp("gradescope") / "source", seed=1)


@pytest.fixture(scope="module")
def zygote(source):
    z = Zygote(source / "copy")
    yield z
    z.close()


def grade_texts(source, zygote, tmp_path, texts: dict[str, str], only: list[str]):
    refs = json.loads((source / "hidden.json").read_text())
    files = {}
    for rel, text in texts.items():
        path = tmp_path / "submitted" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        files[rel] = path
    report = grade_tree(ASSIGNMENT, source / "copy", files, source / "data", refs, only=only, zygote=zygote)
    return {r.check: r for r in report.results}


# ------------------------------------------------------------------------------------------------
# Messages: import errors, memory
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, words", [
    ("import numpyy", ["ModuleNotFoundError: No module named 'numpyy'", f"{THEORY}:1"]),
    ("from math import nothing_here", ["ImportError: cannot import name 'nothing_here' from 'math'", f"{THEORY}:1"]),
    ("def broken(:", ["SyntaxError", f"{THEORY}:1"]),
])
def test_an_import_error_in_the_students_file_is_reported_as_itself(source, zygote, tmp_path, line, words):
    """The student's file cannot be imported: the verdict names the real error, file and line
    (the grader once said "cannot import spec_decoding.policies.theory.expected_tokens_per_round")."""
    texts = reference_texts()
    texts[THEORY] = line + "\n" + texts[THEORY]
    check = ASSIGNMENT.checks[0].name
    result = grade_texts(source, zygote, tmp_path, texts, [check])[check]
    assert not result.passed and result.message.startswith("your code could not be imported"), result.message
    for w in words:
        assert w in result.message, result.message
    assert "cannot import spec_decoding" not in result.message


def test_a_failed_allocation_says_out_of_memory_with_the_limit(source, zygote, tmp_path):
    """The student's function allocates twice an address-space limit (RLIMIT_AS) it sets: the
    verdict says it ran out of memory and gives the limit, and the other check passes."""
    statm = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    # This process's address space plus room: the child's is about as large or smaller (smaller
    # where this one has started CUDA, which reserves much address space), so twice the limit
    # never fits.
    limit_mb = (statm + 512 * 2**20) // 2**20
    texts = reference_texts()
    texts[THEORY] = with_first_line_of(
        "expected_tokens_by_position",
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_mb} * 2**20, resource.RLIM_INFINITY)); "
        f"hog = b'x' * ({limit_mb} * 2**21)")
    hungry, other = check_exercising_only(BY_POSITION), ASSIGNMENT.checks[0].name
    results = grade_texts(source, zygote, tmp_path, texts, [hungry, other])
    message = results[hungry].message
    assert not results[hungry].passed and message.startswith("ran out of memory"), message
    assert f"at most {limit_mb:,} MB of address space" in message and "MemoryError" in message
    assert results[other].passed, results[other].message


def test_an_oom_kill_is_told_from_a_silent_exit():
    """The grader's verdict for a check that ended without an answer: an out-of-memory kill
    (the process died of SIGKILL, and the kill counter of the grader's memory cgroups went up
    meanwhile) is named, with the limit; an exit() while another process was killed for memory
    is not blamed on memory (it was, when the machine-wide counter was read and the exit status
    was not); nor is a SIGKILL while no counter moved."""
    assert oom_killed_between((3, None, 7), (3, None, 8)) and oom_killed_between((0,), (1,))
    assert not oom_killed_between((3, None, 7), (3, 5, 7))
    message = killed_for_memory(768 * 2**20)
    assert message.startswith("ran out of memory") and "768 MB" in message and "exit()" not in message
    assert silent_end(-9, (3, None), (4, None)).startswith("ran out of memory")
    for exit_code in (0, 1, -11, None):  # exit(), exit(1), a crash, unknown: while another process was OOM-killed
        assert "did your code call exit()" in silent_end(exit_code, (3, None), (4, None))
    assert "did your code call exit()" in silent_end(-9, (3, None), (3, None))
    no_cgroup = silent_end(-9, (), ())
    assert "SIGKILL" in no_cgroup and "out-of-memory killer" in no_cgroup and "kill itself" in no_cgroup


def test_the_machine_wide_oom_counter_is_not_read(monkeypatch):
    """Only the grader's memory cgroups are asked: /proc/vmstat counts every process of the
    machine (it made any silent check look like a memory kill when something else was killed)."""
    import assignments.memory as memory

    read = []
    field = memory._field
    monkeypatch.setattr(memory, "_field", lambda path, name: read.append(Path(path)) or field(path, name))
    memory.oom_kills()
    assert Path("/proc/vmstat") not in read
    assert all("cgroup" in str(path) for path in read)


# ------------------------------------------------------------------------------------------------
# Gradescope
# ------------------------------------------------------------------------------------------------

def test_gradescope_results_do_not_show_the_hidden_score_before_publication():
    """Gradescope shows the top-level "output" (and a top-level "score") at once; hidden checks
    are "after_published". So no top-level score, and the output gives the visible part only."""
    report = Report("x", ["f"], [CheckResult("a", ["f"], 2.0, 2.0, True, "ok", True),
                                 CheckResult("b", ["f"], 0.0, 1.0, False, "not implemented yet", True, "hi"),
                                 CheckResult("c", ["f"], 5.0, 5.0, True, "ok", False)])
    results = gradescope_results(report)
    assert "score" not in results and results["stdout_visibility"] == "hidden"
    assert [t["visibility"] for t in results["tests"]] == ["visible", "visible", "after_published"]
    assert [t["status"] for t in results["tests"]] == ["passed", "failed", "passed"]
    assert "2/3 points" in results["output"] and "7" not in results["output"] and "/8" not in results["output"]
    assert "hi" in results["tests"][1]["output"]


def layout(source: Path, tmp_path: Path, theory_text: str, checks: list[str]) -> Path:
    """A folder laid out like /autograder, the submission the bare edited files, hidden.json cut to
    `checks` (a cheaper run; the others are graded the same way)."""
    autograder = tmp_path / "autograder"
    shutil.copytree(source, autograder / "source")
    hidden = json.loads((source / "hidden.json").read_text())
    (autograder / "source" / "hidden.json").write_text(json.dumps({c: hidden[c] for c in checks}))
    (autograder / "submission").mkdir()
    for rel, text in reference_texts().items():
        (autograder / "submission" / Path(rel).name).write_text(theory_text if rel == THEORY else text)
    shutil.copy(source / "run_autograder", autograder / "run_autograder")  # as Gradescope does
    return autograder


def run_autograder(autograder: Path, prefix: list[str] = ()) -> dict:
    env = {"PATH": os.defpath, "AUTOGRADER_ROOT": str(autograder), "AUTOGRADER_PYTHON": sys.executable}
    done = subprocess.run([*prefix, "bash", str(autograder / "run_autograder")], env=env, capture_output=True,
                          text=True, cwd=autograder)
    assert done.returncode == 0, done.stderr
    return json.loads((autograder / "results" / "results.json").read_text())


def test_gradescope_run_autograder_as_root_writes_results_without_the_hidden_total(source, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("Gradescope runs run_autograder as root; this user is not")
    setup = (source / "setup.sh").read_text()
    assert f"torch=={torch.__version__.split('+')[0]} " in setup and "chmod 600 /autograder/source/hidden.json" in setup
    assert "useradd --system --user-group" in setup and f"--shell /usr/sbin/nologin {SANDBOX_USER}\n" in setup
    visible = next(c.name for c in ASSIGNMENT.checks if c.visible)
    hidden = next(c.name for c in ASSIGNMENT.checks if not c.visible)
    autograder = layout(source, tmp_path, (ROOT / THEORY).read_text(), [visible, hidden])
    results = run_autograder(autograder)
    assert [(t["name"], t["status"], t["visibility"]) for t in results["tests"]] == [
        (visible, "passed", "visible"), (hidden, "passed", "after_published")]
    assert "score" not in results
    points = {c.name: c.points for c in ASSIGNMENT.checks}
    assert f"{points[visible]:g}/{points[visible]:g} points" in results["output"]
    assert f"{points[visible] + points[hidden]:g}" not in results["output"].replace(f"{points[visible]:g}/", "")
    assert not (autograder / "source" / "hidden.json").exists()


# Put at the top of the student's theory.py: runs in every check that imports it, as the sandbox
# user, and prints what it could read, what earlier checks left, what it could open to the network.
SPY = """
def _spy(root, mark):
    import json, os, socket
    seen = {"uid": os.getuid(), "readable": {}, "found": [], "wrote": [], "sockets": []}
    for path in (root + "/results", root + "/results/results.json", root + "/results/.partial.json",
                 root + "/source", root + "/source/hidden.json", root + "/source/copy", root + "/submission",
                 root + "/submission_metadata.json"):
        try:
            seen["readable"][path] = os.listdir(path) if os.path.isdir(path) else open(path).read(300)
        except OSError:
            pass
    places = ["/tmp", "/var/tmp", "/dev/shm", os.environ.get("HOME", "/nonexistent"), os.environ.get("TMPDIR", "/tmp")]
    for place in places:
        try:
            seen["found"] += [place + "/" + name for name in os.listdir(place) if name.startswith(mark)]
        except OSError:
            pass
    for place in places:
        try:
            with open(place + "/" + mark + str(os.getpid()), "w") as left:
                left.write("left by an earlier check")
            seen["wrote"].append(place)
        except OSError:
            pass
    for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                         (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_PACKET, socket.SOCK_RAW)):
        try:
            socket.socket(family, kind).close()
            seen["sockets"].append(family.name + "/" + kind.name)
        except OSError:
            pass
    print("SPY " + json.dumps(seen), flush=True)


_spy(ROOT_OF_AUTOGRADER, MARK)
"""


def readable_python() -> list[str] | None:
    """A command prefix under which other users can run this Python, as they can Gradescope's
    (/autograder/venv): [] where they already can; where a private folder on its way blocks
    them (pyenv's under /root), a mount namespace of the test's own in which that folder is an
    empty tmpfs readable by all, holding only what Python needs of it (bound from the real one).
    None where neither works (not root, no unshare)."""
    from assignments.sandbox import interpreter_path, unreadable_python

    blocked = unreadable_python(sys.executable)
    if blocked is None:
        return []
    unshare = shutil.which("unshare", path="/usr/sbin:/usr/bin:/sbin:/bin")
    paths = [os.path.realpath(sys.executable), *map(os.path.realpath, interpreter_path(sys.executable))]
    needed = sorted({Path(p).relative_to(blocked).parts[0] for p in paths if Path(p).is_relative_to(blocked)})
    if unshare is None or os.geteuid() != 0 or not needed:
        return None
    script = (f'R=$(mktemp -d) && mount --bind {blocked} "$R" && mount -t tmpfs -o mode=755 tmpfs {blocked} && '
              + "".join(f'mkdir {blocked}/{n} && mount --bind "$R/{n}" {blocked}/{n} && ' for n in needed)
              + 'exec "$@"')
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def spied(output: str) -> list[dict]:
    return [json.loads(line[4:]) for line in output.splitlines() if line.startswith("SPY ")]


def test_gradescope_without_cap_sys_admin_shows_no_check_anything_of_the_grade(source, tmp_path):
    """Gradescope as it probably is: a container without CAP_SYS_ADMIN (run_autograder under
    `capsh --drop=cap_sys_admin`: no namespaces, the sandbox falls to level "user"), the
    /autograder folder world-readable as Gradescope's. A submission that passes every check also
    spies in each: nothing of the results (the earlier hidden check's verdict), the hidden
    references, the instructor's source, the submission or its metadata is readable; nothing an
    earlier check wrote in /tmp, /var/tmp, /dev/shm, its home or TMPDIR is there; no socket but a
    Unix one opens. (results.json was 0644 in a 0755 folder, rewritten after every check, and /tmp
    kept what each check left.) The results are root's alone, published once."""
    import stat
    import tempfile

    capsh = shutil.which("capsh", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if os.geteuid() != 0 or capsh is None:
        pytest.skip("needs root and capsh (libcap2-bin: apt-get install libcap2-bin) to drop CAP_SYS_ADMIN")
    if subprocess.run([capsh, "--drop=cap_sys_admin", "--", "-c", "true"], capture_output=True).returncode != 0:
        pytest.skip("capsh cannot drop CAP_SYS_ADMIN here")
    python = readable_python()
    if python is None:
        pytest.skip("this Python cannot be made readable by other users (level user needs that)")
    root = Path(tempfile.mkdtemp(prefix="autograder-", dir="/tmp"))  # traversable by every user, as /autograder
    try:
        root.chmod(0o755)
        checks = ["speedup", "best_gamma_choice", "tokens_by_position"]  # hidden first, then two visible
        mark = f"spy-mark-{uuid.uuid4().hex[:8]}-"  # this run's (another run's marks are not this one's)
        theory = f"ROOT_OF_AUTOGRADER, MARK = {str(root)!r}, {mark!r}\n" + SPY + (ROOT / THEORY).read_text()
        built = layout(source, tmp_path, theory, checks)
        for entry in built.iterdir():
            shutil.move(str(entry), root / entry.name)
        (root / "submission_metadata.json").write_text('{"previous_submissions": [{"score": 10}]}')
        for path in root.rglob("*"):  # as unpacked and uploaded: readable by every user
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {"PATH": os.defpath, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
        done = subprocess.run([*python, capsh, "--drop=cap_sys_admin", "--", "-c", 'exec "$@"', "sh", "bash",
                               str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "without namespaces" in done.stderr, done.stderr  # level "user"
        results = json.loads((root / "results" / "results.json").read_text())
        assert [(t["name"], t["status"], t["score"]) for t in results["tests"]] == [
            (c, "passed", ASSIGNMENT.check(c).points) for c in checks]
        spies = [spied(t["output"]) for t in results["tests"]]
        assert all(len(s) == 1 for s in spies), [t["output"] for t in results["tests"]]
        for (seen,) in spies:
            assert seen["uid"] != 0 and seen["readable"] == {}, seen
            assert seen["found"] == [] and seen["sockets"] == [], seen
            assert "/tmp" in seen["wrote"] and "/dev/shm" in seen["wrote"], seen  # it could write: and it was removed
        assert not any('"status"' in t["output"] or "after_published" in t["output"] for t in results["tests"])
        for path, mode in (("results", 0o700), ("source", 0o700), ("submission", 0o700),
                           ("results/results.json", 0o600), ("submission_metadata.json", 0o600)):
            assert stat.S_IMODE((root / path).stat().st_mode) == mode, path
        assert not (root / "results" / ".partial.json").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_network_filter_leaves_unix_sockets_only():
    """The seccomp filter a check's child gets at level "user" (sandbox.refuse_network): in a
    child process after it, AF_INET, AF_INET6 and AF_PACKET sockets fail with EACCES, a Unix
    socket and a socketpair open; before it (the control) an AF_INET socket opens."""
    import ctypes
    import errno
    import socket

    from assignments.sandbox import PR_SET_NO_NEW_PRIVS, network_filter, refuse_network

    if network_filter(os.uname().machine) is None:
        pytest.skip(f"no network filter for {os.uname().machine}: documented as not refused there")
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            ctypes.CDLL(None).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            refuse_network()
            found = []
            for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                                 (socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_PACKET, socket.SOCK_RAW)):
                try:
                    socket.socket(family, kind).close()
                    found.append("opened")
                except OSError as error:
                    found.append(errno.errorcode.get(error.errno, str(error.errno)))
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
            socket.socketpair()
            os.write(write, json.dumps(found).encode())
        finally:
            os._exit(0)
    os.close(write)
    found = json.loads(os.read(read, 1000).decode())
    os.waitpid(pid, 0)
    assert found == ["EACCES"] * 4


def memory_cgroup(limit: int) -> Path | None:
    """A new memory cgroup (v1 or v2) limited to `limit` bytes without swap, or None where this
    process may not make one."""
    name = f"assignments-test-{uuid.uuid4().hex[:8]}"
    for root, files in ((Path("/sys/fs/cgroup/memory"), {"memory.limit_in_bytes": limit, "memory.swappiness": 0}),
                        (Path("/sys/fs/cgroup"), {"memory.max": limit, "memory.swap.max": 0})):
        if not (root / next(iter(files))).exists():
            continue
        try:
            (root / name).mkdir()
        except OSError:
            continue
        try:
            for file, value in files.items():
                (root / name / file).write_text(str(value))
            return root / name
        except OSError:
            (root / name).rmdir()
    return None


def test_gradescope_a_check_killed_for_memory_says_so_with_the_limit(source, tmp_path):
    """run_autograder in a cgroup limited to 1 GiB (Gradescope's container has such a limit): the
    student's function allocates 3 GiB, the kernel's out-of-memory killer ends that check's process;
    its verdict says it ran out of memory and names the limit (it once said "did your code call
    exit()"), and the other check passes."""
    cgroup = memory_cgroup(2**30)
    if cgroup is None:
        pytest.skip("cannot make a memory cgroup here (not root, or no writable cgroup memory controller)")
    try:
        hungry, other = check_exercising_only(BY_POSITION), ASSIGNMENT.checks[0].name
        theory = with_first_line_of("expected_tokens_by_position", "hog = b'x' * (3 * 2**30)")
        autograder = layout(source, tmp_path, theory, [other, hungry])
        results = run_autograder(autograder, ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"])
        by_name = {t["name"]: t for t in results["tests"]}
        assert by_name[other]["status"] == "passed", by_name[other]["output"]
        message = by_name[hungry]["output"]
        assert by_name[hungry]["status"] == "failed" and message.startswith("ran out of memory"), message
        # the sandbox's own limit: half of the grader's 1 GiB (memory.default_sandbox_limit)
        assert "out-of-memory killer" in message and "512 MB" in message and "exit()" not in message
    finally:
        cgroup.rmdir()


def test_a_seed_the_reference_fails_is_refused(tmp_path, monkeypatch, capsys):
    """A check the instructor's own solution fails at the chosen seed would fail every student
    who computes what it computes: export refuses the seed, names the check, writes nothing."""
    unlucky = ASSIGNMENT.checks[0]

    def judge(inputs, reference, got, *served):
        raise Failed("made to fail for this test")

    checks = tuple(replace(c, judge=judge) if c is unlucky else c for c in ASSIGNMENT.checks)
    monkeypatch.setitem(ASSIGNMENTS, NAME, replace(ASSIGNMENT, checks=checks))
    archive = tmp_path / "hw.zip"
    assert cli.main(["export", "gradescope", NAME, "--out", str(archive), "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "at seed 5 the reference solution itself fails 1 check(s) of gamma_cost_model" in err
    assert f"{unlucky.name}: made to fail for this test" in err and "choose another --seed" in err
    assert not archive.exists()


# ------------------------------------------------------------------------------------------------
# GitHub
# ------------------------------------------------------------------------------------------------

def git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=instructor", "-c", "user.email=instructor@example.com", *args],
                   cwd=cwd, check=True, capture_output=True)


def test_github_export_works_from_a_fresh_clone(tmp_path):
    """The starter repository, committed and cloned afresh: every file is there (the checkpoints
    too: the project's .gitignore drops *.safetensors), the workflow pins torch and uses no
    deprecated Classroom action, and its own command line (read from the YAML) fails on the
    stripped copy and passes with the reference solution, writing the job summary."""
    import yaml

    repo, clone = tmp_path / "repo", tmp_path / "clone"
    assert cli.main(["export", "github", NAME, "--out", str(repo)]) == 0
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "starter", cwd=repo)
    git("clone", "-q", str(repo), str(clone), cwd=tmp_path)

    def files(folder):
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts)
    assert files(clone) == files(repo)
    assert list(clone.glob(".assignment/data/*/model.safetensors"))

    text = (clone / ".github/workflows/checks.yml").read_text()
    assert "classroom-resources" not in text and f"torch=={torch.__version__.split('+')[0]} " in text
    steps = yaml.safe_load(text)["jobs"]["visible-checks"]["steps"]
    command = next(s["run"] for s in steps if s.get("name") == "Visible checks")
    summary = tmp_path / "summary.md"
    env = {"PATH": f"{Path(sys.executable).parent}:{os.defpath}", "HOME": str(tmp_path),
           "GITHUB_STEP_SUMMARY": str(summary), "HF_HUB_OFFLINE": "1"}

    def workflow():
        return subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True)
    done = workflow()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "(not yet)" in summary.read_text() and "not implemented yet" in summary.read_text()
    for rel, text in reference_texts().items():
        (clone / rel).write_text(text)
    done = workflow()
    assert done.returncode == 0, done.stdout + done.stderr
    last = summary.read_text().split("## ")[-1]
    visible = [c for c in ASSIGNMENT.checks if c.visible]
    assert "(all pass)" in last and last.count("| PASS") == len(visible)


# ------------------------------------------------------------------------------------------------
# Batch grading
# ------------------------------------------------------------------------------------------------

GRADESCOPE_METADATA = """submission_1001:
  :submitters:
  - :name: Ada Lovelace
    :sid: '100'
    :email: ada@example.edu
  :created_at: 2026-11-01 10:00:00.000000000 -07:00
  :score: 0.0
submission_1002:
  :submitters:
  - :name: Pair One
    :sid: '200'
  - :name: Pair Two
    :sid: '201'
  :results: !ruby/hash:ActiveSupport::HashWithIndifferentAccess
    score: 0.0
submission_1003:
  :submitters:
  - :name: No Import
    :email: noimport@example.edu
"""


def test_batch_grades_a_gradescope_export_into_one_csv(tmp_path, monkeypatch):
    """`grade ASSIGNMENT --submissions export.zip --jobs 2`: Gradescope's export
    (submission_metadata.yml beside a folder per submission) graded on one build by two worker
    processes into one CSV, a row per submission in the export's order with each check's points,
    the total and notes; progress (n of N, time left) on stderr; an existing CSV is never
    overwritten."""
    root = "assignment_42_export/"
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(root + "submission_metadata.yml", GRADESCOPE_METADATA)
        for rel, text in reference_texts().items():  # the reference solution, in its folders
            z.writestr(root + "submission_1001/" + rel, text)
        z.writestr(root + "submission_1002/notes.txt", "we ran out of time")
        z.writestr(root + "submission_1003/theory.py", "import numpyy\n" + (ROOT / THEORY).read_text())
    out = tmp_path / "grades.csv"
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert cli.main(["grade", NAME, "--submissions", str(archive), "--csv", str(out), "--jobs", "2"]) == 0
    rows = list(csv.DictReader(out.open()))
    checks = [c.name for c in ASSIGNMENT.checks]
    assert list(rows[0]) == ["student", "name", "submission", *checks, "total", "max", "official", "seconds",
                             "similar_to_reference", "notes"]
    assert [(r["student"], r["name"], r["submission"]) for r in rows] == [
        ("100", "Ada Lovelace", "submission_1001"), ("200+201", "Pair One+Pair Two", "submission_1002"),
        ("noimport@example.edu", "No Import", "submission_1003")]
    assert [r["total"] for r in rows] == [f"{ASSIGNMENT.points:g}", "0", "0"]
    assert all(r["max"] == f"{ASSIGNMENT.points:g}" for r in rows)
    isolated = detect("auto", sys.executable).level == "namespaces"  # else the grades are marked unofficial
    assert {r["official"] for r in rows} == {"yes" if isolated else "no"}
    assert [float(rows[0][c]) for c in checks] == [c.points for c in ASSIGNMENT.checks] and rows[0]["notes"] == ""
    assert "spec_decoding/policies/theory.py was not submitted" in rows[1]["notes"]
    assert "No module named 'numpyy'" in rows[2]["notes"]
    progress = err.getvalue()
    assert "reference solution passes every check" in progress
    assert "[1/3] 100:" in progress and "[3/3] noimport@example.edu: 0/" in progress and "left)" in progress
    before = out.read_text()
    assert cli.main(["grade", NAME, "--submissions", str(archive), "--csv", str(out)]) == 2
    assert "exists: give a new file name" in err.getvalue() and out.read_text() == before


def test_batch_grades_a_folder_per_student_in_this_process(tmp_path):
    """A folder per student (hidden folders and stray files skipped), graded without workers."""
    from assignments.batch import grade_batch

    subs = tmp_path / "subs"
    for student in ("bob", "alice", ".hidden"):
        (subs / student).mkdir(parents=True)
    (subs / "README.txt").write_text("not a submission")
    for rel, text in reference_texts().items():
        (subs / "bob" / Path(rel).name).write_text(text)
    assert [(s.student, s.folder.name) for s in find_submissions(subs)] == [("alice", "alice"), ("bob", "bob")]
    reports = grade_batch(NAME, subs, tmp_path / "grades.csv", seed=1, file=io.StringIO())
    assert [r.points for r in reports] == [0, ASSIGNMENT.points]
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert [(r["student"], r["total"]) for r in rows] == [("alice", "0"), ("bob", f"{ASSIGNMENT.points:g}")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no submission folders"):
        find_submissions(tmp_path / "empty")


def test_batch_command_line_errors(tmp_path, capsys):
    """The assignment named either way; a missing name, an empty folder: one line each, exit 2."""
    (tmp_path / "empty").mkdir()
    for argv in (["grade", "--assignment", NAME, "--submissions", str(tmp_path / "empty")],
                 ["grade", NAME, "--submissions", str(tmp_path / "empty")]):
        assert cli.main(argv) == 2
        assert "holds no submission folders" in capsys.readouterr().err
    assert cli.main(["grade", "--submissions", str(tmp_path / "empty")]) == 2
    assert "with --submissions, name the assignment" in capsys.readouterr().err
    assert cli.main(["grade"]) == 2
    assert "give the student's copy to grade" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.csv")) and not list(Path.cwd().glob("grades-*.csv"))


def test_an_export_with_several_seeds_draws_one_per_run(tmp_path, zygote):
    """hidden.json holds each seed's references; every run of the autograder draws one of them
    (seen over runs: more than one) and says which in results.json's output, and its inputs are
    that seed's, never the visible ones."""
    from assignments.export import autograde, pick_references
    from assignments.references import VISIBLE_SEED, references

    source = gradescope_source(NAME, tmp_path / "source", seed=[3, 4], check_reference=False)
    hidden = json.loads((source / "hidden.json").read_text())
    assert sorted(hidden["seeds"]) == ["3", "4"]
    for seed in (3, 4):
        assert hidden["seeds"][str(seed)] == json.loads(json.dumps(references(ASSIGNMENT, source / "data", seed)))
    drawn = {pick_references(hidden)[1] for _ in range(40)}
    assert drawn == {3, 4}
    visible = {c.name: c.make_inputs(VISIBLE_SEED) for c in ASSIGNMENT.checks}
    assert all(entry["inputs"] != visible[name] for refs in hidden["seeds"].values() for name, entry in refs.items())
    submission = tmp_path / "submission"
    submission.mkdir()
    shutil.copyfile(ROOT / THEORY, submission / "theory.py")
    # one cheap check per run
    cut = {"seeds": {seed: {"tokens_per_round": refs["tokens_per_round"]} for seed, refs in hidden["seeds"].items()}}
    (source / "hidden.json").write_text(json.dumps(cut))
    results = tmp_path / "results" / "results.json"
    assert autograde(source, submission, results, zygote=zygote) == 0
    payload = json.loads(results.read_text())
    assert payload["tests"][0]["status"] == "passed", payload
    assert any(f"(Inputs: seed {seed}.)" in payload["output"] for seed in (3, 4)), payload["output"]


def test_emptied_lists_score_nothing_in_the_gradescope_layout(source, zygote, tmp_path):
    """The issue's attack in the Gradescope layout, every check: json.dumps replaced in the child
    so that every list sent back is [], every function returning a constant. It scored 10/10;
    now every test scores 0 and says what was sent."""
    from test_grader_verdicts import EMPTIED_JSON, EMPTY_LISTS, with_body

    from assignments.export import autograde

    texts = reference_texts()
    json_file, bodies = EMPTY_LISTS[NAME]
    for file, qualname, body in bodies:
        texts[file] = with_body(texts[file], qualname, body)
    texts[json_file] += EMPTIED_JSON
    autograder = layout(source, tmp_path, texts[THEORY], [c.name for c in ASSIGNMENT.checks])
    for rel, text in texts.items():
        (autograder / "submission" / Path(rel).name).write_text(text)
    results = autograder / "results" / "results.json"
    assert autograde(autograder / "source", autograder / "submission", results, zygote=zygote) == 0
    tests = json.loads(results.read_text())["tests"]
    assert [t["name"] for t in tests] == [c.name for c in ASSIGNMENT.checks]
    assert all(t["score"] == 0 and "values" in t["output"] and "sent 0 values" in t["output"] for t in tests), tests
