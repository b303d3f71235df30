"""The course assignment kit (assignments/): `make` strips functions on the syntax tree and keeps
everything else; `grade` fails a stripped copy with the expected messages and passes the reference
solution; a planted bug-zoo bug is caught and named; bad input gets clear errors."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assignments import ASSIGNMENTS, __main__ as cli
from assignments.grade import grade
from assignments.make import MANIFEST, AssignmentError, make, resolve

ROOT = Path(__file__).resolve().parents[1]


def function_node(path: Path, qualname: str):
    tree = ast.parse(path.read_text())
    node = tree
    for part in qualname.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)
    return node


def test_make_strips_bodies_keeps_signatures_docstrings_and_everything_else(tmp_path):
    out = tmp_path / "student"
    make(ASSIGNMENTS["kv_cache"], out)
    for name in ASSIGNMENTS["kv_cache"]:
        t = resolve(name)
        original, stripped = function_node(ROOT / t.file, t.qualname), function_node(out / t.file, t.qualname)
        assert ast.dump(stripped.args) == ast.dump(original.args)
        assert ast.get_docstring(stripped) == ast.get_docstring(original)
        body = stripped.body[1:] if ast.get_docstring(original) else stripped.body
        assert len(body) == 1 and isinstance(body[0], ast.Raise)
        assert "NotImplementedError" in ast.unparse(body[0])
    # the other functions of a stripped file, and every other file, are untouched
    kv = (out / "gpt2/kv_cache.py").read_text()
    assert "def advance(self, n_tokens: int) -> None:\n        self.length += n_tokens" in kv
    assert (out / "spec_decoding/speculative.py").read_bytes() == (ROOT / "spec_decoding/speculative.py").read_bytes()
    assert (out / "README.md").is_file() and not (out / ".git").exists()
    assert MANIFEST in os.listdir(out)


def restore(student: Path, assignment: str, plant=None):
    """Put the reference solution back (the original files), optionally with a text edit."""
    for file in sorted({resolve(name).file for name in ASSIGNMENTS[assignment]}):
        text = (ROOT / file).read_text()
        if plant and plant[0] == file:
            assert plant[1] in text
            text = text.replace(plant[1], plant[2])
        (student / file).write_text(text)


@pytest.mark.parametrize("assignment", list(ASSIGNMENTS))
def test_make_each_ready_made_assignment(tmp_path, assignment, capsys):
    student = tmp_path / assignment
    assert cli.main(["make", "--assignment", assignment, "--out", str(student)]) == 0
    out = capsys.readouterr().out
    for name in ASSIGNMENTS[assignment]:
        assert name in out
        t = resolve(name)
        assert f"raise NotImplementedError('{t.qualname}: your code here" in (student / t.file).read_text()
    assert (ROOT / "assignments" / assignment / "README.md").is_file()


def test_stripped_copies_fail_and_the_reference_solutions_pass(tmp_path, capsys):
    """All three ready-made assignments in one student copy (one grading run each way, to keep
    the suite fast): every function scores 0 with "not implemented yet", then the reference
    solution (the original files) passes every check."""
    student = tmp_path / "all"
    functions = [name for names in ASSIGNMENTS.values() for name in names]
    make(functions, student)
    report = grade(student)
    assert not report.passed
    assert [score.function for score in report.functions] == functions
    checks = set()
    for score in report.functions:
        assert score.score.startswith("0/")
        assert all("not implemented yet" in r.message for r in score.results), score.results
        checks |= {r.check for r in score.results}
    assert {"cache_truncate", "greedy_equals_target", "greedy_stopping", "residual", "one_round",
            "lossless"} <= checks
    for assignment in ASSIGNMENTS:
        restore(student, assignment)
    assert cli.main(["grade", str(student)]) == 0
    out = capsys.readouterr().out
    assert "ALL PASS" in out and "FAIL" not in out.split("Checks:")[1]


@pytest.mark.parametrize("assignment, plant, expected", [
    ("rejection_sampling",
     ("spec_decoding/rejection.py", "return residual / total if total > 0 else target_probs",
      "return target_probs"),
     ["resample from p", "your sampler's distribution differs from the target's: total variation"]),
    ("greedy_speculative",
     ("spec_decoding/greedy.py", "new_tokens, sources, eos_id, max_gen", "new_tokens, sources, None, max_gen"),
     ["tokens after eos"]),
])
def test_a_planted_bug_zoo_bug_is_caught_and_named(tmp_path, assignment, plant, expected, capsys):
    student = tmp_path / assignment
    make(ASSIGNMENTS[assignment], student, assignment=assignment)
    restore(student, assignment, plant)
    assert cli.main(["grade", str(student)]) == 1
    out = capsys.readouterr().out
    for words in expected:
        assert words in out, out


@pytest.mark.parametrize("name, message", [
    ("spec_decoding.rejection.no_such_function", "defines no function 'no_such_function'. Its functions are: .*residual_distribution"),
    ("no_such_module.f", "no module 'no_such_module'"),
    ("gpt2.kv_cache.KVCache", "is a class, not a function: name the methods.*gpt2.kv_cache.KVCache.truncate"),
    ("spec_decoding.speculative", "is a module, not a function"),
    ("spec_decoding", "is a package, not a function"),
    ("not a name", "not a dotted Python name"),
])
def test_bad_names_give_clear_errors(tmp_path, name, message):
    with pytest.raises(AssignmentError, match=message):
        make([name], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written


def test_refuses_a_non_empty_folder_and_bad_grade_folders(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["make", "--functions", "spec_decoding.rejection.residual_distribution", "--out", str(out)]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    assert cli.main(["grade", str(out)]) == 2
    assert "was not made by `python -m assignments make`" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_command_line(tmp_path):
    """The real `python -m assignments`, as an instructor runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "assignments", "make", "--functions", "gpt2.kv_cache.KVCache",
                           "--out", str(tmp_path / "x")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "is a class, not a function" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "assignments", "make", "--functions",
                           "spec_decoding.rejection.residual_distribution", "--out", str(tmp_path / "y")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "python -m assignments grade" in done.stdout
    shutil.rmtree(tmp_path / "y")
