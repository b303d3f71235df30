"""Batch grading: every submission in a folder, graded on one build, into one CSV.

    python -m assignments grade ASSIGNMENT --submissions DIR [--csv FILE] [--seed N] [--jobs N]

DIR holds a folder per student (the folder's name is the student's id in the CSV), or is
Gradescope's "Export Submissions" download (its .zip, or the folder holding its
submission_metadata.yml): the metadata beside a folder per submission (submission_<id>/), naming
each folder's submitters (:name, :sid, :email). Only the metadata at DIR's top is read, and only
for DIR's own sub-folders: every sub-folder is one row, whatever a file inside it says. In each
submission the assignment's files (submission_files.files_read, as for a single grade) are found
by their path, or by name when only one file has that name.

The stripped copy, the checkpoints, the hidden inputs and their reference values are built once,
the instructor's own solution is checked on them first (a seed it fails is refused), and one
sandbox (sandbox.py: its user, its zygote process) serves every submission, one per worker
process with --jobs; each submission is then graded as `grade` grades one (its own tree, a
process per check). The CSV gets a row per submission as soon as it is graded (flushed to disk),
so an interrupted run keeps what it did. Nothing one submission does stops the batch: a refused
file, a hang (its checks share one timeout: grade.submission_seconds), a crash, memory exhausted,
an answer the grader cannot read, any exception while grading it, each ends as a note in its row.
Each row also says how much of the submission is the project's own solution (upstream.py).
"""

import csv
import json
import multiprocessing
import multiprocessing.util
import os
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from .definition import AssignmentError
from .export import write_private
from .make import ROOT, make, refuse_a_students_copy
from .registry import ASSIGNMENTS
from .printable import printable
from .sandbox import OFFICIAL
from .submission_files import RefusedSubmission
from .upstream import describe, similarity_to_reference

GRADESCOPE_METADATA = "submission_metadata.yml"


@dataclass
class Submission:
    student: str  # the id in the CSV: the submitters' ids (Gradescope), else the folder's name
    name: str  # the submitters' names, where known
    folder: Path
    notes: list[str] = field(default_factory=list)  # what the grader noted finding it (the metadata)


