"""The "find the bug" assignment (assignments/find_the_bug): the copy holds one of the bug zoo's
bugs, planted into the real code; the student names it in BUG.txt and fixes it. What the kit's
assignments must show: the unfixed copy fails (even with the right name: a quarter at most), the
reference (the instructor's code and the right name) passes with full marks, shortcuts score at
most a quarter: naming without fixing, "fixing" by switching speculation off, fixing without
naming. And every plant in plants.json applies to today's code and is caught by bug_fixed.

Cost: one copy, one set of references and one zygote for the chosen plant; the other plants are
graded on the same references with only bug_fixed (their copies differ in one file)."""

import json

import pytest

from assignments.definition import AssignmentError
from assignments.find_the_bug import ANSWER, PLANTS, TEMPLATE, planted_bug
from assignments.grade import (HIDDEN_SEED, Zygote, assignment_files, grade_tree, make_data, references,
                               student_files)
from assignments.references import failing_checks
from assignments.make import ROOT, make
from assignments.registry import ASSIGNMENTS
from test_assignments import first_draws

ASSIGNMENT = ASSIGNMENTS["find_the_bug"]
FILES = ["spec_decoding/algorithms/decoding.py", "spec_decoding/algorithms/rejection.py", ANSWER]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("find_the_bug")
    data = make_data(folder / "data")
    pristine = folder / "pristine"
    make(list(ASSIGNMENT.functions), pristine, assignment="find_the_bug", ship_visible=False)
    # first draws only: each plant is caught there (the second draw: tests/test_grader_verdicts.py)
    refs = hidden = first_draws(references(ASSIGNMENT, data, HIDDEN_SEED))
    zygote = Zygote(pristine)
    count = [0]

    def grade(texts: dict[str, str], only=None, refs=None):
        count[0] += 1
        submission = folder / f"submission{count[0]}"
        for rel, text in texts.items():
            (submission / rel).parent.mkdir(parents=True, exist_ok=True)
            (submission / rel).write_text(text)
        files, notes = student_files(submission, assignment_files(ASSIGNMENT))
        return grade_tree(ASSIGNMENT, pristine, files, data, refs or hidden, only, None, notes, zygote=zygote)

    grade.data, grade.refs = data, refs
    yield pristine, grade
    zygote.close()


def reference_files(name: str) -> dict[str, str]:
    """The instructor's code and a BUG.txt naming `name`."""
    return {**{f: (ROOT / f).read_text() for f in FILES[:2]}, ANSWER: TEMPLATE + name + "\n"}


def planted_files(bug: str, answer: str = "") -> dict[str, str]:
    """The instructor's code with `bug`'s plant applied (as make applies it), and a BUG.txt."""
    texts = reference_files(answer)
    for file, old, new in json.loads((ROOT / PLANTS).read_text())["plants"][bug]:
        texts[file] = texts[file].replace(old, new)
    return texts


def by_check(report):
    return {r.check: r for r in report.results}


def test_the_copy_holds_the_planted_bug_and_not_which_one(kit):
    pristine, _ = kit
    name, edits = planted_bug(ROOT)
    for file, old, new in edits:
        assert new in (pristine / file).read_text() and old not in (pristine / file).read_text()
    assert not (pristine / PLANTS).exists() and (pristine / ANSWER).read_text() == TEMPLATE
    manifest = json.loads((pristine / ".assignment.json").read_text())
    assert sorted(manifest["files"]) == sorted(FILES) == assignment_files(ASSIGNMENT)
    assert name not in json.dumps(manifest)


def test_the_unfixed_copy_fails_and_the_reference_passes(kit):
    pristine, grade = kit
    unfixed = grade({})  # nothing submitted: the copy as given
    assert unfixed.points == 0 and not unfixed.passed, [(r.check, r.message) for r in unfixed.results]
    solved = grade(reference_files(planted_bug(ROOT)[0]))
    assert solved.passed and solved.points == ASSIGNMENT.points == 4, [(r.check, r.message) for r in solved.results]


def test_the_instructors_own_project_passes_its_checks(kit):
    """What `grade` and the exports verify before grading anyone (references.failing_checks: the
    reference solution, run in the grader's process, must pass at the seed)."""
    _, grade = kit
    assert failing_checks(ASSIGNMENT, grade.data, grade.refs) == {}


def test_shortcuts_score_at_most_a_quarter(kit):
    pristine, grade = kit
    name = planted_bug(ROOT)[0]
    copy = {f: (pristine / f).read_text() for f in FILES[:2]}
    named_only = grade({**copy, ANSWER: name})
    assert named_only.points <= ASSIGNMENT.points / 4 and not by_check(named_only)["bug_fixed"].passed
    # "Fixing" by never drafting: every round a plain target step
    no_speculation = reference_files(name)
    no_speculation["spec_decoding/algorithms/decoding.py"] = no_speculation["spec_decoding/algorithms/decoding.py"].replace(
        "    return max(0, min(gamma, tokens_left - 1))\n", "    return 0\n")
    off = grade(no_speculation)
    assert off.points <= ASSIGNMENT.points / 4, [(r.check, r.message) for r in off.results]
    assert "forward passes" in by_check(off)["bug_fixed"].message
    assert "nothing was drafted" in by_check(off)["bug_fixed"].message
    wrong_name = grade(reference_files("resample from p" if name != "resample from p" else "sampler match"),
                       only=["bug_named"])
    assert wrong_name.points == 0 and "not the bug planted" in by_check(wrong_name)["bug_named"].message


