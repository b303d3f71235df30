"""A batch nothing can stop (assignments/batch.py): one class of gamma_cost_model submissions,
honest ones around a hanging, a crashing and hostile ones (a link to the instructor's checkout,
an answer 200,000 lists deep, a memory hog, escape sequences), graded in one batch into a complete
CSV: a row for each student, in order, each with its right score and a note saying what went
wrong; the students after the hostile ones are graded in full. The submissions are those of
benchmarks/demo_class.py (which grades a class of 20).

Also, without grading: printable() (the escaping every report goes through) and the columns.
Needs root and namespaces, as tests/test_grader_hostile.py."""

import csv
import io
import json
import os

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from assignments.batch import csv_cell, find_submissions, grade_batch
from assignments.export import gradescope_results
from assignments.grade import print_report
from assignments.make import ROOT
from assignments.printable import printable
from assignments.registry import ASSIGNMENTS
from assignments.sandbox import namespaces_work
from benchmarks.demo_class import NAME, write_class

ASSIGNMENT = ASSIGNMENTS[NAME]
TIMEOUT = 8  # seconds per check, and for all of a submission's checks together (an honest one takes about 1)
MEMORY_MB = 256  # the memory hog asks for 6 x 100 MB
# the class, in the CSV's order: kind -> how many
# (its hang waits rather than spins: the same timeout ends it, without taking a core from the other
# tests for TIMEOUT seconds; benchmarks/demo_class.py grades both kinds)
# (the hijacker's metadata lists the checkout and its classmates' folders; the formula-id student's
# folder name starts with "=": it sorts last, as it comes last here)
CLASS = {"honest": 1, "symlink-checkout": 1, "hang-waiting": 1, "crash": 1, "deep-json": 1, "memory-hog": 1, "ansi": 1,
         "honest-loop": 1, "hijack-metadata": 1, "formula-id": 1}
PER_ROUND = {"tokens_per_round", "speedup", "best_gamma_choice"}  # the checks that call expected_tokens_per_round


def test_printable_escapes_every_control_and_formatting_character():
    """ESC, CSI (0x9b), \\r, backspace, BEL, a bidirectional override: written out; newlines and
    tabs kept (or escaped for one CSV cell); twice is once; ordinary text unchanged."""
    forged = "ok\x1b[2J\x1b[H\x9b31m\rALL PASS\x08\x07 \u202eevil\u200b\nline\ttab é ü 你"
    shown = printable(forged)
    assert not any(c in shown for c in "\x1b\x9b\r\x08\x07\u202e\u200b")
    assert shown == "ok\\x1b[2J\\x1b[H\\x9b31m\\x0dALL PASS\\x08\\x07 \\u202eevil\\u200b\nline\ttab é ü 你"
    assert printable(shown) == shown
    assert printable(forged, newlines=False).count("\n") == 0 and "\\n" in printable(forged, newlines=False)


# ------------------------------------------------------------------------------------------------
# What a batch is: a row per student folder, metadata from the export's top only, safe cells
# ------------------------------------------------------------------------------------------------

def _metadata(entries: dict) -> str:
    """Gradescope's submission_metadata.yml for {folder key: submitter's sid}."""
    import yaml

    return yaml.safe_dump({key: {":submitters": [{":name": f"name of {sid}", ":sid": sid}]}
                           for key, sid in entries.items()})


def _export(top, folders):
    for name in folders:
        (top / name).mkdir(parents=True)
    return top


def test_metadata_is_read_at_the_top_only_and_names_only_its_own_folders(tmp_path):
    """Keys that lead outside the export (absolute, '..', through a folder), name no folder, or a
    link to one: never a submission. A student's own submission_metadata.yml is one of their
    files. Every folder is one row; one the metadata does not name keeps its folder's name, and
    the row says so."""
    top = _export(tmp_path / "export", ["submission_1", "submission_2", "submission_3"])
    outside = _export(tmp_path, ["elsewhere"]) / "elsewhere"
    (top / "linked").symlink_to(outside)
    (top / "submission_3" / "submission_metadata.yml").write_text(_metadata({"../submission_1": "copied",
                                                                             str(outside): "outsider"}))
    (top / "submission_metadata.yml").write_text(_metadata({
        "submission_1": "100", "../elsewhere": "dotdot", str(outside): "absolute", str(top / "submission_2"): "abs2",
        "submission_2/../submission_1": "through", "linked": "link", "submission_9": "nobody"}))
    found = find_submissions(top)
    assert [(s.student, s.name, s.folder) for s in found] == [
        ("100", "name of 100", top / "submission_1"), ("submission_2", "", top / "submission_2"),
        ("submission_3", "", top / "submission_3")]
    assert found[0].notes == [] and all("does not name this folder" in s.notes[0] for s in found[1:])


