"""Autograders for course platforms.

Gradescope (`export gradescope NAME --out FILE.zip`): the zip unpacks into /autograder/source:
setup.sh and run_autograder (Gradescope's names), copy/ (the student's stripped copy: the grader
code and the project, no reference implementation), data/ (the checkpoints), hidden.json (every
check's inputs and reference values, computed here with the instructor's code). run_autograder
grades /autograder/submission (the whole copy, or just the edited files) and writes
/autograder/results/results.json, one test per check. The reference values are read and then
deleted from disk before any student code runs.

GitHub Classroom (`export github-classroom NAME --out DIR`): the starter repository (the copy,
with the visible checks' references) and .github/workflows/classroom.yml, one graded step per
visible check. Classroom has no hidden tests: the instructor grades the collected repositories
with `python -m assignments grade`.
"""

import json
import os
import signal
import tempfile
import zipfile
from pathlib import Path

from .definition import AssignmentError
from .make import ROOT, make
from .registry import ASSIGNMENTS

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, when the autograder image is built (Ubuntu base image).
set -euo pipefail
apt-get update && apt-get install -y python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
# torch's CPU build (the default one pulls CUDA, gigabytes the grader never uses)
/autograder/venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -r /autograder/source/copy/requirements.txt
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission (it copies it to /autograder/run_autograder, so the
# paths are /autograder's, not this file's): grade the submission, write results.json.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source/copy"
exec "${AUTOGRADER_PYTHON:-/autograder/venv/bin/python}" -m assignments autograde --source "$ROOT/source" \\
    --submission "$ROOT/submission" --results "$ROOT/results/results.json"
"""


def _new_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AssignmentError(f"{out} exists and is not an empty folder: give a new or empty folder "
                              f"(nothing there is overwritten)")


def gradescope_source(name: str, source: Path, seed: int, root: Path = ROOT) -> Path:
    """Lay out what Gradescope unpacks into /autograder/source."""
    from .references import make_data, references

    assignment = ASSIGNMENTS[name]
    make(list(assignment.functions), source / "copy", root=root, assignment=name, ship_visible=False)
    data = make_data(source / "data")
    (source / "hidden.json").write_text(json.dumps(references(assignment, data, seed)))
    for script, text in (("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER)):
        (source / script).write_text(text)
        (source / script).chmod(0o755)
    return source


def export_gradescope(name: str, out: Path, seed: int = 1, root: Path = ROOT) -> Path:
    out = Path(out)
    if out.suffix != ".zip":
        raise AssignmentError(f"{out}: give a .zip file name (Gradescope takes the autograder as a zip)")
    if out.exists():
        raise AssignmentError(f"{out} exists: give a new file name (nothing is overwritten)")
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        source = gradescope_source(name, Path(tmp) / "source", seed, root)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    info = zipfile.ZipInfo.from_file(path, path.relative_to(source).as_posix())
                    archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    return out


class Interrupted(Exception):
    """The grader was sent SIGTERM (e.g. the platform's time limit)."""


def _on_sigterm(signum, frame):
    raise Interrupted()


def write_results(results: Path, payload: dict) -> None:
    """results.json, atomically (a temporary file renamed over it): never half written."""
    temporary = results.parent / f".{results.name}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, results)


def autograde(source: Path, submission: Path, results: Path, zygote=None, isolation: str = "auto") -> int:
    """Gradescope's run: grade the submission against hidden.json, write results.json. Always
    writes a results.json (a failure to grade is reported in it), and returns 0. What is graded is
    the export's own assignment (source/copy/.assignment.json, written by `export`), never what
    the submission's files say. results.json is written by this process only, after every process
    of a check is dead: after each check (so a killed grader leaves the verdicts it had) and at the
    end; on SIGTERM it writes what it has. zygote: a sandbox to reuse (grade.Zygote), else one is
    made at `isolation`."""
    from .grade import Report, assignment_files, grade_tree, manifest_disagrees, student_files
    from .make import MANIFEST
    from .registry import assignment_of

    source, results = Path(source).resolve(), Path(results).resolve()
    results.parent.mkdir(parents=True, exist_ok=True)
    report = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        hidden = source / "hidden.json"
        refs = json.loads(hidden.read_text())
        hidden.unlink()  # in memory now; the student's code runs after this and cannot read it
        assignment = assignment_of(json.loads((source / "copy" / MANIFEST).read_text()))
        files, notes = student_files(Path(submission), assignment_files(assignment))
        disagreement = manifest_disagrees(Path(submission), assignment)
        report = Report(assignment.name, list(assignment.functions), notes=[disagreement] if disagreement else [])
        grade_tree(assignment, source / "copy", files, source / "data", refs, notes=notes, zygote=zygote,
                   isolation=isolation, report=report,
                   on_result=lambda so_far: write_results(results, _payload(so_far, complete=False)))
        payload = _payload(report, complete=True)
    except Interrupted:
        payload = _payload(report, complete=False) if report else {
            "score": 0, "output": "The autograder was stopped (SIGTERM) before it graded anything.", "tests": []}
    except (OSError, ValueError, AssignmentError) as error:
        payload = {"score": 0, "output": f"The autograder could not grade this submission: {error}",
                   "tests": []}
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_results(results, payload)
    return 0


def _payload(report, complete: bool) -> dict:
    from .grade import gradescope_results

    payload = gradescope_results(report)
    extra = []
    if not complete:
        extra.append(f"Grading stopped after {len(report.results)} check(s): the verdicts so far are above.")
    if report.isolation and report.isolation["level"] == "none":
        extra.append("UNOFFICIAL: " + report.isolation["line"])
    if extra:
        payload["output"] = "\n".join([payload["output"], *extra])
    return payload


WORKFLOW_HEAD = """name: Autograding Tests
on: [push, workflow_dispatch, repository_dispatch]
permissions:
  checks: write
  actions: read
  contents: read
jobs:
  run-autograding-tests:
    runs-on: ubuntu-latest
    if: github.actor != 'github-classroom[bot]'
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install
        run: |
          pip install torch --index-url https://download.pytorch.org/whl/cpu
          pip install -r requirements.txt
"""

STEP = """      - name: {name}
        id: {id}
        uses: classroom-resources/autograding-command-grader@v1
        with:
          test-name: {name}
          command: python -m assignments check --only {name}
          timeout: {minutes}
          max-score: {points}
"""


def export_github_classroom(name: str, out: Path, root: Path = ROOT) -> Path:
    out = Path(out)
    _new_folder(out)
    assignment = ASSIGNMENTS[name]
    make(list(assignment.functions), out, root=root, assignment=name)
    visible = [c for c in assignment.checks if c.visible]
    steps = "".join(STEP.format(name=c.name, id=c.name.replace("_", "-"), points=int(c.points),
                                minutes=max(1, int(c.timeout // 60) + 1)) for c in visible)
    env = "".join(f"          {c.name.upper()}_RESULTS: \"${{{{steps.{c.name.replace('_', '-')}.outputs.result}}}}\"\n"
                  for c in visible)
    reporter = ("      - name: Autograding Reporter\n"
                "        uses: classroom-resources/autograding-grading-reporter@v1\n"
                f"        env:\n{env}"
                "        with:\n"
                f"          runners: {','.join(c.name.replace('_', '-') for c in visible)}\n")
    workflow = out / ".github" / "workflows" / "classroom.yml"
    workflow.parent.mkdir(parents=True, exist_ok=True)
    for old in workflow.parent.glob("*.yml"):
        if old != workflow:
            old.unlink()  # the project's own CI would run the instructor's (dropped) tests
    workflow.write_text(WORKFLOW_HEAD + steps + reporter)
    return out
