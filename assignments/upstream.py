"""How much of a submission is the project's own solution: the share of each stripped function's
reference body (the instructor's code) found in the submitted file, measured as the leak check
measures a copy (make.similarity: the body's syntax with names and constants normalised away, in
runs of at least make.MIN_RUN tokens). A pasted solution, renamed or not, scores near 100%; an
honest one usually well below. Shown to the instructor in the batch's CSV; it decides no grade.
"""

from pathlib import Path

from .make import LEAK_MIN_TOKENS, ROOT, _at_most, _file_pieces, _runs, _tokens, resolve, similarity
from .submission_files import read_submitted


def similarity_to_reference(assignment, files: dict[str, Path], root: Path = ROOT) -> dict[str, float]:
    """{function: the highest similarity of its reference body to any function (or module-level
    code) of the student's file holding it}, for each of the assignment's functions whose body is
    long enough to compare (make.LEAK_MIN_TOKENS) and whose file was submitted. Empty for a
    planted-bug assignment (the copy keeps the bodies). A file that does not parse counts 0."""
    if assignment.plant:
        return {}
    found = {}
    for name in assignment.functions:
        target = resolve(name, root)
        reference = _tokens(target.node.body)
        if len(reference) < LEAK_MIN_TOKENS or target.file not in files:
            continue
        try:
            pieces = _file_pieces(read_submitted(files[target.file]).decode(errors="replace"))
        except Exception:  # noqa: BLE001  (hostile source: too deep to parse, not Python, unreadable)
            found[name] = 0.0
            continue
        runs = _runs(reference)
        found[name] = max([similarity(reference, tokens) for _, tokens, their_runs in pieces
                           if _at_most(runs, their_runs, len(reference)) > 0] or [0.0])
    return found


def describe(found: dict[str, float]) -> str:
    """One CSV cell: each compared function's similarity, the highest first ("" when nothing was
    compared), e.g. "100% predicted_speedup; 41% expected_tokens_per_round"."""
    ranked = sorted(found.items(), key=lambda item: (-item[1], item[0]))
    return "; ".join(f"{share:.0%} {name.rsplit('.', 1)[-1]}" for name, share in ranked)
