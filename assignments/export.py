"""Autograders for course platforms.

Gradescope (`export gradescope NAME --out FILE.zip`): the zip unpacks into /autograder/source:
setup.sh and run_autograder (Gradescope's names), copy/ (the student's stripped copy: the grader
code and the project, no reference implementation), data/ (the checkpoints), hidden.json (every
check's inputs and reference values, computed here with the instructor's code, after checking that
the instructor's solution passes every check on them). run_autograder grades
/autograder/submission (the whole copy, or just the edited files) and writes
/autograder/results/results.json, one test per check, the hidden ones shown only once the grades
are published. The reference values are read and then deleted from disk before any student code
runs.

GitHub (`export github NAME --out DIR`): the starter repository (the copy, with the visible
checks' references and checkpoints, committed) and .github/workflows/checks.yml, a plain GitHub
Actions workflow that runs the visible checks and writes their table to the job summary.
GitHub Classroom's autograding actions are deprecated (Classroom was sunset); the hidden checks
are the instructor's: `python -m assignments grade NAME --submissions DIR` over the collected
repositories.
"""

import json
import os
import signal
import sys
import tempfile
import zipfile
from pathlib import Path

from .definition import AssignmentError
from .make import ROOT, make
from .printable import printable
from .registry import ASSIGNMENTS
from .sandbox import USER as SANDBOX_USER
from .submission_files import read_submission

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when the autograder image is built (Ubuntu base image).
set -euo pipefail
apt-get update && apt-get install -y python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
# torch's CPU build, the version the reference values were computed with (the default build pulls
# CUDA, gigabytes the grader never uses)
/autograder/venv/bin/pip install torch==TORCH_VERSION --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -r /autograder/source/copy/requirements.txt
# The hidden inputs and reference values: root's alone (the grader runs as root and deletes the
# file once read; each check's process runs as an unprivileged user, see the instructor guide).
chmod 600 /autograder/source/hidden.json
# That user, made once with the image (assignments/sandbox.py makes it the same way when absent)
id -u SANDBOX_USER >/dev/null 2>&1 || useradd --system --user-group --no-create-home --home-dir /nonexistent \\
    --shell /usr/sbin/nologin SANDBOX_USER
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this as root for every submission (it copies it to /autograder/run_autograder,
# so the paths are /autograder's, not this file's). The grader runs as root; it runs each check's
# process as an unprivileged user and writes results.json itself, after the checks' processes ended.
# Nothing of the grade is the student's code's to read before it is published: the grader's
# files (source/, the submission, Gradescope's metadata, results/) are root's alone (0700 folders,
# 0600 files); the Python in /autograder/venv stays readable, the sandbox user runs it.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
RESULTS="$ROOT/results/results.json"
PARTIAL="$ROOT/results/.partial.json"  # the verdicts so far, published below if the grader died
umask 077
mkdir -p "$ROOT/results"
chmod 700 "$ROOT/results" "$ROOT/source" "$ROOT/submission"
[ -e "$ROOT/submission_metadata.json" ] && chmod 600 "$ROOT/submission_metadata.json"
rm -f "$RESULTS" "$PARTIAL"  # only what this run's grader writes counts
cd "$ROOT/source/copy"
"${AUTOGRADER_PYTHON:-/autograder/venv/bin/python}" -m assignments autograde --source "$ROOT/source" \\
    --submission "$ROOT/submission" --results "$RESULTS"
status=$?
if [ ! -s "$RESULTS" ] && [ -s "$PARTIAL" ]; then
    mv "$PARTIAL" "$RESULTS"  # the grader died after some checks: their verdicts
elif [ ! -s "$RESULTS" ]; then
    # The grader itself died (out of memory?): Gradescope gets a zero with a reason, not nothing.
    printf '{"score": 0, "output": "The autograder stopped before it could grade this submission (exit status %s). Resubmit, or tell your instructor.", "tests": []}\\n' "$status" > "$RESULTS"
fi
"""


def _new_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AssignmentError(f"{out} exists and is not an empty folder: give a new or empty folder "
                              f"(nothing there is overwritten)")


def gradescope_source(name: str, source: Path, seed: int | list[int], root: Path = ROOT,
                      check_reference: bool = True) -> Path:
    """Lay out what Gradescope unpacks into /autograder/source, after checking that the reference
    solution passes every check at this seed (check_reference=False: a caller that graded it on
    these very inputs already). Several seeds: hidden.json holds the references of each
    ({"seeds": {seed: references}}) and every run of the autograder draws one (pick_references),
    so one submission's messages do not answer the next one's inputs."""
    import torch

    from .references import make_data, references, refuse_a_failing_seed

    assignment = ASSIGNMENTS[name]
    make(list(assignment.functions), source / "copy", root=root, assignment=name, ship_visible=False)
    data = make_data(source / "data")
    by_seed = {}
    for one in ([seed] if isinstance(seed, int) else seed):
        by_seed[str(one)] = refs = references(assignment, data, one)
        if check_reference:  # a check the reference fails would fail every student who computes as it does
            refuse_a_failing_seed(assignment, data, refs, one)
    write_private(source / "hidden.json", json.dumps(refs if isinstance(seed, int) else {"seeds": by_seed}))
    version = torch.__version__.split("+")[0]
    setup = SETUP_SH.replace("TORCH_VERSION", version).replace("SANDBOX_USER", SANDBOX_USER)
    for script, text in (("setup.sh", setup),
                         ("run_autograder", RUN_AUTOGRADER)):
        (source / script).write_text(text)
        (source / script).chmod(0o755)
    return source


def pick_references(hidden: dict) -> tuple[dict, int | None]:
    """(references, seed) for one run: hidden.json's own, or one of its seeds drawn at random."""
    import secrets

    if "seeds" not in hidden:
        return hidden, None
    seed = secrets.choice(sorted(hidden["seeds"]))
    return hidden["seeds"][seed], int(seed)


PARTIAL = ".partial.json"  # beside results.json: the verdicts so far, while the checks run
EXPORTED_SEEDS = 8  # hidden inputs an exported autograder draws from, unless --seed names one


def export_gradescope(name: str, out: Path, seed: int | list[int] = 1, root: Path = ROOT,
                      check_reference: bool = True) -> Path:
    """The zip to upload to Gradescope (gradescope_source's folder; check_reference as there)."""
    out = Path(out)
    if out.suffix != ".zip":
        raise AssignmentError(f"{out}: give a .zip file name (Gradescope takes the autograder as a zip)")
    if out.exists():
        raise AssignmentError(f"{out} exists: give a new file name (nothing is overwritten)")
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        source = gradescope_source(name, Path(tmp) / "source", seed, root, check_reference)
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


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, atomically (a temporary file renamed over it: never half written), a
    file of the grader's alone (0600) from its first byte."""
    temporary = path.parent / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(temporary, 0o600)  # an old file of that name kept its mode
    os.replace(temporary, path)


def write_results(results: Path, payload: dict) -> None:
    """results.json (write_private: atomic, 0600)."""
    write_private(results, json.dumps(payload, indent=2))


def private_folder(folder: Path) -> Path:
    """`folder`, made if absent, readable by its owner alone (0700): the results' folder."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder


def autograde(source: Path, submission: Path, results: Path, zygote=None, isolation: str = "auto") -> int:
    """Gradescope's run: grade the submission against hidden.json, write results.json. Always
    writes a results.json (a failure to grade is reported in it), and returns 0. What is graded is
    the export's own assignment (source/copy/.assignment.json, written by `export`), never what
    the submission's files say. results.json is written by this process only, after every process
    of a check is dead, into a folder the student's code cannot read (0700, the files 0600):
    after each check the verdicts so far go to .partial.json beside it (run_autograder publishes
    them if the grader is killed), and results.json is written once, after the last check; on
    SIGTERM it writes what it has. zygote: a sandbox to reuse (grade.Zygote), else one is
    made at `isolation`."""
    from .grade import Report, grade_tree, manifest_disagrees
    from .make import MANIFEST
    from .registry import assignment_of

    source, results = Path(source).resolve(), Path(results).resolve()
    private_folder(results.parent)
    partial = results.parent / PARTIAL
    report = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        hidden = source / "hidden.json"
        refs, seed = pick_references(json.loads(hidden.read_text()))
        hidden.unlink()  # in memory now; the student's code runs after this and cannot read it
        assignment = assignment_of(json.loads((source / "copy" / MANIFEST).read_text()))
        files, notes = read_submission(Path(submission), assignment)
        disagreement = manifest_disagrees(Path(submission), assignment)
        report = Report(assignment.name, list(assignment.functions), notes=[disagreement] if disagreement else [],
                        seed=seed)
        grade_tree(assignment, source / "copy", files, source / "data", refs, notes=notes, zygote=zygote,
                   isolation=isolation, report=report,
                   on_result=lambda so_far: write_results(partial, _payload(so_far, complete=False)))
        payload = _payload(report, complete=True)
    except Interrupted:
        payload = _payload(report, complete=False) if report else {
            "score": 0, "output": "The autograder was stopped (SIGTERM) before it graded anything.", "tests": []}
    except Exception as error:  # noqa: BLE001  (whatever went wrong, the student gets a results.json saying so)
        why = f"The autograder could not grade this submission: {type(error).__name__}: {printable(error)}"
        if report is not None and report.results:
            payload = _payload(report, complete=False)
            payload["output"] += "\n" + why
        else:
            payload = {"score": 0, "output": why, "tests": []}
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_results(results, payload)
    partial.unlink(missing_ok=True)
    if report is not None and report.isolation:
        print(report.isolation["line"], file=sys.stderr)  # for the instructor, in the platform's log
    return 0


def _payload(report, complete: bool) -> dict:
    payload = gradescope_results(report)
    extra = []
    if not complete:
        extra.append(f"Grading stopped after {len(report.results)} check(s): the verdicts so far are above.")
    if report.isolation and report.isolation["level"] == "none":
        extra.append("UNOFFICIAL: " + report.isolation["line"])
    if extra:
        payload["output"] = "\n".join([payload["output"], *extra])
    return payload


def gradescope_results(report) -> dict:
    """results.json in Gradescope's autograder format, one test per check
    (https://gradescope-autograders.readthedocs.io/en/latest/specs/). The hidden checks are
    "after_published": shown when the instructor publishes the grades. No top-level "score"
    (it would override the tests' sum) and no total in the top-level "output" (shown at once):
    Gradescope hides the total while tests are hidden, and the output says only the visible part."""
    tests = []
    for r in report.results:  # what the student's code wrote, escaped (printable)
        output = printable(r.message)
        if r.output.strip():
            output += "\n\nYour code printed (truncated):\n" + printable(r.output)
        tests.append({"name": r.check, "score": r.points, "max_score": r.max_points,
                      "status": "passed" if r.passed else "failed",
                      "visibility": "visible" if r.visible else "after_published", "output": output})
    visible = [r for r in report.results if r.visible]
    summary = (f"{report.assignment}: the visible checks give {sum(r.points for r in visible):g}/"
               f"{sum(r.max_points for r in visible):g} points.")
    if len(visible) < len(report.results):
        summary += (f" The other {len(report.results) - len(visible)} checks ran on hidden inputs; their "
                    f"results and your total are shown when the grades are published.")
    if report.seed is not None:  # the instructor reproduces this grade with grade --seed
        summary += f" (Inputs: seed {report.seed}.)"
    return {"execution_time": round(report.seconds, 1), "output": "\n".join([*map(printable, report.notes), summary]),
            "stdout_visibility": "hidden", "tests": tests}


WORKFLOW = """# The visible checks, on every push (the instructor grades the hidden ones: python -m assignments grade).
name: Visible checks
on: [push, pull_request, workflow_dispatch]
permissions:
  contents: read
jobs:
  visible-checks:
    runs-on: ubuntu-latest
    timeout-minutes: {minutes}
    steps:
      - uses: actions/checkout@v6
      - uses: actions/setup-python@v6
        with:
          python-version: "{python}"
      - name: Install
        run: |
          pip install torch=={torch} --index-url https://download.pytorch.org/whl/cpu
          pip install -r requirements.txt
      - name: Visible checks
        run: python -m assignments check --summary "$GITHUB_STEP_SUMMARY"
"""

# The starter repository commits the visible checks' checkpoints, which the project's own
# .gitignore (*.safetensors) would leave out of it.
GITIGNORE_KEEP = """
# The visible checks' checkpoints are part of this repository (the workflow runs on them).
!.assignment/**
"""


def export_github(name: str, out: Path, root: Path = ROOT) -> Path:
    """The starter repository: the student's copy (with the visible checks' references and
    checkpoints) and .github/workflows/checks.yml, a plain GitHub Actions workflow that runs the
    visible checks on every push and writes their table to the job summary."""
    import torch

    out = Path(out)
    _new_folder(out)
    assignment = ASSIGNMENTS[name]
    make(list(assignment.functions), out, root=root, assignment=name)
    workflows = out / ".github" / "workflows"
    for old in workflows.glob("*.y*ml"):
        old.unlink()  # the project's own CI would run the instructor's (dropped) tests
    workflows.mkdir(parents=True, exist_ok=True)
    minutes = 10 + int(sum(c.timeout for c in assignment.checks if c.visible) // 60)  # + installing torch
    (workflows / "checks.yml").write_text(WORKFLOW.format(
        minutes=minutes, python=f"{sys.version_info.major}.{sys.version_info.minor}",
        torch=torch.__version__.split("+")[0]))
    gitignore = out / ".gitignore"
    gitignore.write_text((gitignore.read_text() if gitignore.exists() else "") + GITIGNORE_KEEP)
    return out


def markdown_summary(report) -> str:
    """The report as a Markdown table, for a GitHub job summary."""
    verdict = "all pass" if report.passed else "not yet"
    lines = [f"## {report.assignment}: visible checks, {report.points:g}/{report.max_points:g} points ({verdict})",
             "", "| check | points | result |", "|---|---|---|"]
    for r in report.results:
        message = printable(" ".join(r.message.split()), newlines=False).replace("|", "\\|")[:500]
        lines.append(f"| {r.check} | {r.points:g}/{r.max_points:g} | {'PASS' if r.passed else 'FAIL'}: {message} |")
    lines += ["", "The grade also runs hidden checks, on other inputs."]
    return "\n".join(lines) + "\n"
