"""Assignment 7: find the bug (README.md here; instructor.md: the notes).

Built from the bug zoo (spec_decoding/checks/bug_zoo.py): `make` copies the project with one of the zoo's
bugs planted into the real code (plants.json, the grader's file, says which; it is left out of
every copy). Nothing is removed. The student names the bug in BUG.txt and fixes it; the grader
checks both, in separate checks:

- bug_named (1 point, hidden): BUG.txt names the planted bug.
- bug_fixed (3 points): the fixed code passes every check the zoo's bugs are caught by, and still
  speculates: greedy output equal to the target's on a target the grader serves (it counts the
  forwards), exact sampling (chi-square against the enumerated distribution), max_gen and eos
  respected, and acceptance and tokens per target call as the pair's own distributions predict.

So naming without fixing earns a quarter, and so does "fixing" by switching speculation off.

One bug for the class (plants.json's "bug"), or one per student: with an instructor secret (the
environment variable FIND_THE_BUG_SECRET) `make --student ID` plants the bug that the secret and
the student's id pick from the zoo (bug_for), and the grade, told the student's id by the
instructor (`grade --student ID`, or the batch's id of each submission), checks the name against
the bug planted in that copy (references.for_student, personal_reference).
"""

import hashlib
import hmac
import json
import os
import re
from pathlib import Path

import torch

from ..definition import Assignment, AssignmentError, Check, Failed, Unlikely
from ..forms import Int, List, Maybe, Record, Samples, Text, Tokens, Tuple
from ..greedy_speculative import check_speculated, check_tokens, plain_tokens, serve_target, served_reference
from ..probing import PROMPT, function, load, sample_counts, seeded, tokens_of
from ..serving import served_model

ANSWER = "BUG.txt"  # in the copy's root: the student writes the bug's name in it
PLANTS = "assignments/find_the_bug/plants.json"  # the grader's: which bug is planted, and how
GREEDY = "spec_decoding.algorithms.greedy.speculative_sampling_greedy"
# The functions one of which holds the planted bug (the student's files are theirs).
FUNCTIONS = ("spec_decoding.algorithms.decoding.target_forward", "spec_decoding.algorithms.decoding.take_tokens",
             "spec_decoding.algorithms.decoding.round_gamma", "spec_decoding.algorithms.rejection.residual_distribution",
             "spec_decoding.algorithms.rejection.modified_rejection_sampling")
TEMPLATE = """\
# Which bug is planted in this copy? Write its name, as the bug zoo spells it (spec_decoding/checks/bug_zoo.py,
# BUGS; notebooks/06_bug_zoo), on the line below, e.g.:  resample from p
# Lines starting with # are ignored. Then fix the bug in the code.

"""


SECRET = "FIND_THE_BUG_SECRET"  # the environment variable holding the instructor's secret


def _plants(root: Path) -> dict:
    path = Path(root) / PLANTS
    if not path.is_file():
        raise AssignmentError(f"{path} is missing: it says which bug find_the_bug plants (the instructor's "
                              f"project has it; a student's copy does not)")
    return json.loads(path.read_text())


def bug_for(student: str, secret: str, root: Path) -> str:
    """The bug planted in `student`'s copy: HMAC-SHA256(secret, student id) picks one of the plants
    (sorted by name). Without the secret a student cannot tell which bug another's copy holds."""
    names = sorted(_plants(root)["plants"])
    digest = hmac.new(secret.encode(), f"find_the_bug/{student}".encode(), hashlib.sha256).digest()
    return names[int.from_bytes(digest[:8], "big") % len(names)]


def instructor_secret() -> str | None:
    return os.environ.get(SECRET) or None


def planted_bug(root: Path, student: str | None = None) -> tuple[str, list]:
    """(name, edits) of the bug planted in a copy; edits are (file, old text, new text). The bug
    plants.json chooses, or (a student's id, and the instructor's secret set) the student's own."""
    table = _plants(root)
    name = table["bug"]
    if student is not None:
        secret = instructor_secret()
        if not secret:
            raise AssignmentError(f"a copy for student {student!r} needs the instructor's secret: set {SECRET} "
                                  f"(the same one when you grade)")
        name = bug_for(student, secret, root)
    if name not in table["plants"]:
        raise AssignmentError(f"{PLANTS}: bug {name!r} is not one of its plants: {', '.join(table['plants'])}")
    return name, table["plants"][name]