WORDS = {"verification row off by one": "differs from the target's own greedy output",
         "resample from p": "differs from the target's distribution",
         "every draft accepted": "differs from the target's distribution",
         "sampler match": "lossless, but slower",
         "tokens after eos": "after eos were kept",
         "bonus token past max_gen": "past max_gen"}


SAMPLED = {"resample from p", "every draft accepted"}  # the plants the samples' chi-square catches


@pytest.mark.parametrize("bug", sorted(WORDS))
def test_every_plant_is_caught_by_bug_fixed(kit, bug):
    """Each plant applies to today's code once (else plant() refuses) and fails bug_fixed with the
    words of the zoo check that catches it; plants.json offers exactly these. The plants caught
    elsewhere than in the samples are graded on 100 samples instead of the hidden inputs' 1,200
    (the samples then pass, as the message's words show: they are not what catches these)."""
    _, grade = kit
    assert set(json.loads((ROOT / PLANTS).read_text())["plants"]) == set(WORDS)
    for file, old, new in json.loads((ROOT / PLANTS).read_text())["plants"][bug]:
        assert (ROOT / file).read_text().count(old) == 1, (bug, old)
    refs = grade.refs
    if bug not in SAMPLED:
        entry = refs["bug_fixed"]
        refs = {**refs, "bug_fixed": {**entry, "inputs": {**entry["inputs"], "samples": 100}}}
    result = by_check(grade(planted_files(bug), only=["bug_fixed"], refs=refs))["bug_fixed"]
    assert ("differs from the target's distribution" in result.message) == (bug in SAMPLED), result.message
    assert not result.passed and WORDS[bug] in result.message, (bug, result.message)


# ------------------------------------------------------------------------------------------------
# What the code sends back
# ------------------------------------------------------------------------------------------------

FORGED_JSON = """

import json as _json  # the attack: the values sent back replaced in the child
_real_dumps = _json.dumps


def _forged(value, *args, **kwargs):
    if isinstance(value, dict) and "values" in value:
        sent = value["values"]
        if isinstance(sent, dict) and "samples" in sent:  # bug_fixed: only the (exact) samples kept
            value = {"values": {key: sent["samples"] if key == "samples" else [] for key in sent}}
        else:
            value = {"values": FORGED_NAME}
    return _real_dumps(value, *args, **kwargs)


_json.dumps = _forged
"""


def test_a_non_string_answer_scores_nothing_with_a_message(kit):
    """bug_named sent 5 (json.dumps replaced in the child), not BUG.txt's text: 0, and a message
    saying so (the judge itself raised AttributeError on it, a traceback to the instructor)."""
    from assignments.definition import ChildRun
    from assignments.grade import judge

    _, grade = kit
    name = planted_bug(ROOT)[0]
    texts = reference_files(name)
    texts["spec_decoding/algorithms/decoding.py"] += FORGED_JSON.replace("FORGED_NAME", "5")
    result = by_check(grade(texts, only=["bug_named"]))["bug_named"]
    assert result.points == 0 and "sent 5 (int) where the text of BUG.txt was expected" in result.message, result
    check, entry = ASSIGNMENT.check("bug_named"), grade.refs["bug_named"]
    for hostile in (5, [name], {"bug": name}, True, 5.0, "x" * 5000):
        verdict = judge(check, entry["inputs"], entry["reference"], ChildRun(values=hostile))
        assert verdict.points == 0 and "values:" in verdict.message, (hostile, verdict.message)
    assert judge(check, entry["inputs"], entry["reference"], ChildRun(values=name)).passed


def test_emptied_values_with_exact_samples_score_nothing(kit):
    """bug_fixed's values forged in the child: every list empty but the samples, which are exact
    (as plain sampling's are). It once scored 3 of 3 (the judge zipped the empty lists, and the
    child sent its own counts): now 0, with a message saying what was sent."""
    _, grade = kit
    texts = reference_files(planted_bug(ROOT)[0])
    texts["spec_decoding/algorithms/decoding.py"] += FORGED_JSON.replace("FORGED_NAME", "''")
    result = by_check(grade(texts, only=["bug_fixed"]))["bug_fixed"]
    assert result.points == 0 and "values['greedy']: sent 0 values for 2 gammas" in result.message, result.message


# ------------------------------------------------------------------------------------------------
# A bug per student
# ------------------------------------------------------------------------------------------------

