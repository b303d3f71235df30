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

from assignments.find_the_bug import ANSWER, PLANTS, TEMPLATE, planted_bug
from assignments.grade import (HIDDEN_SEED, Zygote, assignment_files, grade_tree, make_data, references,
                               student_files)
from assignments.references import failing_checks
from assignments.make import ROOT, make
from assignments.registry import ASSIGNMENTS

ASSIGNMENT = ASSIGNMENTS["find_the_bug"]
FILES = ["spec_decoding/decoding.py", "spec_decoding/rejection.py", ANSWER]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    folder = tmp_path_factory.mktemp("find_the_bug")
    data = make_data(folder / "data")
    pristine = folder / "pristine"
    make(list(ASSIGNMENT.functions), pristine, assignment="find_the_bug", ship_visible=False)
    refs = references(ASSIGNMENT, data, HIDDEN_SEED)
    zygote = Zygote(pristine)
    count = [0]

    def grade(texts: dict[str, str], only=None):
        count[0] += 1
        submission = folder / f"submission{count[0]}"
        for rel, text in texts.items():
            (submission / rel).parent.mkdir(parents=True, exist_ok=True)
            (submission / rel).write_text(text)
        files, notes = student_files(submission, assignment_files(ASSIGNMENT))
        return grade_tree(ASSIGNMENT, pristine, files, data, refs, only, None, notes, zygote=zygote)

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
    no_speculation["spec_decoding/decoding.py"] = no_speculation["spec_decoding/decoding.py"].replace(
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


@pytest.mark.parametrize("bug", sorted(WORDS))
def test_every_plant_is_caught_by_bug_fixed(kit, bug):
    """Each plant applies to today's code once (else plant() refuses) and fails bug_fixed with the
    words of the zoo check that catches it; plants.json offers exactly these."""
    _, grade = kit
    assert set(json.loads((ROOT / PLANTS).read_text())["plants"]) == set(WORDS)
    for file, old, new in json.loads((ROOT / PLANTS).read_text())["plants"][bug]:
        assert (ROOT / file).read_text().count(old) == 1, (bug, old)
    result = by_check(grade(planted_files(bug), only=["bug_fixed"]))["bug_fixed"]
    assert not result.passed and WORDS[bug] in result.message, (bug, result.message)
