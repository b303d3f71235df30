"""`grade` and `check`: run each check's probe on the student's code in its own process, judge
the values it sends back here.

Where the student's code runs: a folder of the sandbox (assignments/sandbox.py: its own user,
and where the machine allows, its own namespaces and root folder) holding a fresh stripped copy
(made from the project by `make`, or shipped in the Gradescope export) with the student's
versions of the assignment's files put in, and nothing else. The child's cwd and sys.path point
there, its environment is scrubbed, and the grader's own cwd moves to a temporary folder.
Each check gets its own process and timeout; its stdout/stderr are captured and kept only in
part (shown truncated); its values come back on a pipe the grader opened, as JSON, and are judged
here against reference values the student's code never sees. A check whose child hangs, crashes
or sends nothing fails with a message saying so, and the other checks are not affected.
"""

import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .definition import Assignment, AssignmentError, Check, ChildRun, Failed, Unlikely, same_run
from .forms import parse, read
from .make import MANIFEST, ROOT, make, refuse_a_students_copy
from .memory import oom_kills, silent_end
from .printable import printable
from .references import (HIDDEN_SEED, VISIBLE_SEED, for_student, make_data, official_seed,  # noqa: F401
                         references, refuse_a_failing_seed)  # (HIDDEN_SEED, VISIBLE_SEED: for callers)
from .registry import assignment_of
from .sandbox import MAX_VALUES_BYTES, OFFICIAL, OUTPUT_HEAD, Sandbox
from .serving import NothingServed, Server, serve_in_thread
from .submission_files import files_read, read_submission, read_submitted, submitted_files


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
    draws: int = 1  # independent draws judged: 2 when a statistical check was graded again (second_draw)


@dataclass
class Report:
    assignment: str
    functions: list[str]
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # e.g. a submitted file that was missing
    isolation: dict | None = None  # how the student's code was shut in (sandbox.Isolation.to_json)
    unofficial: list[str] = field(default_factory=list)  # why this grade cannot be trusted, if it cannot
    seed: int | None = None  # the hidden inputs' seed (an official grade): `grade --seed N` reproduces it

    @property
    def official(self) -> bool:
        return not self.unofficial

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
        """The report as JSON; what the student's code wrote, escaped (printable)."""
        checks = [{**asdict(r), "message": printable(r.message), "output": printable(r.output)} for r in self.results]
        return {"assignment": self.assignment, "functions": self.functions, "passed": self.passed,
                "points": self.points, "max_points": self.max_points, "seconds": round(self.seconds, 1),
                "notes": [printable(n) for n in self.notes], "official": self.official, "seed": self.seed,
                "unofficial": self.unofficial, "isolation": self.isolation, "checks": checks}


# ------------------------------------------------------------------------------------------------
# One check in its own process (in the sandbox: assignments/sandbox.py)
# ------------------------------------------------------------------------------------------------

Zygote = Sandbox  # one zygote process per sandbox: the name callers know it by


def _truncated(head: str, tail: str, total: int, limit: int) -> str:
    if total <= limit:
        return head
    return f"{head}\n... [{total - limit - len(tail):,} characters left out] ...\n{tail}"


def run_child(tree: Path, check: Check, inputs, data: Path, timeout: float | None = None,
              zygote: Sandbox = None, server: Server | None = None) -> ChildRun:
    """Run the check's probe on the code in `tree` in a child forked in the sandbox; return what
    it sent back. Every process of the check is dead when this returns. server: what this
    process serves the probe while it runs (assignments/serving.py); what it counted is in the
    result's `served`."""
    timeout = timeout or check.timeout
    kills = oom_kills()  # the kernel's count: a check that ends in silence may have been killed for memory
    server = server or NothingServed()
    served_here, served_there = socket.socketpair()
    serving = serve_in_thread(server, served_here)
    try:
        end = zygote.run(check.name, tree, data, inputs, timeout, served=served_there)
    finally:
        served_there.close()
        served_here.shutdown(socket.SHUT_RDWR)  # the check's processes are dead: nothing more is served
        serving.join(10)
        served_here.close()
    run = ChildRun(seconds=end.seconds, extra={"exit_code": end.exit_code}, served=server.record())
    run.output = _truncated(*end.output, OUTPUT_HEAD)
    if end.killed_after:
        run.output += (f"\n[{end.killed_after} process(es) your code started were still running when the check "
                       f"ended: killed]")
    data_bytes, size = end.answer, end.answer_size
    if end.hung:
        run.error = f"did not finish within {timeout:g} s (an endless loop? a very slow loop?)"
    elif end.stuck:
        run.error = ("a process your code started kept the check's pipes open after it ended (and could not be "
                     f"killed: {', '.join(f'pid {pid} {command!r}' for pid, command in end.stuck)})")
    elif size > MAX_VALUES_BYTES:
        run.error = f"sent back {size:,} bytes of values (at most {MAX_VALUES_BYTES:,})"
    elif not data_bytes:
        run.error = silent_end(end.exit_code, kills, oom_kills())
    else:
        try:
            message = parse(data_bytes)  # depth-limited: never a RecursionError here
            if not isinstance(message, dict) or not ("values" in message or "error" in message):
                raise ValueError("not a probe's answer")
        except ValueError as error:
            run.error = (f"the check's answer was garbled ({str(error)[:200]}; did your code write to file "
                         f"descriptors it did not open?)")
        else:
            if "error" in message:
                run.error = str(message["error"])[:2000]
            else:
                run.values = message["values"]
    if end.out_of_memory and run.error is not None:  # the sandbox's memory limit ended (part of) it
        run.error = end.out_of_memory
    return run