@pytest.mark.parametrize("how, why", [
    ("unclosed", "not valid YAML"), ("list", "not a mapping"), ("unhashable", "not valid YAML"),
    ("deep", "not valid YAML"), ("link", "symbolic link"), ("fifo", "named pipe"), ("folder", "a folder"),
])
def test_metadata_that_cannot_be_read_is_a_note_on_every_row(tmp_path, how, why):
    """Malformed YAML, a list, an unhashable key, nesting deeper than the parser goes, a link (to
    a root-only file), a FIFO, a folder: no traceback; every folder is a row under its own name,
    with a note saying the metadata could not be read and why. (It ended the batch with a
    ScannerError and no CSV.)"""
    top = _export(tmp_path / "export", ["submission_1", "submission_2"])
    metadata = top / "submission_metadata.yml"
    text = {"unclosed": "submission_1: [unclosed\n", "list": "- submission_1\n- submission_2\n",
            "unhashable": "? [a, b]\n: c\n", "deep": "[" * 100_000}
    if how in text:
        metadata.write_text(text[how])
    elif how == "link":
        metadata.symlink_to("/etc/shadow")
    elif how == "fifo":
        os.mkfifo(metadata)
    else:
        metadata.mkdir()
    found = find_submissions(top)
    assert [(s.student, s.folder.name) for s in found] == [("submission_1", "submission_1"),
                                                           ("submission_2", "submission_2")]
    for s in found:
        assert len(s.notes) == 1 and "submission_metadata.yml could not be read" in s.notes[0], s.notes
        assert why in s.notes[0], s.notes


_KEYS = st.one_of(st.sampled_from(["submission_1", "submission_2", "..", ".", "/", "/etc", "../submission_1",
                                   "submission_1/..", "submission_1/../submission_2", "~", ""]),
                  st.text(max_size=12))
_VALUES = st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=8), st.booleans()),
                       lambda inner: st.one_of(st.lists(inner, max_size=3),
                                               st.dictionaries(st.sampled_from([":submitters", ":sid", ":name",
                                                                                ":email", "x"]), inner, max_size=3)),
                       max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(records=st.dictionaries(_KEYS, _VALUES, max_size=6), raw=st.one_of(st.none(), st.binary(max_size=200)))
@example(records={"submission_1": {":submitters": 5}, "submission_2": {":submitters": [{":sid": [1]}, 7]}}, raw=None)
def test_any_metadata_gives_each_folder_exactly_one_row_inside_the_export(records, raw):
    """Whatever the metadata holds (any keys and values, or any bytes): every folder of the
    export is one row, in order, and nothing outside it is ever a submission."""
    import tempfile

    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        top = _export(Path(tmp) / "export", ["submission_1", "submission_2", "submission 3"])
        text = raw if raw is not None else yaml.safe_dump(records).encode()
        (top / "submission_metadata.yml").write_bytes(text)
        found = find_submissions(top)
        assert [s.folder for s in found] == [top / "submission 3", top / "submission_1", top / "submission_2"]
        assert all(isinstance(s.student, str) and s.student and isinstance(s.name, str) for s in found)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40) | st.sampled_from(["=1+1", "+1", "-1", "@SUM(A1)", "\t=1", "\r=1",
                                                   "=cmd|' /C calc'!A0"]))
def test_no_csv_cell_starts_a_formula(text):
    """Any text (an id, a name, a note) becomes a cell that does not start with = + - @, a tab or
    a carriage return, holds no control character, and reads back as the escaped text, with a
    leading ' where it was neutralised."""
    cell = csv_cell(text)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in cell)
    shown = printable(text, newlines=False)
    assert cell == (("'" + shown) if shown[:1] in ("=", "+", "-", "@") else shown)
    written = io.StringIO()
    csv.writer(written).writerow([cell])
    assert next(csv.reader(io.StringIO(written.getvalue()))) == [cell]