def plant(out: Path, root: Path, student: str | None = None) -> None:
    """make's hook: plant the chosen bug (the class's, or `student`'s) into the copy at `out`, and
    write BUG.txt's template."""
    name, edits = planted_bug(root, student)
    for file, old, new in edits:
        text = (Path(out) / file).read_text()
        if text.count(old) != 1:
            raise AssignmentError(f"{PLANTS}: the plant of {name!r} expects its text once in {file}, found it "
                                  f"{text.count(old)} times (the code changed: update the plant)")
        (Path(out) / file).write_text(text.replace(old, new))
    (Path(out) / ANSWER).write_text(TEMPLATE)


# ---- the name -----------------------------------------------------------------------------------------

def named_inputs(seed):
    return {}


def named_probe(inputs, data):
    """What BUG.txt says (its first 2,000 characters): raw text, judged by the grader. In the
    instructor's own project (which has plants.json and no BUG.txt: the grader checks that its
    reference solution passes) the planted bug's name."""
    import spec_decoding

    root = Path(spec_decoding.__file__).resolve().parents[1]
    if (root / ANSWER).is_file():
        return (root / ANSWER).read_text(errors="replace")[:2000]
    return planted_bug(root)[0] if (root / PLANTS).is_file() else None


def named_reference(inputs, data):  # the grader's: make strips it from the copy
    from ..make import ROOT

    return {"bug": planted_bug(ROOT)[0]}


def personal_reference(inputs, reference, student: str):
    """The bug planted in this student's copy (with the instructor's secret set), else the class's."""
    from ..make import ROOT

    return {"bug": planted_bug(ROOT, student)[0]} if instructor_secret() else reference


def named_form(inputs, ref):
    return Maybe(Text(2000, what=f"the text of {ANSWER}"))


def normalized(name: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9_/]+", " ", name.lower()).split())


