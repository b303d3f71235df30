"""The checks' inputs and reference values, computed with this project's code (the
instructor's), and the small checkpoints they run on."""

import json
from pathlib import Path

from .definition import Assignment

HIDDEN_SEED = 1  # a seed of hidden inputs (tests use it; an official grade draws its own: draw_seed)
VISIBLE_SEED = 0  # the visible inputs, shipped with every copy for the student's own `check`
MAX_SEED = 10_000  # seeds 0..MAX_SEED give valid inputs for every check (tests/test_grader_verdicts.py sweeps them)


def second_seed(seed: int) -> int:
    """The seed of a statistical check's second, independent draw (Check.statistical) at `seed`:
    above MAX_SEED, so never a first draw's seed (the visible inputs' included), and another for
    every seed."""
    return MAX_SEED + 1 + seed


def draw_seed() -> int:
    """A fresh seed of hidden inputs for one official grade (1..MAX_SEED): what one grade's messages
    show about its inputs does not answer the next grade's."""
    import secrets

    return 1 + secrets.randbelow(MAX_SEED)


def official_seed(seed: int | None) -> int:
    """The seed of an official grade: `seed` (the instructor's, e.g. to reproduce a grade), or a fresh
    one. Never the visible inputs' seed: a lookup table of the answers shipped with the copy would
    pass them."""
    from .definition import AssignmentError

    if seed is None:
        return draw_seed()
    if seed == VISIBLE_SEED:
        raise AssignmentError(f"--seed {seed} gives the visible inputs, shipped with every copy: an official grade "
                              f"runs on hidden ones. Give a seed between 1 and {MAX_SEED}, or leave --seed out "
                              f"for a fresh one (the report says which, to reproduce it)")
    return seed


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
    instructor's: never the student's), and for a statistical check a second draw's under "retry"
    (second_seed). Every check's inputs are made from `seed`: VISIBLE_SEED for
    the visible inputs `make` ships with the copy, any other for an official grade's hidden inputs
    (every check, the visible ones included: a lookup table of the shipped answers earns nothing)."""
    import torch

    from .definition import AssignmentError

    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise AssignmentError(f"--seed {seed}: give a seed between 0 and {MAX_SEED} (every one of them gives "
                              f"valid inputs to every check; others are not tested)")
    torch.set_num_threads(1)
    out = {}
    for check in checks or assignment.checks:
        out[check.name] = _entry(check, data, seed)
        if check.statistical:  # its second, independent draw (graded if the first is Unlikely)
            out[check.name]["retry"] = _entry(check, data, second_seed(seed))
    return out


def _entry(check, data: Path, seed: int) -> dict:
    inputs = check.make_inputs(seed)
    reference = (check.reference or check.probe)(inputs, data)
    return {"inputs": inputs, "reference": json.loads(json.dumps(reference))}


def for_student(assignment: Assignment, refs: dict, student: str | None) -> dict:
    """refs with the references of the checks that differ per student's copy (Check.personal:
    find_the_bug's planted bug) made for `student` (None: the class's, unchanged)."""
    if student is None:
        return refs
    out = dict(refs)
    for check in assignment.checks:
        if check.personal is not None and check.name in refs:
            entry = refs[check.name]
            out[check.name] = {**entry, "reference": check.personal(entry["inputs"], entry["reference"], student)}
    return out


def failing_checks(assignment: Assignment, data: Path, refs: dict) -> dict[str, str]:
    """{check: its message} for every check in refs that the instructor's own code fails, run in
    this process (trusted code: no child needed), as a student fails it: a statistical check fails
    only if its second draw fails too. At a seed where a statistical check fails the reference
    twice, it fails every student who draws random numbers as the reference does."""
    from .definition import Failed, Unlikely

    failures, runs = {}, {}  # what each run's probe returned: checks judging one run share it, as in grading
    for check in assignment.checks:
        if check.name not in refs:
            continue
        entry = refs[check.name]
        try:
            _judge_here(check, data, entry, runs)
        except Unlikely as failure:
            if "retry" not in entry:
                failures[check.name] = str(failure)
                continue
            try:
                _judge_here(check, data, entry["retry"], runs)
            except Failed as again:
                failures[check.name] = f"{failure}; a second, independent draw failed too: {again}"
        except Failed as failure:
            failures[check.name] = str(failure)
    return failures


def _judge_here(check, data: Path, entry: dict, runs: dict) -> None:
    """Judge the instructor's code on one entry ({"inputs", "reference"}) in this process: Failed
    if it fails."""
    from .definition import same_run
    from .forms import read
    from .serving import serve_here

    inputs, reference = entry["inputs"], entry["reference"]
    server = check.serve(inputs, reference, data) if check.serve else None
    serve_here(server)
    try:
        key = same_run(check, inputs), json.dumps(inputs, sort_keys=True)  # a served check's retry: a run of its own
        if key not in runs:
            runs[key] = json.loads(json.dumps(check.probe(inputs, data)))
        got = read(check.form(inputs, reference), runs[key])
        check.judge(inputs, reference, got, *([server.record()] if server else []))
    finally:
        serve_here(None)


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