@pytest.fixture(scope="module")
def graded(shared):
    """The class graded in one batch, once for the whole test run (`shared`): its tests may be
    spread over the xdist workers."""
    if os.geteuid() != 0 or not namespaces_work():
        pytest.skip("the sandbox's tests need root and working namespaces (unshare)")

    def build(folder):
        names = write_class(folder / "submissions", ROOT, CLASS, hog_mb=100, hogs=6)
        progress = io.StringIO()
        reports = grade_batch(NAME, folder / "submissions", folder / "grades.csv", seed=1, timeout=TIMEOUT,
                              file=progress, memory=MEMORY_MB << 20)
        rows = list(csv.DictReader((folder / "grades.csv").open()))
        return {"names": names, "rows": {r["student"]: r for r in rows}, "order": [r["student"] for r in rows],
                "reports": dict(zip(names, reports)), "progress": progress.getvalue(),
                "text": (folder / "grades.csv").read_text()}

    return shared("demo-class-batch", build)


def _row(graded, kind):
    return graded["rows"][csv_cell(next(n for n in graded["names"] if n.endswith("-" + kind)))]


def _report(graded, kind):
    return graded["reports"][next(n for n in graded["names"] if n.endswith("-" + kind))]


def test_every_student_gets_a_row_in_order(graded):
    """A row per student, in order, each with every column filled; the honest students, first and
    after all the hostile ones, get full marks (a batch that stopped, or a sandbox left broken by
    a hostile student, would miss them)."""
    assert graded["order"] == [csv_cell(name) for name in graded["names"]]
    assert all(row["max"] == f"{ASSIGNMENT.points:g}" and row["seconds"] for row in graded["rows"].values())
    for kind in ("honest", "honest-loop"):
        assert _row(graded, kind)["total"] == f"{ASSIGNMENT.points:g}", _row(graded, kind)
    assert f"[{len(CLASS)}/{len(CLASS)}]" in graded["progress"]


def test_a_students_metadata_file_hijacks_nothing(graded):
    """A submission_metadata.yml in a student's own folder, listing the instructor's checkout and
    every classmate's folder under ids of its choosing: it is a file of that student's folder,
    nothing more. The batch graded the checkout as a submission (full marks to an id the file
    chose), gave a classmate's grade a second id and left every unlisted student out of the CSV;
    now each folder is one row under its own name, the hijacker's 0 (it submitted no code)."""
    row = _row(graded, "hijack-metadata")
    assert row["total"] == "0" and row["student"] == row["submission"]
    assert sorted(graded["rows"]) == sorted(csv_cell(name) for name in graded["names"])
    assert not any(cell.startswith(("hijacker", "second-id")) for cell in graded["rows"])
    assert "hijacker" not in graded["text"] and "second-id" not in graded["text"]


def test_a_formula_id_reaches_the_csv_as_text(graded):
    """A student whose id (its folder's name) starts with "=": the cell starts with ' (text to a
    spreadsheet), the rest of it kept; graded in full as the honest submission it is. No cell of
    the CSV starts with what a spreadsheet runs as a formula."""
    row, name = _row(graded, "formula-id"), next(n for n in graded["names"] if n.endswith("-formula-id"))
    assert name.startswith("=") and row["student"] == "'" + name and row["submission"] == "'" + name
    assert row["total"] == f"{ASSIGNMENT.points:g}"
    cells = [cell for line in csv.reader(io.StringIO(graded["text"])) for cell in line]
    assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in cells)


def test_a_link_to_the_checkout_is_refused(graded):
    """theory.py a symbolic link to the instructor's own theory.py: refused, 0 points (copied
    through the link it scored full marks)."""
    row = _row(graded, "symlink-checkout")
    assert row["total"] == "0" and "refused: spec_decoding/policies/theory.py is a symbolic link" in row["notes"]


def test_a_hanging_submission_costs_one_timeout(graded):
    """Its first check uses the submission's time (TIMEOUT); the other checks are not run (each
    waited its own timeout before)."""
    row, report = _row(graded, "hang-waiting"), _report(graded, "hang-waiting")
    assert float(row["seconds"]) < 3 * TIMEOUT
    verdicts = {r.check: r.message for r in report.results}
    assert "did not finish within" in verdicts["tokens_per_round"]
    assert sum("not run: the submission used its time" in m for m in verdicts.values()) >= len(verdicts) - 2
    assert row["total"] == "0"