def judge(check: Check, inputs, reference, run: ChildRun) -> CheckResult:
    """The verdict, decided here from the values the child sent back, once they are read against
    the check's form (assignments/forms.py): a judge never sees values of another form."""
    return judged(check, inputs, reference, run)[0]


def with_hint(check: Check, error: str | None) -> str | None:
    """A run's error message with the usual mistake behind it, where one of check.hints matches."""
    if error is None:
        return None
    for pattern, mistake in check.hints:
        if re.search(pattern, error):
            return f"{error}. The usual cause: {mistake}"
    return error


def judged(check: Check, inputs, reference, run: ChildRun) -> tuple[CheckResult, bool]:
    """(judge's verdict, whether it was a statistical one: Unlikely draws)."""
    passed, message, unlikely = False, with_hint(check, run.error), False
    if run.error is None:
        try:
            got = read(check.form(inputs, reference), run.values)  # parse, don't trust: Malformed is a Failed
            # a check with a server also gets what the server counted (in this process)
            check.judge(inputs, reference, got, *([run.served] if check.serve else []))
            passed, message = True, "ok"
        except Failed as failure:
            message, unlikely = str(failure), isinstance(failure, Unlikely)
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as error:
            # values of the wrong shape or type (from the student's functions' return values)
            message = f"your function returned something of the wrong type or shape ({type(error).__name__}: {error})"
    return CheckResult(check.name, list(check.exercises), check.points if passed else 0.0, check.points,
                       passed, message, check.visible, run.output, round(run.seconds, 2)), unlikely


def second_draw(first: CheckResult, second: CheckResult) -> CheckResult:
    """A statistical check's verdict from two independent draws, the first Unlikely: it passes if
    the second passes (a correct solution fails both with the square of the check's false-failure
    rate), and fails, with both messages, if the second fails too."""
    seconds = round(first.seconds + second.seconds, 2)
    if second.passed:
        message = f"ok on a second, independent draw (the first was unlikely: {first.message})"
    else:
        message = f"{first.message}; a second, independent draw failed too: {second.message}"
    return CheckResult(first.check, first.exercises, second.points, first.max_points, second.passed, message,
                       first.visible, second.output if second.passed else first.output, seconds, draws=2)


# ------------------------------------------------------------------------------------------------
# Data, references, trees
# ------------------------------------------------------------------------------------------------

