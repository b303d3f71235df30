"""Course assignments built on this project: strip functions for students, grade their copies.

    python -m assignments make --assignment rejection_sampling --out DIR      # the student's copy
    python -m assignments grade DIR [--json]                                  # the instructor's grade
    python -m assignments check                      # the student, inside their copy: visible checks
    python -m assignments export gradescope rejection_sampling --out hw.zip
    python -m assignments export github-classroom rejection_sampling --out DIR

Each ready-made assignment is a folder here (assignments/<name>/: README.md, instructor.md and
__init__.py defining ASSIGNMENT: its functions, checks, points). docs/instructor_guide.md is the
instructor's guide.
"""

import importlib

from .definition import Assignment, Check, Failed  # noqa: F401  (Failed: for checks written elsewhere)

READY_MADE = ("kv_cache", "greedy_speculative", "rejection_sampling", "ngram_drafter", "tree_verify",
              "gamma_cost_model")

ASSIGNMENTS: dict[str, Assignment] = {
    name: importlib.import_module(f"{__name__}.{name}").ASSIGNMENT for name in READY_MADE}


def all_checks() -> dict[str, Check]:
    """Every check of every ready-made assignment, by name (names are unique)."""
    return {c.name: c for a in ASSIGNMENTS.values() for c in a.checks}


def custom_assignment(functions: list[str]) -> Assignment:
    """An assignment made of the named functions and every check that exercises one of them.
    A function no check exercises is refused: nothing would grade it."""
    from .make import AssignmentError

    checks = {c.name: c for c in all_checks().values() if set(c.exercises) & set(functions)}
    unchecked = [f for f in functions if not any(f in c.exercises for c in checks.values())]
    if unchecked:
        covered = sorted({f for c in all_checks().values() for f in c.exercises})
        raise AssignmentError(f"no check exercises {', '.join(unchecked)}, so nothing would grade it "
                              f"(an end-to-end check that never calls it would give the stub full marks). "
                              f"Functions with checks: {', '.join(covered)}; or add checks for it in "
                              f"assignments/<name>/__init__.py")
    removed = tuple(dict.fromkeys(r for a in ASSIGNMENTS.values() if set(a.functions) & set(functions)
                                  for r in a.removed if r not in functions))
    dropped = tuple(dict.fromkeys(d for a in ASSIGNMENTS.values() if set(a.functions) & set(functions)
                                  for d in a.dropped))
    return Assignment(None, tuple(functions), tuple(checks.values()), removed, dropped)