def test_a_crash_and_an_unreadable_answer_are_rows_with_a_reason(graded):
    """os._exit in the student's function: its checks fail, saying the process ended; an answer
    200,000 lists deep: the batch goes on (whatever the grader raised reading it is the row's
    note, or the check's verdict), 0 for the checks that read it."""
    crash = _row(graded, "crash")
    assert "the process ended before the check could report" in crash["notes"]
    deep, report = _row(graded, "deep-json"), _report(graded, "deep-json")
    passed = {r.check for r in report.results if r.passed}
    assert not passed & PER_ROUND
    reasons = [deep["notes"]] + [r.message for r in report.results if not r.passed]
    assert any("deep" in reason for reason in reasons), reasons  # said, not silently zero
    assert float(deep["total"]) == sum(c.points for c in ASSIGNMENT.checks if c.name in passed)


def test_a_memory_hog_ends_its_check_not_the_grader(graded):
    """Seven processes of 100 MB inside a 256 MB limit: the out-of-memory killer ends the check's
    processes (the grader and the students after it are graded), and the note says the submission
    used too much memory."""
    row, report = _row(graded, "memory-hog"), _report(graded, "memory-hog")
    verdicts = {r.check: r for r in report.results}
    message = verdicts["tokens_per_round"].message
    assert message.startswith("ran out of memory: your code used too much memory") and "256 MB" in message
    assert not any(verdicts[check].passed for check in PER_ROUND)
    assert float(row["total"]) == sum(r.points for r in report.results)  # costs.py's checks: its own, honest
    assert _row(graded, "honest-loop")["total"] == f"{ASSIGNMENT.points:g}"


def test_escape_sequences_reach_no_terminal_csv_or_results_json(graded):
    """An exception message and a print full of escape sequences drawing "ALL PASS": the CSV, the
    printed report and results.json hold them escaped (\\x1b), never raw."""
    report = _report(graded, "ansi")
    assert any("\x1b" in r.message for r in report.results)  # what the student's code raised, kept as it was
    printed = io.StringIO()
    print_report(report, file=printed)
    for text in (graded["text"], printed.getvalue(), json.dumps(gradescope_results(report), ensure_ascii=False),
                 json.dumps(report.to_json(), ensure_ascii=False)):
        assert "\x1b" not in text and "\r" not in text.replace("\r\n", "\n") and "\x07" not in text
        assert "\\x1b[2J" in text
    assert not any(r.passed for r in report.results if r.check in PER_ROUND)


def test_the_csv_shows_a_pasted_solution(graded):
    """The honest student submitted this project's own theory.py: 100% similar to the reference;
    the one who wrote expected_tokens_per_round as a loop is not; a refused file is not compared."""
    assert _row(graded, "honest")["similar_to_reference"].startswith("100%")
    assert _row(graded, "symlink-checkout")["similar_to_reference"] == ""
    loop = dict(reversed(part.split("% ")) for part in _row(graded, "honest-loop")["similar_to_reference"].split("; "))
    assert int(loop["expected_tokens_per_round"]) < 50


def test_each_row_is_on_disk_before_the_next_submission_is_graded(tmp_path):
    """The header and every finished row are flushed to disk before the next submission's grading
    starts, so a batch killed midway (the out-of-memory killer, a time limit) keeps them (unflushed,
    a batch killed during its first submissions left an empty CSV). No grading: reports made here."""
    from assignments.batch import Submission, _write_csv
    from assignments.grade import Report

    out, on_disk = tmp_path / "grades.csv", []

    def graded():
        for i in range(3):
            on_disk.append(len(list(csv.reader(out.open()))))  # what another process would read now
            yield Report(NAME, list(ASSIGNMENT.functions), notes=[f"note \x1b[2J{i}"]), {}

    found = [Submission(f"s{i}", "", tmp_path / f"s{i}") for i in range(3)]
    _write_csv(out, ASSIGNMENT, found, graded(), 1, io.StringIO())
    assert on_disk == [1, 2, 3]
    assert [row["notes"] for row in csv.DictReader(out.open())] == [f"note \\x1b[2J{i}" for i in range(3)]


def _child_allocating(memory: dict | None, megabytes: int) -> tuple[int, str]:
    """Fork a process that joins the sandbox's memory limit as a check's child does
    (sandbox.join_memory), then fills `megabytes`; its exit code as subprocess gives it, and its
    oom_score_adj (read back through a pipe before it allocates)."""
    from assignments.sandbox import join_memory

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            join_memory(memory)
            os.write(write, open("/proc/self/oom_score_adj").read().strip().encode())
            os.close(write)
            block = b"x" * (megabytes << 20)
            os._exit(0 if block else 1)
        except MemoryError:
            os._exit(3)
        finally:
            os._exit(4)
    os.close(write)
    adj = os.read(read, 100).decode()
    os.close(read)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), adj


