"""`grade` and `check`: run each check's probe on the student's code in its own process, judge
the values it sends back here.

Where the student's code runs: a temporary folder holding a fresh stripped copy (made from the
project by `make`, or shipped in the Gradescope export) with the student's versions of the
assignment's files put in, and nothing else. The child's cwd and sys.path point there, its
environment is scrubbed, and the grader's own cwd moves to a temporary folder while it runs.
Each check gets its own process and timeout; its stdout/stderr are captured and kept only in
part (shown truncated); its values come back on a pipe the grader opened, as JSON, and are judged
here against reference values the student's code never sees. A check whose child hangs, crashes
or sends nothing fails with a message saying so, and the other checks are not affected.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .definition import Assignment, AssignmentError, Check, ChildRun, Failed
from .memory import killed_for_memory, oom_killed_between, oom_kills
from .make import IGNORE, MANIFEST, ROOT, make, refuse_a_students_copy
from .references import (HIDDEN_SEED, VISIBLE_SEED, make_data, references,  # noqa: F401  (VISIBLE_SEED: for callers)
                         refuse_a_failing_seed)
from .registry import assignment_of
from .serving import NothingServed, Server, serve_in_thread

OUTPUT_HEAD, OUTPUT_TAIL = 6000, 2000  # characters of a child's output kept (start and end)
MAX_VALUES_BYTES = 16 * 2**20  # a probe's answer larger than this is refused


@dataclass
class CheckResult:
    check: str
    exercises: list[str]
    points: float
    max_points: float
    passed: bool
    message: str
    visible: bool
    output: str = ""  # the student's code's stdout/stderr, truncated
    seconds: float = 0.0


@dataclass
class Report:
    assignment: str
    functions: list[str]
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. a submitted file that was missing

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)

    def to_json(self) -> dict:
        return {"assignment": self.assignment, "functions": self.functions, "passed": self.passed,
                "points": self.points, "max_points": self.max_points, "seconds": round(self.seconds, 1),
                "notes": self.notes, "checks": [asdict(r) for r in self.results]}


# ------------------------------------------------------------------------------------------------
# One check in its own process
# ------------------------------------------------------------------------------------------------

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


def _truncated(head: str, tail: str, total: int, limit: int) -> str:
    if total <= limit:
        return head
    return f"{head}\n... [{total - limit - len(tail):,} characters left out] ...\n{tail}"


def _read_all(fd: int, keep: list) -> None:
    data, size = [], 0
    with os.fdopen(fd, "rb") as pipe:
        for chunk in iter(lambda: pipe.read(65536), b""):
            size += len(chunk)
            if size <= MAX_VALUES_BYTES:
                data.append(chunk)
    keep.append((b"".join(data), size))


def child_env(home: Path) -> dict:
    """A scrubbed environment: nothing of the grader's (no PYTHONPATH, no paths to its tree)."""
    return {"PATH": os.defpath, "HOME": str(home), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1"}


class Zygote:
    """assignments/zygote.py, started in the grading tree: forks one child per check."""

    def __init__(self, tree: Path):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-E", "-s", "-m", "assignments.zygote", str(theirs.fileno())], cwd=tree,
            env=child_env(tree.parent), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()

    def fork(self, tree: Path, check: str, data: Path, stdin: int, output: int, answer: int, served: int) -> int:
        """The child's pid (it leads its own session; its cwd and sys.path[0] are `tree`)."""
        socket.send_fds(self.sock, [json.dumps({"check": check, "data": str(data), "tree": str(tree)}).encode()],
                        [stdin, output, answer, served])
        reply = self.sock.recv(4096)
        if not reply:
            raise OSError("the zygote process ended")
        return json.loads(reply)["pid"]

    def close(self):
        self.sock.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def run_child(tree: Path, check: Check, inputs, data: Path, timeout: float | None = None,
              zygote: Zygote | None = None, server: Server | None = None) -> ChildRun:
    """Run the check's probe on the code in `tree`, in a new process (forked from the zygote, or
    started afresh); return what it sent back. server: what this process serves the probe while
    it runs (assignments/serving.py); what it counted is in the result's `served`."""
    timeout = timeout or check.timeout
    kills = oom_kills()  # the kernel's count: a check that ends in silence may have been killed for memory
    server = server or NothingServed()
    answer_read, answer_write = os.pipe()
    served_here, served_there = socket.socketpair()
    if zygote is not None:
        stdin_read, stdin_write = os.pipe()
        output_read, output_write = os.pipe()
        pid = zygote.fork(tree, check.name, data, stdin_read, output_write, answer_write, served_there.fileno())
        start = time.perf_counter()
        for fd in (stdin_read, output_write, answer_write):
            os.close(fd)
        stdin, output_stream, process = os.fdopen(stdin_write, "wb"), os.fdopen(output_read, "rb"), None
    else:
        command = [sys.executable, "-E", "-s", "-m", "assignments.runner", check.name, str(data), str(answer_write),
                   str(served_there.fileno())]
        process = subprocess.Popen(command, cwd=tree, env=child_env(tree.parent), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   pass_fds=(answer_write, served_there.fileno()), start_new_session=True)
        os.close(answer_write)
        pid, stdin, output_stream = process.pid, process.stdin, process.stdout
        start = time.perf_counter()
    served_there.close()
    serving = serve_in_thread(server, served_here)
    output, answer = [], []
    threads = [threading.Thread(target=_drain, args=(output_stream, output, OUTPUT_HEAD)),
               threading.Thread(target=_read_all, args=(answer_read, answer))]
    for t in threads:
        t.start()
    try:
        stdin.write(json.dumps(inputs).encode())
        stdin.close()
    except BrokenPipeError:
        pass
    # Done when the child closed its ends of the pipes (it exited), or at the timeout.
    deadline = time.perf_counter() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    hung = any(t.is_alive() for t in threads)
    if hung:
        try:
            os.killpg(pid, signal.SIGKILL)  # the whole session: nothing the child started survives
        except ProcessLookupError:
            pass
        for t in threads:
            t.join(10)
    if process is not None:
        process.wait()
    served_here.shutdown(socket.SHUT_RDWR)  # the child is done: nothing more is served
    serving.join(10)
    served_here.close()
    run = ChildRun(seconds=time.perf_counter() - start, served=server.record())
    if output:
        head, tail, total = output[0]
        run.output = _truncated(head, tail, total, OUTPUT_HEAD)
    data_bytes, size = answer[0] if answer else (b"", 0)
    if hung:
        run.error = f"did not finish within {timeout:g} s (an endless loop? a very slow loop?)"
    elif size > MAX_VALUES_BYTES:
        run.error = f"sent back {size:,} bytes of values (at most {MAX_VALUES_BYTES:,})"
    elif not data_bytes and oom_killed_between(kills, oom_kills()):
        run.error = killed_for_memory()
    elif not data_bytes:
        run.error = ("the process ended before the check could report: did your code call exit(), "
                     "kill itself or crash Python?")
    else:
        try:
            message = json.loads(data_bytes)
            if not isinstance(message, dict) or not ("values" in message or "error" in message):
                raise ValueError("not a probe's answer")
        except ValueError:
            run.error = "the check's answer was garbled (did your code write to file descriptors it did not open?)"
        else:
            if "error" in message:
                run.error = str(message["error"])[:2000]
            else:
                run.values = message["values"]
    return run


def judge(check: Check, inputs, reference, run: ChildRun) -> CheckResult:
    """The verdict, decided here from the values the child sent back."""
    passed, message = False, run.error
    if run.error is None:
        try:
            # a check with a server also gets what the server counted (in this process)
            check.judge(inputs, reference, run.values, *([run.served] if check.serve else []))
            passed, message = True, "ok"
        except Failed as failure:
            message = str(failure)
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as error:
            # values of the wrong shape or type (from the student's functions' return values)
            message = f"your function returned something of the wrong type or shape ({type(error).__name__}: {error})"
    return CheckResult(check.name, list(check.exercises), check.points if passed else 0.0, check.points,
                       passed, message, check.visible, run.output, round(run.seconds, 2))


# ------------------------------------------------------------------------------------------------
# Data, references, trees
# ------------------------------------------------------------------------------------------------

def student_files(submission: Path, files: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The student's versions of the assignment's files: at their path in the submission, or
    (a submission of just the edited files) the one file of that name anywhere in it."""
    found, notes = {}, []
    for rel in files:
        path = submission / rel
        if not path.is_file():
            same_name = [p for p in submission.rglob(Path(rel).name) if p.is_file()]
            path = same_name[0] if len(same_name) == 1 else None
            if len(same_name) > 1:
                notes.append(f"{len(same_name)} files named {Path(rel).name} were submitted; put yours at {rel}")
        if path is None:
            notes.append(f"{rel} was not submitted: graded with the unedited (stripped) version")
        else:
            found[rel] = path
    return found, notes


def build_tree(pristine: Path, files: dict[str, Path], where: Path) -> Path:
    """The folder the student's code runs in: the stripped copy plus the student's files."""
    tree = where / "copy"
    shutil.copytree(pristine, tree, ignore=IGNORE)
    shutil.rmtree(tree / ".assignment", ignore_errors=True)  # shipped references: not the child's business
    for rel, path in files.items():
        shutil.copyfile(path, tree / rel)
    return tree


class _InFolder:
    """Run the grader with its cwd in a temporary folder (a child could read its parent's cwd)."""

    def __init__(self, folder: Path):
        self.folder, self.previous = folder, None

    def __enter__(self):
        self.previous = os.getcwd()
        os.chdir(self.folder)

    def __exit__(self, *exc):
        os.chdir(self.previous)


def grade_tree(assignment: Assignment, pristine: Path, files: dict[str, Path], data: Path, refs: dict,
               only: list[str] | None = None, timeout: float | None = None, notes=(),
               zygote: Zygote | None = None) -> Report:
    """Grade the stripped copy `pristine` with the student's `files` put in. zygote: one to share
    between several gradings of the same assignment (else one is started for this one)."""
    start = time.perf_counter()
    report = Report(assignment.name, list(assignment.functions), notes=list(notes))
    with tempfile.TemporaryDirectory(prefix="grading-") as tmp:
        tmp = Path(tmp)
        tree = build_tree(pristine, files, tmp)
        with _InFolder(tmp):
            own = zygote is None
            zygote = Zygote(tree) if own else zygote
            try:
                for check in assignment.checks:
                    if check.name not in refs or (only and check.name not in only):
                        continue
                    entry = refs[check.name]
                    server = check.serve(entry["inputs"], entry["reference"], data) if check.serve else None
                    run = run_child(tree, check, entry["inputs"], data, timeout, zygote, server)
                    report.results.append(judge(check, entry["inputs"], entry["reference"], run))
            finally:
                if own:
                    zygote.close()
    report.seconds = time.perf_counter() - start
    return report


def read_manifest(student: Path) -> dict:
    student = Path(student)
    if not student.is_dir():
        raise AssignmentError(f"{student} is not a folder: give the student's copy made by "
                              f"`python -m assignments make`")
    path = student / MANIFEST
    if not path.is_file():
        raise AssignmentError(f"{student} has no {MANIFEST}: it was not made by `python -m assignments make` "
                              f"(or the file was deleted; make a fresh copy and move the student's files in)")
    return json.loads(path.read_text())


def grade(student: Path, root: Path = ROOT, seed: int = HIDDEN_SEED, timeout: float | None = None,
          only: list[str] | None = None) -> Report:
    """The instructor's grade of a student's copy (or a folder of just the edited files plus the
    copy's .assignment.json): every check, hidden inputs, references from this project's code."""
    refuse_a_students_copy(root, "grade")
    manifest = read_manifest(student)
    assignment = assignment_of(manifest)
    files, notes = student_files(Path(student), manifest["files"])
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        tmp = Path(tmp)
        make(list(assignment.functions), tmp / "pristine", root=root, assignment=manifest["assignment"],
             ship_visible=False)
        data = make_data(tmp / "data")
        refs = references(assignment, data, seed, [c for c in assignment.checks if not only or c.name in only])
        refuse_a_failing_seed(assignment, data, refs, seed)  # else it fails every student who computes as it does
        return grade_tree(assignment, tmp / "pristine", files, data, refs, only, timeout, notes)


def check_locally(copy: Path, only: list[str] | None = None, timeout: float | None = None,
                  zygote: Zygote | None = None) -> Report:
    """The student's own run inside their copy: the visible checks, against the reference values
    shipped with the copy (never rebuilt from the student's code)."""
    copy = Path(copy).resolve()
    manifest = read_manifest(copy)
    shipped = copy / ".assignment"
    if not (shipped / "visible.json").is_file():
        raise AssignmentError(f"{copy} has no .assignment/visible.json (the reference values for the "
                              f"visible checks): ask for a fresh copy")
    assignment = assignment_of(manifest)
    refs = json.loads((shipped / "visible.json").read_text())
    files = {rel: copy / rel for rel in manifest["files"]}
    return grade_tree(assignment, copy, files, shipped / "data", refs, only, timeout, zygote=zygote)


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------

def print_report(report: Report, file=None, show_output: bool = True) -> None:
    file = file or sys.stdout
    for note in report.notes:
        print(f"note: {note}", file=file)
    for r in report.results:
        print(f"[{'PASS' if r.passed else 'FAIL'}] {r.check} ({r.points:g}/{r.max_points:g} points, "
              f"{r.seconds:.1f} s; exercises {', '.join(r.exercises)}): {r.message}", file=file)
        if show_output and r.output.strip() and not r.passed:
            print("    your code printed:\n" + "\n".join("    | " + line for line in r.output.splitlines()[:60]),
                  file=file)
    print(file=file)
    width = max(len(f) for f in report.functions)
    for function in report.functions:
        mine = [r for r in report.results if function in r.exercises]
        print(f"{function:{width}}  {sum(r.passed for r in mine)}/{len(mine)} checks", file=file)
    verdict = "ALL PASS" if report.passed else "NOT YET: fix the failing checks above"
    print(f"\n{verdict}: {report.points:g}/{report.max_points:g} points (graded in {report.seconds:.0f} s)",
          file=file)