def named_judge(inputs, ref, got):
    if got is None:
        raise Failed(f"{ANSWER} was not submitted: write the bug's name in it")
    lines = [line.strip() for line in got.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not lines:
        raise Failed(f"{ANSWER} names no bug: write the bug's name (as the bug zoo spells it) on a line of its own")
    if normalized(lines[0]) != normalized(ref["bug"]):
        raise Failed(f"{ANSWER} names {lines[0][:80]!r}: that is not the bug planted in this copy")


# ---- the fix ------------------------------------------------------------------------------------------

def fixed_inputs(seed):
    return {"prompt": PROMPT[seed % 3:], "max_gen": 30, "gammas": [2, 4], "seed": 1000 + seed,
            "samples": 1200, "n_tokens": 3, "speed_runs": 8, "speed_max_gen": 24, "gamma": 4,
            "vocab_prompts": [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]}


def fixed_probe(inputs, data):
    """The student's code, run four ways; raw tokens and sources come back, the grader judges:
    greedy on the served target, 3-token samples on the 16-token pair (counts), seeded sampled runs
    with where each token came from (speed), free runs beside the same runs stopped at an eos_id,
    and runs of every max_gen 1..8."""
    from spec_decoding import SamplingParams, speculative_sampling

    target, draft = served_model(data), load(data, "draft")
    greedy = [plain_tokens(function(GREEDY)(target, draft, inputs["prompt"], inputs["max_gen"], g))
              for g in inputs["gammas"]]
    vocab_target, vocab_draft = load(data, "vocab_target"), load(data, "vocab_draft")

    def sample(prompt, max_gen, gamma, seed, **kwargs):
        return speculative_sampling(vocab_target, vocab_draft, prompt, max_gen, gamma,
                                    SamplingParams(temperature=1.0, generator=seeded(seed)), **kwargs)

    g = seeded(inputs["seed"])
    samples = [tokens_of(speculative_sampling(vocab_target, vocab_draft, [1, 2, 3], inputs["n_tokens"], 2,
                                              SamplingParams(temperature=1.0, generator=g)))
               for _ in range(inputs["samples"])]
    prompts = inputs["vocab_prompts"]
    speed = []
    for i in range(inputs["speed_runs"]):
        result = sample(prompts[i % len(prompts)], inputs["speed_max_gen"], inputs["gamma"], inputs["seed"] + i)
        speed.append({"tokens": tokens_of(result), "sources": [str(s) for s in result.stats.token_sources]})
    eos = []  # (a free run, the same run stopped at the token the free run made at position 4)
    for i in range(8):
        prompt, seed = prompts[i % len(prompts)], inputs["seed"] + 100 + i
        free = tokens_of(sample(prompt, 12, 3, seed))
        eos.append([free, tokens_of(sample(prompt, 12, 3, seed, eos_id=free[4]))])
    lengths = [len(tokens_of(sample([1, 2, 3], m, 3, inputs["seed"] + 200 + m))) for m in range(1, 9)]
    return {"greedy": greedy, "samples": samples, "speed": speed, "eos": eos, "lengths": lengths}


def fixed_reference(inputs, data):  # the grader's: make strips it from the copy
    """The served target's greedy outputs and forward count (greedy_speculative's reference), the
    16-token target's exact 3-token distribution, and the pair's acceptance: sum(min(p, q)) averaged
    over the positions of the target's own samples (fresh forwards of both models)."""
    from spec_decoding import SamplingParams, autoregressive_generate
    from spec_decoding.checks import acceptance_by_position, exact_distribution

    runs = [{"prompt": inputs["prompt"], "max_gen": inputs["max_gen"], "gamma": g} for g in inputs["gammas"]]
    reference = served_reference(inputs, data, runs, needs_a_rejection=True)  # as greedy_equals_target
    vocab_target, vocab_draft = load(data, "vocab_target"), load(data, "vocab_draft")
    exact = exact_distribution(vocab_target, [1, 2, 3], inputs["n_tokens"], dict(temperature=1.0)).reshape(-1).tolist()
    alphas = []
    for i in range(16):
        prompt = inputs["vocab_prompts"][i % len(inputs["vocab_prompts"])]
        sampling = SamplingParams(temperature=1.0, generator=seeded(inputs["seed"] + 500 + i))
        tokens = autoregressive_generate(vocab_target, prompt, inputs["speed_max_gen"], sampling).tokens
        alphas += acceptance_by_position(vocab_target, vocab_draft, prompt, tokens, dict(temperature=1.0))
    return {**reference, "exact": exact, "alpha": sum(alphas) / len(alphas)}


Z = 4.0  # standard deviations below the prediction that fail the speed part (one-sided p ~ 3e-5)
SLACK = 0.15  # tokens per call must also be this share below (the formula idealises one alpha)


def speed_problem(inputs, ref, runs) -> str | None:
    """"lossless, but slower" when acceptance or tokens per target call fall well below what the
    pair's measured acceptance predicts (spec_decoding.checks.check_speed, with alpha measured by
    the grader on the target's own samples)."""
    from spec_decoding.policies.theory import expected_tokens_per_round

    alpha, gamma = ref["alpha"], inputs["gamma"]
    judged = accepted = 0
    sizes = []
    for run in runs:
        start = 0
        for end, source in enumerate(run["sources"]):
            judged += source in ("draft", "correction")
            accepted += source == "draft"
            if source != "draft":
                if start + gamma + 1 <= inputs["speed_max_gen"]:
                    sizes.append(end + 1 - start)
                start = end + 1
    if not judged:
        return ("lossless, but slower: nothing was drafted (no token came from the draft or was a correction of "
                "one): the generator must speculate")
    z = (accepted - judged * alpha) / (judged * alpha * (1 - alpha)) ** 0.5
    if z < -Z:
        return (f"lossless, but slower: the target accepted {accepted} of {judged} judged draft tokens "
                f"({accepted / judged:.2f}) where the pair's acceptance sum(min(p, q)) = {alpha:.2f} predicts "
                f"{judged * alpha:.0f}, {-z:.1f} standard deviations below: accept a draft token x with "
                f"probability min(1, p(x)/q(x))")
    predicted = expected_tokens_per_round(alpha, gamma)
    per_call = sum(sizes) / len(sizes) if sizes else 0.0
    sd = (sum((s - per_call) ** 2 for s in sizes) / max(len(sizes) - 1, 1)) ** 0.5
    if sizes and per_call < (1 - SLACK) * predicted and (per_call - predicted) / max(sd / len(sizes) ** 0.5, 1e-9) < -Z:
        return (f"lossless, but slower: {per_call:.2f} tokens per target call where the pair's acceptance "
                f"{alpha:.2f} predicts {predicted:.2f} at gamma {gamma}: fewer tokens are drafted or kept than "
                f"gamma allows")
    return None


SOURCES = ("draft", "correction", "bonus", "target", "draft_branch")  # spec_decoding.result's


def fixed_form(inputs, ref):
    """Raw tokens only (the grader counts): lengths are left open where a planted bug changes them
    (a token past max_gen, tokens after eos), to be judged with the words of the zoo's check."""
    vocab, longest = 16, 4 * inputs["max_gen"]
    run = Record({"tokens": Tokens(None, vocab, at_most=longest),
                  "sources": List(Text(16, SOURCES, "a token's source"), at_most=longest, what="sources")})
    free = List(Int(0, vocab - 1, "a token id"), at_least=5, at_most=longest, what="tokens")  # free[4]: the eos
    return Record({"greedy": Tuple(tuple(Tokens(None, 100, at_most=longest) for _ in inputs["gammas"]), what="gammas"),
                   "samples": Samples(inputs, vocab, at_most=longest),  # a token past max_gen: judged
                   "speed": List(run, inputs["speed_runs"], what="runs"),
                   "eos": List(Tuple((free, Tokens(None, vocab, at_most=longest)), what="runs (free, stopped)"), 8,
                               what="runs"),
                   "lengths": List(Int(0, 10_000), 8, what="max_gens 1..8")})


def fixed_judge(inputs, ref, got, served):
    from spec_decoding.checks import P_VALUE_THRESHOLD, chi_square_p_value, total_variation

    problems, unlikely = [], False
    try:
        for gamma, tokens, want in zip(inputs["gammas"], got["greedy"], ref["tokens"], strict=True):
            check_tokens(tokens, want, f"greedy, gamma={gamma}", hidden=False)
        check_speculated(ref, served, f"greedy, gammas {inputs['gammas']}", hidden=False)
    except Failed as failure:
        problems.append(str(failure))
    for m, length in enumerate(got["lengths"], start=1):
        if length != m:
            problems.append(f"asked for max_gen={m} tokens, got {length}"
                            + (": a token past max_gen" if length > m else ""))
            break
    for free, stopped in got["eos"]:
        eos = free[4]
        expected = free[:free.index(eos) + 1]
        if stopped != expected:
            extra = (f": {len(stopped) - len(expected)} token(s) after eos were kept"
                     if stopped[:len(expected)] == expected else "")
            problems.append(f"with eos_id={eos} the output should stop after {len(expected)} tokens (at the "
                            f"first eos, kept), got {len(stopped)} tokens{extra}")
            break
    counts = torch.tensor(sample_counts(inputs, ref["exact"], got["samples"]), dtype=torch.float64)  # counted here
    exact = torch.tensor(ref["exact"], dtype=torch.float64)
    p_value = chi_square_p_value(counts, exact)
    if p_value < P_VALUE_THRESHOLD:
        unlikely = True
        problems.append(f"sampled output differs from the target's distribution: total variation "
                        f"{total_variation(counts, exact):.3f} over {int(counts.sum())} samples of "
                        f"{inputs['n_tokens']} tokens, chi-square p = {p_value:.1g}")
    slower = speed_problem(inputs, ref, got["speed"])
    if slower:
        problems.append(slower)
    if problems:  # the samples alone: a statistical verdict (graded again on a second draw)
        raise (Unlikely if unlikely and len(problems) == 1 else Failed)("; ".join(problems))


ASSIGNMENT = Assignment(
    name="find_the_bug",
    functions=FUNCTIONS,
    # plants.json says which bug this copy holds. (The zoo and notebook 06 stay: they name every
    # candidate and show the checks that catch each, which is how a student hunts for it.)
    dropped=(PLANTS,),
    readme="assignments/find_the_bug/README.md",
    plant=plant,
    answer_files=(ANSWER,),
    checks=(
        Check("bug_named", FUNCTIONS, named_inputs, named_probe, named_judge, named_form, points=1, visible=False,
              reference=named_reference, personal=personal_reference, about=f"{ANSWER} names the planted bug"),
        Check("bug_fixed", FUNCTIONS, fixed_inputs, fixed_probe, fixed_judge, fixed_form, points=3,
              reference=fixed_reference, serve=serve_target, timeout=180, statistical=True,
              about="greedy exact and speculating, sampling exact, max_gen and eos kept, speed as predicted"),
    ),
)
