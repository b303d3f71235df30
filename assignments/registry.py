"""The ready-made assignments (one folder each), and assignments made of named functions."""


import importlib

from .definition import Assignment, AssignmentError, Check

READY_MADE = ("kv_cache", "greedy_speculative", "rejection_sampling", "ngram_drafter", "tree_verify",
              "gamma_cost_model", "find_the_bug")

ASSIGNMENTS: dict[str, Assignment] = {
    name: importlib.import_module(f"{__package__}.{name}").ASSIGNMENT for name in READY_MADE}


def all_checks() -> dict[str, Check]:
    """Every check of every ready-made assignment, by name (names are unique)."""
    return {c.name: c for a in ASSIGNMENTS.values() for c in a.checks}


def custom_assignment(functions: list[str]) -> Assignment:
    """An assignment made of the named functions and every check that exercises one of them.
    A function no check exercises is refused: nothing would grade it."""
    # A "find the bug" assignment's checks grade a planted copy, not functions written from scratch.
    checks = {c.name: c for a in ASSIGNMENTS.values() if not a.plant for c in a.checks
              if set(c.exercises) & set(functions)}
    unchecked = [f for f in functions if not any(f in c.exercises for c in checks.values())]
    if unchecked:
        covered = sorted({f for a in ASSIGNMENTS.values() if not a.plant for c in a.checks for f in c.exercises})
        raise AssignmentError(f"no check exercises {', '.join(unchecked)}, so nothing would grade it "
                              f"(an end-to-end check that never calls it would give the stub full marks). "
                              f"Functions with checks: {', '.join(covered)}; or add checks for it in "
                              f"assignments/<name>/__init__.py")
    removed = tuple(dict.fromkeys(r for a in ASSIGNMENTS.values() if set(a.functions) & set(functions)
                                  for r in a.removed if r not in functions))
    dropped = tuple(dict.fromkeys(d for a in ASSIGNMENTS.values() if set(a.functions) & set(functions)
                                  for d in a.dropped))
    return Assignment(None, tuple(functions), tuple(checks.values()), removed, dropped)


def assignment_of(manifest: dict) -> Assignment:
    """The Assignment a copy's manifest names: a ready-made one, or one made of the checks that
    exercise the named functions."""
    if manifest.get("assignment"):
        if manifest["assignment"] not in ASSIGNMENTS:
            raise AssignmentError(f"no ready-made assignment {manifest['assignment']!r}; "
                                  f"they are {', '.join(sorted(ASSIGNMENTS))}")
        return ASSIGNMENTS[manifest["assignment"]]
    return custom_assignment(manifest["functions"])
