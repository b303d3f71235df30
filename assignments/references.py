"""The checks' inputs and reference values, computed with this project's code (the
instructor's), and the small checkpoints they run on."""

import json
from pathlib import Path

from .definition import Assignment

HIDDEN_SEED = 1  # the instructor's inputs; the visible ones (shipped with the copy) use seed 0
VISIBLE_SEED = 0
MAX_SEED = 10_000  # seeds 0..MAX_SEED give valid inputs for every check (tests/test_grader_verdicts.py sweeps them)


def make_data(folder: Path) -> Path:
    """The small random checkpoints the checks run on (made with the project's random_weights)."""
    from gpt2 import GPT2Config
    from offline.random_weights import save_agreeing_pair, save_random_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    tiny = GPT2Config(n_layer=4, n_head=2, n_embd=32, n_positions=64, vocab_size=100)
    vocab = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
    save_agreeing_pair(folder / "target", folder / "draft", tiny, draft_n_layer=2, damping=0.1, seed=11,
                       std=0.2, embedding_std=0.3)
    save_random_checkpoint(folder / "unrelated", tiny.with_(n_layer=2), seed=9, std=0.2, embedding_std=0.3)
    # A 16-token pair that agrees about half the time, for exact enumeration.
    save_random_checkpoint(folder / "vocab_target", vocab, seed=21, std=0.2, embedding_std=0.3)
    save_random_checkpoint(folder / "vocab_draft", vocab, seed=22, std=0.2, embedding_std=0.3)
    return folder


def references(assignment: Assignment, data: Path, seed: int, checks=None) -> dict:
    """{check: {"inputs", "reference"}}, computed in this process with this project's code (the
    instructor's: never the student's). The visible checks always get the visible inputs (those
    shipped with the copy: what they print tells the student nothing hidden); `seed` chooses the
    hidden checks' inputs."""
    import torch

    from .definition import AssignmentError

    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise AssignmentError(f"--seed {seed}: give a seed between 0 and {MAX_SEED} (every one of them gives "
                              f"valid inputs to every check; others are not tested)")
    torch.set_num_threads(1)
    out = {}
    for check in checks or assignment.checks:
        inputs = check.make_inputs(VISIBLE_SEED if check.visible else seed)
        reference = (check.reference or check.probe)(inputs, data)
        out[check.name] = {"inputs": inputs, "reference": json.loads(json.dumps(reference))}
    return out


def failing_checks(assignment: Assignment, data: Path, refs: dict) -> dict[str, str]:
    """{check: its message} for every check in refs that the instructor's own code fails, run in
    this process (trusted code: no child needed). At a seed where a statistical check fails the
    reference, it fails every student who draws random numbers as the reference does."""
    from .definition import Failed
    from .serving import serve_here

    failures = {}
    for check in assignment.checks:
        if check.name not in refs:
            continue
        inputs, reference = refs[check.name]["inputs"], refs[check.name]["reference"]
        server = check.serve(inputs, reference, data) if check.serve else None
        serve_here(server)
        try:
            got = json.loads(json.dumps(check.probe(inputs, data)))
            check.judge(inputs, reference, got, *([server.record()] if server else []))
        except Failed as failure:
            failures[check.name] = str(failure)
        finally:
            serve_here(None)
    return failures


def refuse_a_failing_seed(assignment: Assignment, data: Path, refs: dict, seed: int) -> None:
    """An AssignmentError if the reference solution fails a check at this seed (say which, and why)."""
    from .definition import AssignmentError

    failures = failing_checks(assignment, data, refs)
    if failures:
        listing = "\n".join(f"  {name}: {message}" for name, message in failures.items())
        raise AssignmentError(f"at seed {seed} the reference solution itself fails {len(failures)} check(s) of "
                              f"{assignment.name}:\n{listing}\nA statistical check fails a correct solution with "
                              f"a small probability (docs/instructor_guide.md), the same for the whole class at "
                              f"one seed: choose another --seed.")