def test_a_checks_processes_are_held_to_the_sandboxs_memory_limit():
    """A process that joins the sandbox's memory cgroup (64 MB) and fills 200 MB is killed by the
    out-of-memory killer (SIGKILL, the cgroup's kill count goes up), not anything else; where there
    is no cgroup, its address-space limit makes the allocation fail (MemoryError). Either way it is
    the killer's first choice (oom_score_adj 1000). Without the limit it fills 200 MB and exits 0."""
    from assignments.memory import SandboxMemory

    assert _child_allocating(None, 200) == (0, "1000")
    assert _child_allocating({"procs_fd": None, "limit": 64 << 20}, 200) == (3, "1000")
    memory = SandboxMemory(64 << 20)
    try:
        if memory.folder is None:
            pytest.skip(f"no memory cgroup can be made here: {memory.why_not}")
        before = memory.oom_kills()
        assert _child_allocating(memory.for_child(), 200) == (-9, "1000")
        assert memory.oom_kills() == before + 1
        assert _child_allocating(memory.for_child(), 16) == (0, "1000")
    finally:
        memory.close()


def test_a_checks_processes_join_the_sandboxs_cpu_cgroup():
    """Each sandbox's checks share one CPU weight (cpu.SandboxCPU): a process that joins as a
    check's child does (sandbox.join_cpu, after join_memory) is in the sandbox's own cpu cgroup,
    whose weight is the default one (every sandbox alike), not in the grader's; the cgroup is
    gone once closed. Where none can be made, the reason is said."""
    from assignments.cpu import SHARES_V1, WEIGHT_V2, SandboxCPU
    from assignments.memory import SandboxMemory
    from assignments.sandbox import join_cpu, join_memory

    memory = SandboxMemory(256 << 20)
    cpu = SandboxCPU(memory)
    try:
        if cpu.folder is None:
            pytest.skip(f"no cpu cgroup can be made here: {cpu.why_not}")
        weight = cpu.folder / ("cpu.weight" if (cpu.folder / "cpu.weight").exists() else "cpu.shares")
        assert int(weight.read_text()) == (WEIGHT_V2 if weight.name == "cpu.weight" else SHARES_V1)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                join_memory(memory.for_child())
                join_cpu(cpu.for_child())
                os.write(write, open("/proc/self/cgroup").read().encode())
            finally:
                os._exit(0)
        os.close(write)
        groups = os.read(read, 65536).decode()
        os.waitpid(pid, 0)
        where = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in groups.splitlines()}
        mine = next(path for controllers, path in where.items() if "cpu" in controllers.split(",") or controllers == "")
        assert mine.rstrip("/").endswith(cpu.folder.name), (where, cpu.folder)
        assert cpu.folder.name not in open("/proc/self/cgroup").read()  # the grader stays where it was
    finally:
        folder, made = cpu.folder, cpu.made
        cpu.close()
        memory.close()
    assert not made or not folder.exists()


@pytest.mark.parametrize("name", [name for name, a in ASSIGNMENTS.items() if not a.plant])
def test_each_assignments_reference_gets_the_same_verdicts_alone_and_in_a_batch(tmp_path, name):
    """What a submission is, once: each ready-made assignment's reference solution (the project's
    own files, as a student would submit them), graded alone and in a batch of one, gets the same
    verdict from every check, and passes every one. (find_the_bug, whose answer file is BUG.txt,
    is compared with the Gradescope autograder too: tests/test_find_the_bug.py.)"""
    from assignments.grade import HIDDEN_SEED, grade
    from assignments.make import resolve
    from assignments.submission_files import files_read

    assignment = ASSIGNMENTS[name]
    submission = tmp_path / "submissions" / "ada"
    for rel in files_read(assignment):
        if (ROOT / rel).is_file():
            (submission / rel).parent.mkdir(parents=True, exist_ok=True)
            (submission / rel).write_text((ROOT / rel).read_text())
    assert all((submission / resolve(f).file).is_file() for f in assignment.functions)
    alone = grade(submission, assignment=name, seed=HIDDEN_SEED)
    batched = grade_batch(name, tmp_path / "submissions", tmp_path / "grades.csv", seed=HIDDEN_SEED, file=io.StringIO())
    verdicts = [(r.check, r.passed, r.points) for r in alone.results]
    assert [(r.check, r.passed, r.points) for r in batched[0].results] == verdicts
    assert [check.name for check in assignment.checks] == [check for check, _, _ in verdicts]
    assert all(passed for _, passed, _ in verdicts), alone.results