def test_each_students_copy_holds_the_bug_the_secret_and_the_id_pick(tmp_path, monkeypatch):
    """With the instructor's secret set, `make --student ID` plants bug_for(ID): spread over the
    zoo, fixed for a secret, another secret another spread; the manifest names the student, never
    the bug. Without the secret a per-student copy is refused and nothing is left behind."""
    from assignments.find_the_bug import SECRET, bug_for

    plants = json.loads((ROOT / PLANTS).read_text())["plants"]
    ids = [f"student{i}" for i in range(60)]
    by_secret = {secret: [bug_for(i, secret, ROOT) for i in ids] for secret in ("one secret", "another")}
    assert all(len(set(bugs)) >= 4 and set(bugs) <= set(plants) for bugs in by_secret.values())
    assert by_secret["one secret"] != by_secret["another"]
    assert by_secret["one secret"] == [bug_for(i, "one secret", ROOT) for i in ids]

    monkeypatch.delenv(SECRET, raising=False)
    with pytest.raises(AssignmentError, match=f"needs the instructor's secret: set {SECRET}"):
        make(list(ASSIGNMENT.functions), tmp_path / "refused", assignment="find_the_bug", ship_visible=False,
             student="student1")
    assert not (tmp_path / "refused").exists()

    monkeypatch.setenv(SECRET, "one secret")
    student = next(i for i in ids if bug_for(i, "one secret", ROOT) != planted_bug(ROOT)[0])
    copy = tmp_path / "copy"
    make(list(ASSIGNMENT.functions), copy, assignment="find_the_bug", ship_visible=False, student=student)
    for file, old, new in plants[bug_for(student, "one secret", ROOT)]:
        assert new in (copy / file).read_text() and old not in (copy / file).read_text()
    manifest = json.loads((copy / ".assignment.json").read_text())
    assert manifest["student"] == student and bug_for(student, "one secret", ROOT) not in json.dumps(manifest)


def test_the_name_is_judged_against_the_bug_in_that_students_copy(kit, monkeypatch):
    """The grade, told whose copy it is, takes that copy's bug as the answer: the student's own bug
    scores, the class's bug or another student's does not. Without the secret the class's bug."""
    from assignments.find_the_bug import SECRET, bug_for
    from assignments.references import for_student

    _, grade = kit
    monkeypatch.setenv(SECRET, "one secret")
    ids = [f"student{i}" for i in range(60)]
    mine = next(i for i in ids if bug_for(i, "one secret", ROOT) != planted_bug(ROOT)[0])
    other = next(i for i in ids if bug_for(i, "one secret", ROOT) not in (bug_for(mine, "one secret", ROOT),
                                                                          planted_bug(ROOT)[0]))
    refs = for_student(ASSIGNMENT, grade.refs, mine)
    assert refs["bug_fixed"] is grade.refs["bug_fixed"]  # the fix is judged the same for everyone

    def named(bug, refs):
        return by_check(grade({ANSWER: TEMPLATE + bug + "\n"}, only=["bug_named"], refs=refs))["bug_named"]

    assert named(bug_for(mine, "one secret", ROOT), refs).passed
    assert not named(planted_bug(ROOT)[0], refs).passed
    assert not named(bug_for(other, "one secret", ROOT), refs).passed
    monkeypatch.delenv(SECRET)
    assert for_student(ASSIGNMENT, grade.refs, mine)["bug_named"] == grade.refs["bug_named"]


def test_batch_single_and_gradescope_grades_read_bug_txt_alike(tmp_path, monkeypatch):
    """What a submission is, once (submission_files.files_read: BUG.txt is one of find_the_bug's
    files, and of no other assignment's): a correct, correctly named find_the_bug submission
    earns bug_named graded alone, in a batch and by the Gradescope autograder, the same verdict
    each way (the batch once read only the functions' files: every student lost the naming
    point). bug_named alone is graded, on the class's bug."""
    import io

    from assignments import batch
    from assignments.export import autograde, gradescope_source
    from assignments.grade import grade
    from assignments.submission_files import files_read

    assert [name for name, a in ASSIGNMENTS.items() if ANSWER in files_read(a)] == ["find_the_bug"]
    named = next(c for c in ASSIGNMENT.checks if c.name == "bug_named")
    monkeypatch.setitem(ASSIGNMENTS, "find_the_bug", type(ASSIGNMENT)(**{**ASSIGNMENT.__dict__, "checks": (named,)}))
    submission = tmp_path / "submissions" / "ada"
    for rel, text in reference_files(planted_bug(ROOT)[0]).items():
        (submission / rel).parent.mkdir(parents=True, exist_ok=True)
        (submission / rel).write_text(text)
    alone = grade(submission, assignment="find_the_bug", seed=HIDDEN_SEED)
    reports = batch.grade_batch("find_the_bug", tmp_path / "submissions", tmp_path / "grades.csv", seed=HIDDEN_SEED,
                                file=io.StringIO())
    source = gradescope_source("find_the_bug", tmp_path / "source", HIDDEN_SEED, check_reference=False)
    autograde(source, submission, tmp_path / "results" / "results.json")
    tests = json.loads((tmp_path / "results" / "results.json").read_text())["tests"]
    verdicts = [(t["name"], t["status"] == "passed", t["score"]) for t in tests]
    assert verdicts == [("bug_named", True, 1.0)]
    assert [(r.check, r.passed, r.points) for r in alone.results] == verdicts
    assert [(r.check, r.passed, r.points) for r in reports[0].results] == verdicts
