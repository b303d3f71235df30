"""What an assignment is: the functions the student writes, what else `make` takes out of the
copy, and its checks, each with points, visible or hidden, and the functions it exercises.

A check has three halves, so that the student's code never decides its own verdict:
- make_inputs(seed) -> inputs (JSON): made in the grader's process; the seed differs between
  the visible inputs (shipped with the copy) and the hidden ones (the instructor's grade).
- probe(inputs, data) -> values (JSON): runs in a child process inside the student's copy. It
  calls the student's functions on the inputs and returns what they gave, raw: tokens, numbers,
  sample counts. It judges nothing.
- form(inputs, reference) -> forms.Form: the exact form of the values the probe sends back
  (types, lengths and shapes, ranges: assignments/forms.py). The grader reads the values against
  it before the judge sees them, so a judge only ever gets well-formed values.
- judge(inputs, reference, got): runs in the grader's process. It compares the values with the
  reference (the same probe run on the instructor's code, or the check's own `reference`) and
  raises Failed with a message in plain words when they disagree.
"""

import json
from dataclasses import dataclass, field
from typing import Callable


class AssignmentError(ValueError):
    """Bad input to make/grade/export: the message says what was wrong and how to fix it."""


class Failed(Exception):
    """A check's verdict, in plain words for the student."""


class Unlikely(Failed):
    """A statistical verdict: the values drawn are unlikely under the exact law (a test's p-value
    below its threshold). A correct solution gets one with the check's false-failure rate, so a
    statistical check that raises it is graded again on a second, independent draw, and fails
    only if that fails too (grade.grade_tree, references.failing_checks)."""


@dataclass(frozen=True)
class Check:
    name: str
    exercises: tuple[str, ...]  # the student's functions it calls (dotted names)
    make_inputs: Callable  # (seed) -> inputs
    probe: Callable  # (inputs, data: Path) -> values; in the student's process
    judge: Callable  # (inputs, reference, got) -> None, or raise Failed
    form: Callable  # (inputs, reference) -> forms.Form: what `got` must be before it is judged
    points: float = 1.0
    visible: bool = True  # also run by the student's local `python -m assignments check`
    reference: Callable | None = None  # (inputs, data) -> values; default: the probe on the instructor's code
    timeout: float = 60.0  # seconds for this check's child process
    about: str = ""  # one line for the report
    # (inputs, reference, data) -> a serving.Server: what the grader serves the probe while it runs
    # (a target model whose forwards it counts); the judge then gets a 4th argument, what the
    # server counted: judge(inputs, reference, got, served)
    serve: Callable | None = None
    # (inputs, reference, student id) -> the reference for that student's own copy (find_the_bug:
    # the bug planted in it); references.for_student applies it
    personal: Callable | None = None
    # judged by a test of its draws (its judge may raise Unlikely): the references also hold a
    # second, independent draw (references.second_seed), graded when the first is Unlikely
    statistical: bool = False
    # A run that ended in an error (an exception, a time-out): (regular expression on its message,
    # the usual mistake behind it, in the student's words), the first match added to the message.
    # Text only: the verdict is the same with or without it.
    hints: tuple[tuple[str, str], ...] = ()


def same_run(check: Check, inputs) -> tuple | str:
    """What makes two checks' runs the same: the probe, its inputs (as JSON) and the timeout.
    Checks that judge one run in different ways (rejection_sampling's first token, second token
    and acceptance rate) then share one run: the grader runs the student's code once, in one
    child, and every judge reads the same values. A check with a server has a run of its own (what
    the server counts is judged per check): its name."""
    if check.serve is not None:
        return check.name
    return check.probe, json.dumps(inputs, sort_keys=True), check.timeout


@dataclass(frozen=True)
class Assignment:
    name: str
    functions: tuple[str, ...]  # what the student writes
    checks: tuple[Check, ...]
    # Functions whose bodies `make` removes too because they would answer the assignment (a
    # sibling that does the same work, a thin wrapper): they raise "removed in this assignment".
    removed: tuple[str, ...] = ()
    # Files and folders left out of the copy: notebooks that walk through the code, ... (the
    # instructor's tests and notes are always left out: see make.ALWAYS_DROPPED).
    dropped: tuple[str, ...] = ()
    readme: str = ""  # path of the README, relative to the project
    # A "find the bug" assignment: make plants a bug into the copy instead of removing bodies.
    # plant(out, root) edits the copy at `out` (made from the project at `root`); the named
    # functions keep their bodies (the bug is in one of them).
    plant: Callable | None = None
    # Files the student writes besides the functions' files (find_the_bug: BUG.txt, the bug's name).
    answer_files: tuple[str, ...] = ()

    @property
    def points(self) -> float:
        return sum(c.points for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


def as_floats(values) -> list:
    """Tensors as nested lists of floats, for the JSON the probe returns."""
    return values.detach().double().tolist()


@dataclass
class ChildRun:
    """What one check's child process left: its values, or why there are none."""

    values: object = None
    error: str | None = None  # the student's code raised, hung, crashed or sent nothing
    output: str = ""  # the child's stdout and stderr, truncated
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    served: dict = field(default_factory=dict)  # what the check's server counted (serving.Server.record)