def _gradescope_yaml(text: str) -> dict:
    """Gradescope's metadata: YAML written by Ruby (keys like ':submitters'; objects may carry
    Ruby tags, read here as plain mappings). A ValueError saying what is wrong when it is not
    YAML, or not a mapping at its top."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def untagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node, deep=True)
        return loader.construct_scalar(node)

    Loader.add_multi_constructor("!", untagged)
    try:
        records = yaml.load(text, Loader=Loader) or {}
    except (yaml.YAMLError, RecursionError, TypeError) as error:  # TypeError: an unhashable key
        raise ValueError(f"not valid YAML ({' '.join(str(error).split())[:200]})") from None
    if not isinstance(records, dict):
        raise ValueError(f"its top is a {type(records).__name__}, not a mapping of submission folders")
    return records


def _submitters(record) -> tuple[str, str]:
    """(the submitters' ids joined with +, their names) of one metadata record; ("", "") for
    anything not of Gradescope's form."""
    people = record.get(":submitters") if isinstance(record, dict) else None
    people = people if isinstance(people, list) else []
    ids = [str(p.get(":sid") or p.get(":email") or p.get(":name") or "") for p in people if isinstance(p, dict)]
    names = [str(p.get(":name") or "") for p in people if isinstance(p, dict)]
    return "+".join(i for i in ids if i), "+".join(n for n in names if n)


def _student_folders(folder: Path) -> list[Path]:
    """Every sub-folder of the submissions folder (its hidden ones and links left out): each one
    student's submission, and each gets exactly one row."""
    return [p for p in sorted(folder.iterdir()) if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
            and p.name != GRADESCOPE_METADATA]


def _read_metadata(path: Path) -> tuple[dict | None, str | None]:
    """(the records of Gradescope's metadata at `path`, None) or (None, why it cannot be used)."""
    from .submission_files import RefusedSubmission, read_submitted

    try:
        text = read_submitted(path, limit=64 * 2**20).decode("utf-8", errors="replace")
        return _gradescope_yaml(text), None
    except (RefusedSubmission, OSError, ValueError) as error:
        return None, printable(error, newlines=False)[:300]


def _export_top(unzipped: Path) -> Path:
    """The top of an unzipped export: Gradescope's zip holds one folder (assignment_<n>_export/)
    with the metadata at its top; any other zip is its own top."""
    entries = list(unzipped.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / GRADESCOPE_METADATA).is_file():
        return entries[0]
    return unzipped


def find_submissions(folder: Path) -> list[Submission]:
    """The submissions in `folder`: one per sub-folder (its name the student's id), each exactly
    once. Where the folder is Gradescope's export (a submission_metadata.yml at its top: only
    there, never in a student's folder), the metadata names each folder's submitters: a key of it
    counts only when it is the plain name of one of these sub-folders (no path, no '..', no link:
    nothing outside `folder` is ever graded). Metadata that cannot be read, and folders it does
    not name, are noted on the rows they concern."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AssignmentError(f"{folder} is not a folder (give a folder of submissions, or Gradescope's "
                              f"export .zip)")
    folders = _student_folders(folder)
    if not folders:
        raise AssignmentError(f"{folder} holds no submission folders (one folder per student, or Gradescope's "
                              f"export with its {GRADESCOPE_METADATA})")
    metadata = folder / GRADESCOPE_METADATA
    if not os.path.lexists(metadata):
        return [Submission(p.name, "", p) for p in folders]
    records, why = _read_metadata(metadata)
    if records is None:
        note = f"{GRADESCOPE_METADATA} could not be read ({why}): the folder's name is the student's id"
        return [Submission(p.name, "", p, [note]) for p in folders]
    by_name = {str(key): record for key, record in records.items()}
    submissions = []
    for path in folders:
        if path.name not in by_name:
            submissions.append(Submission(path.name, "", path, [f"{GRADESCOPE_METADATA} does not name this folder: "
                                                               f"the folder's name is the student's id"]))
            continue
        student, name = _submitters(by_name[path.name])
        notes = [] if student else [f"{GRADESCOPE_METADATA} names no submitter of this folder: the folder's name "
                                    f"is the student's id"]
        submissions.append(Submission(student or path.name, name, path, notes))
    return submissions


def _count(n: int) -> str:
    return f"{n} submission" + ("" if n == 1 else "s")


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet takes as the start of a formula


def csv_cell(text) -> str:
    """One CSV cell of text that came from a submission (an id, a name, a folder's name, a note):
    escaped (printable), and neutralised when a spreadsheet would read it as a formula (it starts
    with = + - @, a tab or a carriage return): a leading ' makes it text, as spreadsheets do."""
    shown = printable(text, newlines=False)
    return "'" + shown if shown.startswith(FORMULA_STARTS) else shown


def notes_of(report) -> str:
    """The CSV's notes: what the grader noted about the submission, then each failed check's
    message; one line, escaped (printable: nothing of the student's reaches a terminal raw)."""
    failed = [f"{r.check}: {' '.join(r.message.split())[:200]}" for r in report.results if not r.passed]
    return csv_cell("; ".join([*report.notes, *failed]))


class _Grader:
    """Grades submissions on one build (the stripped copy, checkpoints, references) in one
    sandbox: in this process, or in each worker process of a --jobs run."""

    def __init__(self, name: str, pristine: Path, data: Path, refs: dict,
                 timeout: float | None, isolation: str, submissions: Path, root: Path = ROOT,
                 memory: int | None = None):
        self.assignment, self.pristine, self.data, self.refs = ASSIGNMENTS[name], pristine, data, refs
        self.timeout, self.isolation, self.submissions = timeout, isolation, submissions
        self.root, self.memory = root, memory
        self.sandbox = self._new_sandbox()

    def _new_sandbox(self):
        from .sandbox import Sandbox

        # the other students' submissions are not the child's to see
        return Sandbox(self.pristine, self.isolation, hidden=[self.submissions], memory=self.memory)

    def grade(self, folder: Path, student: str | None = None, notes=()) -> tuple:
        """(the report, its similarity to the reference bodies) of one submission (student: whose
        copy it is, for find_the_bug's per-student bugs; notes: the batch's about it). Nothing the
        submission does stops the batch: whatever is raised while grading it becomes a note on its row (its checks graded so
        far keep their verdicts, the others score 0), and a sandbox broken by it is replaced for
        the next one."""
        from .grade import Report, grade_tree, mark_isolation
        from .references import for_student
        from .submission_files import read_submission

        report = Report(self.assignment.name, list(self.assignment.functions), notes=list(notes),
                        isolation=self.sandbox.isolation.to_json())
        copied, start = {}, time.perf_counter()
        try:
            found, notes = read_submission(folder, self.assignment)
            copied = similarity_to_reference(self.assignment, found, self.root)
            refs = for_student(self.assignment, self.refs, student)  # find_the_bug: the bug in that student's copy
            grade_tree(self.assignment, self.pristine, found, self.data, refs, timeout=self.timeout,
                       notes=notes, zygote=self.sandbox, report=report)
        except RefusedSubmission as refused:
            report.notes.append(str(refused))
        except Exception as error:  # noqa: BLE001  (one student's submission never stops the class)
            why = printable(error, newlines=False)[:500]
            report.notes.append(f"could not be graded: {type(error).__name__}: {why}")
            if not self.sandbox.alive():
                self.sandbox.close()
                self.sandbox = self._new_sandbox()
        report.seconds = time.perf_counter() - start
        return mark_isolation(report), copied


_WORKER: _Grader | None = None  # a --jobs worker process's grader


def _start_worker(name, pristine, data, refs_file, timeout, isolation, submissions, root, memory) -> None:
    global _WORKER
    _WORKER = _Grader(name, pristine, data, json.loads(Path(refs_file).read_text()), timeout, isolation,
                      submissions, root, memory)
    # closed (and waited for) when the worker ends, as the pool closes
    multiprocessing.util.Finalize(_WORKER, _WORKER.sandbox.close, exitpriority=10)


def _grade_in_worker(submission: tuple):
    return _WORKER.grade(*submission)


def grade_batch(name: str, submissions: Path, out: Path, seed: int, root: Path = ROOT,
                timeout: float | None = None, jobs: int = 1, isolation: str = "auto", file=None,
                memory: int | None = None) -> list:
    """Grade every submission in `submissions` for assignment `name`; write `out` (CSV: student,
    name, submission, each check's points, total, max, official, seconds, similar_to_reference,
    notes: see COLUMNS and upstream.py); progress on `file`
    (stderr). jobs: submissions graded at once, each by a worker process with a sandbox of its
    own (a check's process uses one core). isolation: the sandbox's level (sandbox.py). memory:
    bytes the processes of one check may use together (memory.SandboxMemory; default: its own).
    Returns the reports, in the CSV's order."""
    from .references import make_data, references, refuse_a_failing_seed

    file = file or sys.stderr
    out, submissions = Path(out), Path(submissions)
    if name not in ASSIGNMENTS:
        raise AssignmentError(f"no ready-made assignment {name!r}; they are {', '.join(sorted(ASSIGNMENTS))}")
    if out.exists():
        raise AssignmentError(f"{out} exists: give a new file name for the grades (nothing is overwritten)")
    if jobs < 1:
        raise AssignmentError(f"--jobs {jobs}: give 1 or more")
    refuse_a_students_copy(root, "grade")
    assignment = ASSIGNMENTS[name]
    with tempfile.TemporaryDirectory(prefix="batch-") as tmp:
        tmp = Path(tmp)
        if submissions.suffix == ".zip" and submissions.is_file():
            with zipfile.ZipFile(submissions) as archive:
                archive.extractall(tmp / "submissions")
            submissions = _export_top(tmp / "submissions")
        found = find_submissions(submissions)
        start = time.perf_counter()
        print(f"Grading {_count(len(found))} of {name}: building the copy, checkpoints and reference "
              f"values once ...", file=file)
        pristine = tmp / "pristine"
        make(list(assignment.functions), pristine, root=root, assignment=name, ship_visible=False)
        data = make_data(tmp / "data")
        refs = references(assignment, data, seed)
        refuse_a_failing_seed(assignment, data, refs, seed)
        grader = _Grader(name, pristine, data, refs, timeout, isolation, submissions.resolve(), root, memory)
        pool = None
        try:
            print(f"Built, and the reference solution passes every check at seed {seed} "
                  f"({_duration(time.perf_counter() - start)}).", file=file)
            line = grader.sandbox.isolation.line()
            print(line if grader.sandbox.isolation.level in OFFICIAL else f"UNOFFICIAL: {line}", file=file)
            print(grader.sandbox.memory.line(grader.sandbox.isolation.level != "none"), file=file)
            print(grader.sandbox.cpu.line(), file=file)
            if jobs > 1:
                write_private(tmp / "refs.json", json.dumps(refs))  # in a 0700 folder: 0600 besides
                # spawned, not forked: this process has torch's threads running
                pool = multiprocessing.get_context("spawn").Pool(
                    jobs, _start_worker, (name, pristine, data, tmp / "refs.json", timeout, isolation,
                                          submissions.resolve(), root, memory))
                graded = pool.imap(_grade_in_worker, [(s.folder, s.student, s.notes) for s in found])
            else:
                graded = (grader.grade(s.folder, s.student, s.notes) for s in found)
            reports = _write_csv(out, assignment, found, graded, jobs, file)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
            grader.sandbox.close()
    print(f"Graded {_count(len(found))} in {_duration(time.perf_counter() - start)}.", file=file)
    return reports


COLUMNS = ("student", "name", "submission", "total", "max", "official", "seconds", "similar_to_reference", "notes")


def _write_csv(out: Path, assignment, found: list[Submission], graded, jobs: int, file) -> list:
    """Write a row per report as it comes, flushed to disk (a batch killed midway keeps every row
    it finished), with progress. Every cell of text is escaped and neutralised (csv_cell): the
    ids, names and folder names come from the submissions too. The file is the instructor's
    alone (0600) while the batch runs: no submission's code reads the grades before it."""
    checks = [c.name for c in assignment.checks]
    first, reports = time.perf_counter(), []
    cell = csv_cell
    with os.fdopen(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), "w", newline="") as handle:
        writer = csv.writer(handle)

        def row(cells):
            writer.writerow(cells)
            handle.flush()
            os.fsync(handle.fileno())

        row([*COLUMNS[:3], *checks, *COLUMNS[3:]])
        for i, (submission, (report, copied)) in enumerate(zip(found, graded), 1):
            reports.append(report)
            points = {r.check: r.points for r in report.results}
            row([cell(submission.student), cell(submission.name), cell(submission.folder.name),
                 *[f"{points.get(c, 0):g}" for c in checks], f"{report.points:g}", f"{assignment.points:g}",
                 "yes" if report.official else "no", f"{report.seconds:.1f}", cell(describe(copied)), notes_of(report)])
            per = (time.perf_counter() - first) / i
            print(f"[{i}/{len(found)}] {printable(submission.student, newlines=False)}: "
                  f"{report.points:g}/{assignment.points:g} "
                  f"({_duration(report.seconds)}; about {_duration(per * (len(found) - i))} left)", file=file)
    return reports