def student_files(submission: Path, files: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The student's versions of the assignment's files: at their path in the submission, or
    (a submission of just the edited files) the one file of that name anywhere in it. Links,
    special files and hard links to files elsewhere are refused (submission_files.py)."""
    return submitted_files(submission, files)


class _InFolder:
    """Run the grader with its cwd in a temporary folder (a child could read its parent's cwd)."""

    def __init__(self, folder: Path):
        self.folder, self.previous = folder, None

    def __enter__(self):
        self.previous = os.getcwd()
        os.chdir(self.folder)

    def __exit__(self, *exc):
        os.chdir(self.previous)


def submission_seconds(checks, timeout: float | None = None) -> float:
    """A submission's time for all its checks: the longest one check may take."""
    return max((timeout or c.timeout for c in checks), default=0.0)


def not_run(check: Check, budget: float) -> CheckResult:
    return CheckResult(check.name, list(check.exercises), 0.0, check.points, False,
                       f"not run: the submission used its time ({budget:g} s for all its checks)", check.visible)


def grade_tree(assignment: Assignment, pristine: Path, files: dict[str, Path], data: Path, refs: dict,
               only: list[str] | None = None, timeout: float | None = None, notes=(),
               zygote: Sandbox | None = None, isolation: str = "auto", report: "Report | None" = None,
               on_result=None, budget: float | None = None) -> Report:
    """Grade the stripped copy `pristine` with the student's `files` put in. zygote: a sandbox to
    share between several gradings (else one is made for this one, at `isolation`). report: one
    to fill (its results so far survive an exception); on_result(report) is called after each
    check, once every process of that check is dead. budget: seconds for all the checks together
    (default submission_seconds): a check gets at most what is left, and once it is spent the
    checks left score 0, not run (a submission that hangs costs one timeout, not one a check)."""
    start = time.perf_counter()
    report = report or Report(assignment.name, list(assignment.functions))
    report.notes.extend(notes)
    with tempfile.TemporaryDirectory(prefix="grading-") as tmp, _InFolder(Path(tmp)):
        own = zygote is None
        zygote = Sandbox(pristine, isolation) if own else zygote
        report.isolation = zygote.isolation.to_json()
        tree = zygote.place_tree(pristine, files)
        try:
            data = zygote.place_data(data)
            checks = [c for c in assignment.checks if c.name in refs and not (only and c.name not in only)]
            budget = submission_seconds(checks, timeout) if budget is None else budget
            first = time.perf_counter()
            runs: dict = {}  # same_run(check, inputs) -> the child's run
            for check in checks:
                left = budget - (time.perf_counter() - first)
                if left <= 0:
                    report.results.append(not_run(check, budget))
                    continue
                entry = refs[check.name]
                result, unlikely = judged(check, entry["inputs"], entry["reference"],
                                          _run(tree, check, entry, data, runs, min(timeout or check.timeout, left),
                                               zygote))
                left = budget - (time.perf_counter() - first)
                if unlikely and "retry" in entry and left > 0:  # a statistical failure: a second draw decides
                    again = entry["retry"]
                    run = _run(tree, check, again, data, runs, min(timeout or check.timeout, left), zygote)
                    result = second_draw(result, judged(check, again["inputs"], again["reference"], run)[0])
                report.results.append(result)
                report.seconds = time.perf_counter() - start
                if on_result is not None:
                    on_result(report)
        finally:
            zygote.done_with(tree)
            if own:
                zygote.close()
    report.seconds = time.perf_counter() - start
    return report


def _run(tree: Path, check: Check, entry: dict, data: Path, runs: dict, timeout: float, zygote) -> ChildRun:
    """The child's run of `check` on entry's inputs, run once and kept in `runs` (checks judging
    one run share it; a served check's runs are its own, one per inputs)."""
    key = same_run(check, entry["inputs"]), json.dumps(entry["inputs"], sort_keys=True)
    if key not in runs:
        server = check.serve(entry["inputs"], entry["reference"], data) if check.serve else None
        runs[key] = run_child(tree, check, entry["inputs"], data, timeout, zygote, server)
    return runs[key]


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


def assignment_files(assignment: Assignment) -> list[str]:
    """The files the student edits (submission_files.files_read: the one list every grading reads)."""
    return files_read(assignment)


def manifest_disagrees(student: Path, assignment: Assignment) -> str | None:
    """A note when the submission's .assignment.json names another assignment than the one graded."""
    path = Path(student) / MANIFEST
    try:
        manifest = json.loads(read_submitted(path))
        named = manifest.get("assignment") or ", ".join(manifest.get("functions", []))
    except (OSError, ValueError, AttributeError, RecursionError):
        return None if not os.path.lexists(path) else f"the submission's {MANIFEST} is not a valid JSON file: ignored"
    mine = assignment.name or ", ".join(assignment.functions)
    if named and named != mine:
        return (f"the submission's {MANIFEST} names {named!r}, but this grader grades {mine!r}: graded as "
                f"{mine!r} (the copy's manifest never decides what is graded)")
    return None


def grade(student: Path, root: Path = ROOT, seed: int | None = None, timeout: float | None = None,
          only: list[str] | None = None, assignment: str | None = None, functions: list[str] | None = None,
          isolation: str = "auto", student_id: str | None = None) -> Report:
    """The instructor's grade of a student's copy (or a folder of just the edited files): every
    check, on hidden inputs (a fresh seed unless `seed` is given: the report records it),
    references from this project's code. What is graded is `assignment` (a ready-made one) or
    `functions` (a custom one), given by the instructor; without either it is read from the copy's
    .assignment.json, and the report is marked unofficial for it. student_id: whose copy it is,
    for an assignment whose copies differ per student (find_the_bug with a secret)."""
    from .registry import ASSIGNMENTS, custom_assignment

    refuse_a_students_copy(root, "grade")
    seed = official_seed(seed)
    unofficial = []
    if assignment is not None:
        if assignment not in ASSIGNMENTS:
            raise AssignmentError(f"no ready-made assignment {assignment!r}; they are {', '.join(sorted(ASSIGNMENTS))}")
        definition = ASSIGNMENTS[assignment]
    elif functions:
        definition = custom_assignment(list(functions))
    else:
        definition = assignment_of(read_manifest(student))
        unofficial.append("the assignment was read from the student's .assignment.json: pass --assignment NAME")
    if not Path(student).is_dir():
        raise AssignmentError(f"{student} is not a folder: give the student's copy or a folder of their files")
    files, notes = read_submission(Path(student), definition)
    disagreement = manifest_disagrees(student, definition)
    if disagreement:
        notes.insert(0, disagreement)
    report = Report(definition.name, list(definition.functions), unofficial=unofficial, seed=seed)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        tmp = Path(tmp)
        make(list(definition.functions), tmp / "pristine", root=root, assignment=definition.name,
             ship_visible=False)
        data = make_data(tmp / "data")
        refs = references(definition, data, seed, [c for c in definition.checks if not only or c.name in only])
        refuse_a_failing_seed(definition, data, refs, seed)  # else it fails every student who computes as it does
        grade_tree(definition, tmp / "pristine", files, data, for_student(definition, refs, student_id), only,
                   timeout, notes, isolation=isolation, report=report)
    return mark_isolation(report)


def mark_isolation(report: Report) -> Report:
    """An instructor's grade run with less than namespaces (as root, or a user namespace without
    it) is unofficial, saying why in one line: the student's code could read what every user of
    the machine can (your checkout, other submissions) or, not isolated at all, anything of yours."""
    if report.isolation["level"] not in OFFICIAL:
        report.unofficial.insert(0, report.isolation["line"])
    return report


def check_locally(copy: Path, only: list[str] | None = None, timeout: float | None = None,
                  zygote: Sandbox | None = None, isolation: str = "none") -> Report:
    """The student's own run inside their copy: the visible checks, against the reference values
    shipped with the copy (never rebuilt from the student's code). Not sandboxed by default: it
    is the student's own code on their own machine (and no user is made there)."""
    copy = Path(copy).resolve()
    manifest = read_manifest(copy)
    shipped = copy / ".assignment"
    if not (shipped / "visible.json").is_file():
        raise AssignmentError(f"{copy} has no .assignment/visible.json (the reference values for the "
                              f"visible checks): ask for a fresh copy")
    assignment = assignment_of(manifest)
    refs = json.loads((shipped / "visible.json").read_text())
    files = {rel: copy / rel for rel in manifest["files"]}
    report = grade_tree(assignment, copy, files, shipped / "data", refs, only, timeout, zygote=zygote,
                        isolation=isolation)
    report.isolation = None  # the student's own run: nothing to trust or distrust
    return report


# ------------------------------------------------------------------------------------------------
# Reports
# ------------------------------------------------------------------------------------------------

def print_report(report: Report, file=None, show_output: bool = True) -> None:
    """The report for a terminal; what the student's code wrote is escaped (printable): no escape
    sequence of theirs reaches the screen."""
    file = file or sys.stdout
    for note in report.notes:
        print(f"note: {printable(note)}", file=file)
    for r in report.results:
        print(f"[{'PASS' if r.passed else 'FAIL'}] {r.check} ({r.points:g}/{r.max_points:g} points, "
              f"{r.seconds:.1f} s; exercises {', '.join(r.exercises)}): {printable(r.message)}", file=file)
        if show_output and r.output.strip() and not r.passed:
            lines = printable(r.output).splitlines()[:60]
            print("    your code printed:\n" + "\n".join("    | " + line for line in lines), file=file)
    print(file=file)
    width = max(len(f) for f in report.functions)
    for function in report.functions:
        mine = [r for r in report.results if function in r.exercises]
        print(f"{function:{width}}  {sum(r.passed for r in mine)}/{len(mine)} checks", file=file)
    verdict = "ALL PASS" if report.passed else "NOT YET: fix the failing checks above"
    print(f"\n{verdict}: {report.points:g}/{report.max_points:g} points (graded in {report.seconds:.0f} s)",
          file=file)
    if report.seed is not None:
        print(f"Hidden inputs: seed {report.seed} (grade --seed {report.seed} runs the same inputs)", file=file)
    if report.isolation is not None:  # the instructor's grade: was it isolated, can it be trusted
        print(f"UNOFFICIAL: {'; '.join(report.unofficial)}" if report.unofficial else report.isolation["line"],
              file=file)
