"""Assignment 3: modified rejection sampling and the residual (README.md here; instructor.md:
the notes).

The statistical checks give the student's step fixed p and q tables and draft tokens; the child
sends back what the step returned each round, raw, and the grader counts: the joint law of
(accepted or not, output token), compared with the exact one (Pearson's chi-square, p-value
threshold spec_decoding.checks.P_VALUE_THRESHOLD) and, when they disagree, with those classic
mistakes produce, to name the mistake. A step that never accepts and draws from p gives the right
tokens with the wrong joint law: it fails.
"""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..forms import Int, List, Samples, Tuple, like
from ..probing import (follows, function, lossless_reference, max_difference, outcomes, random_distributions,
                       sample_counts, seeded, whole_number)

RESIDUAL = "spec_decoding.algorithms.rejection.residual_distribution"
# The rejection step every generator calls.
REJECTION = "spec_decoding.algorithms.rejection.modified_rejection_sampling"
VOCAB, GAMMA, ROUNDS = 6, 2, 4000


def verdict_of(result) -> tuple[int, int]:
    """(n accepted, next token) from the step's return value: a Verdict or a pair."""
    if hasattr(result, "n_accepted"):
        return result.n_accepted, result.next_token
    n, token = result
    return n, token


# ---- the residual -------------------------------------------------------------------------------------

def residual_inputs(seed):
    pairs = [([0.5, 0.3, 0.2, 0.0], [0.2, 0.5, 0.1, 0.2])] if seed == 0 else []
    p, q = random_distributions(300 + seed, 3, VOCAB), random_distributions(400 + seed, 3, VOCAB)
    pairs += [(p[i].tolist(), q[i].tolist()) for i in range(3)] + [(p[0].tolist(), p[0].tolist())]
    return {"pairs": pairs}


def residual_probe(inputs, data):
    residual = function(RESIDUAL)
    return [as_floats(residual(torch.tensor(p), torch.tensor(q))) for p, q in inputs["pairs"]]


def residual_form(inputs, ref):
    return Tuple(tuple(like(want) for want in ref), what="(p, q) pairs")


def residual_judge(inputs, ref, got):
    for (p, q), mine, want in zip(inputs["pairs"], got, ref, strict=True):
        if max_difference(mine, want) <= 1e-6:
            continue
        short = [round(x, 3) for x in p], [round(x, 3) for x in q]
        if p != q and max_difference(mine, p) <= 1e-6:
            raise Failed(f"residual_distribution(p={short[0]}, q={short[1]}) returned p itself: after a "
                         f"rejection the replacement comes from norm(max(0, p - q)), not p (the bug zoo's "
                         f"'resample from p')")
        if p == q:
            raise Failed(f"residual_distribution(p, p) gave {[round(x, 3) for x in mine]}: when p == q, "
                         f"max(0, p - q) is all zero; return p itself (never sampled in exact arithmetic, "
                         f"but rounding happens)")
        raise Failed(f"residual_distribution(p={short[0]}, q={short[1]}) gave {[round(x, 3) for x in mine]}, "
                     f"expected norm(max(0, p - q)) = {[round(x, 3) for x in want]}")


# ---- one round of the step: raw outcomes from the child, counted here ---------------------------------

def round_inputs(seed, draft="random"):
    return {"p_seed": 500 + seed, "q_seed": 600 + seed, "draft": draft, "rounds": ROUNDS,
            "draft_seed": 650 + seed, "seed": 700 + seed}


def tables(inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """p [GAMMA + 1, V] and q [GAMMA, V] for a round check: q random, q = p (everything must be
    accepted), or point masses (a deterministic drafter: q one-hot on its token)."""
    p = random_distributions(inputs["p_seed"], GAMMA + 1, VOCAB)
    if inputs["draft"] == "same":
        return p, p[:GAMMA].clone()
    if inputs["draft"] == "point":
        q = torch.zeros(GAMMA, VOCAB, dtype=torch.float64)
        q[torch.arange(GAMMA), torch.tensor([1, 3])] = 1.0
        return p, q
    return p, random_distributions(inputs["q_seed"], GAMMA, VOCAB)


def draft_tokens(inputs) -> list[list[int]]:
    """Every round's draft tokens, [rounds][GAMMA], drawn from q with their own generator: the
    probe hands them to the student's step, and the grader draws the same ones to count with
    (it never takes them from the child)."""
    q = tables(inputs)[1].float()
    g = seeded(inputs["draft_seed"])
    return torch.stack([torch.multinomial(q[i], inputs["rounds"], replacement=True, generator=g)
                        for i in range(GAMMA)], 1).tolist()


def round_probe(inputs, data):
    """Run the student's step once per round on fixed p, q and that round's draft tokens; return
    what it decided, raw: [n accepted, next token] per round. It counts nothing."""
    step = function(REJECTION)
    p, q = (t.float() for t in tables(inputs))
    g = seeded(inputs["seed"])
    out = []
    for drafted in draft_tokens(inputs):
        n, token = verdict_of(step(p, q, drafted, g))
        out.append([whole_number(n, "the step's n_accepted"), whole_number(token, "the step's next_token")])
    return out


def round_counts(inputs, got) -> dict:
    """The child's raw outcomes counted here, against the draft tokens drawn here: the joint law of
    what a round returns.
      first  [2, V]: (was the first draft token accepted, the round's first output token)
      second [1 + 2V]: (n = 0), then (n = 1, second output token), (n = 2, second output token)
      bonus  [GAMMA + 1, V]: (n accepted, next token)
      accepted [GAMMA + 1]: how many draft tokens were accepted"""
    rounds = outcomes(got, inputs["rounds"], 2, "the rejection step")
    first, second = [[0] * VOCAB for _ in range(2)], [0] * (1 + 2 * VOCAB)
    bonus, accepted = [[0] * VOCAB for _ in range(GAMMA + 1)], [0] * (GAMMA + 1)
    for drafted, (n, token) in zip(draft_tokens(inputs), rounds, strict=True):
        if not 0 <= n <= GAMMA or not 0 <= token < VOCAB:
            raise Failed(f"the step returned n accepted = {n}, next token = {token}: n must be between 0 and "
                         f"{GAMMA} (the number of draft tokens), the token a token id below {VOCAB}")
        out = drafted[:n] + [token]
        accepted[n] += 1
        first[min(n, 1)][out[0]] += 1
        second[0 if n == 0 else 1 + (n - 1) * VOCAB + out[1]] += 1
        bonus[n][token] += 1
    return {"first": sum(first, []), "second": second, "bonus": sum(bonus, []), "accepted": accepted}


def round_form(inputs, ref):
    """[n accepted, next token] for each of the rounds (their ranges are checked, with a hint, as
    they are counted: round_counts)."""
    return List(List(Int(), 2, what="numbers (n accepted, next token)"), inputs["rounds"], what="rounds")


def lossless_form(inputs, ref):
    return Samples(inputs, round(len(ref) ** (1 / inputs["n_tokens"])))


def round_reference(inputs, data):
    """The exact joint laws round_counts are compared with, and those of classic mistakes (to name
    a mistake when its law fits), computed with the instructor's residual. The grader's alone:
    make strips it from the copy."""
    residual = function(RESIDUAL)
    p, q = tables(inputs)
    beta = torch.minimum(p[:GAMMA], q).sum(-1)  # acceptance probability at each position

    def first_law(accept: torch.Tensor, reject: torch.Tensor) -> list[float]:
        return as_floats(torch.cat([reject, accept]))  # (rejected, token), then (accepted, token)

    overlap = torch.minimum(p[0], q[0])
    inverted = q[0] * torch.clamp(q[0] / p[0].clamp(min=1e-30), max=1.0)
    mistakes = {
        "after a rejection it draws from p instead of norm(max(0, p - q)) (the bug zoo's 'resample from p')":
            first_law(overlap, (1 - overlap.sum()) * p[0]),
        "it accepts with probability min(1, q/p) instead of min(1, p/q)":
            first_law(inverted, (1 - inverted.sum()) * residual(p[0], q[0])),
        "it accepts every draft token (the draft's distribution comes out, not the target's)":
            first_law(q[0], torch.zeros(VOCAB, dtype=torch.float64)),
        "it never accepts a draft token and draws from p (the output follows p, but nothing is gained)":
            first_law(torch.zeros(VOCAB, dtype=torch.float64), p[0]),
    }
    second = torch.cat([(1 - beta[0]).view(1), beta[0] * torch.clamp(p[1] - q[1], min=0),
                        beta[0] * torch.minimum(p[1], q[1])])
    zeros = torch.zeros(GAMMA, VOCAB, dtype=torch.float64)
    bonus_rows = {f"the bonus token is drawn from row {i} of p; it comes after all {GAMMA} draft tokens, so "
                  f"from row {GAMMA} (the last)": as_floats(torch.cat([zeros.reshape(-1), p[i]])) for i in range(GAMMA)}
    return {"first": first_law(overlap, torch.clamp(p[0] - q[0], min=0)), "first_mistakes": mistakes,
            "second": as_floats(second),
            "bonus": as_floats(torch.cat([zeros.reshape(-1), p[GAMMA]])), "bonus_mistakes": bonus_rows,
            "accepted": [1 - beta[0].item(), (beta[0] * (1 - beta[1])).item(), (beta[0] * beta[1]).item()]}


HINT = ("accept draft token x with probability min(1, p(x)/q(x)); at the first rejection draw from "
        "norm(max(0, p - q)); if all are accepted draw the bonus from the last row of p")


def first_token_judge(inputs, ref, got):
    follows(round_counts(inputs, got)["first"], ref["first"], ref["first_mistakes"],
            "whether the first draft token is accepted, and the round's first token, do not follow the exact "
            "joint law (accepted x: min(p, q)(x); rejected, then y: max(0, p - q)(y))", HINT)


def second_token_judge(inputs, ref, got):
    follows(round_counts(inputs, got)["second"], ref["second"], {},
            "how many draft tokens are accepted, and the round's second token, do not follow the exact joint law",
            HINT)


def acceptance_judge(inputs, ref, got):
    follows(round_counts(inputs, got)["accepted"], ref["accepted"], {},
            "the number of accepted draft tokens does not follow the theory (token i is accepted with "
            "probability sum(min(p_i, q_i)), once all before it were)", HINT)


def bonus_judge(inputs, ref, got):
    counts = round_counts(inputs, got)
    rounds = sum(counts["accepted"])
    if counts["accepted"][GAMMA] != rounds:
        raise Failed(f"with q == p every draft token must be accepted (min(1, p/q) = 1), but in "
                     f"{rounds - counts['accepted'][GAMMA]} of {rounds} rounds some were rejected")
    follows(counts["bonus"], ref["bonus"], ref["bonus_mistakes"],
            f"the bonus token does not follow the last row of p (p[{GAMMA}])", HINT)


# ---- end to end: speculative sampling with the student's functions --------------------------------------

def lossless_inputs(seed):
    return {"prompt": [1, 2, 3], "n_tokens": 3, "samples": 500, "gamma": 2, "seed": seed}


def lossless_probe(inputs, data):
    from spec_decoding import SamplingParams, speculative_sampling

    from ..probing import load

    target, draft = load(data, "vocab_target"), load(data, "vocab_draft")
    g = seeded(inputs["seed"])
    return [[whole_number(t, "the generator's token") for t in
             speculative_sampling(target, draft, inputs["prompt"], inputs["n_tokens"], inputs["gamma"],
                                  SamplingParams(temperature=1.0, generator=g)).tokens] for _ in range(inputs["samples"])]


def lossless_judge(inputs, ref, got):
    follows(sample_counts(inputs, ref, got), ref, {},
            f"speculative sampling with your functions: {inputs['samples']} samples of {inputs['n_tokens']} "
            f"tokens do not follow the target's exactly enumerated distribution", HINT)


ASSIGNMENT = Assignment(
    name="rejection_sampling",
    functions=(RESIDUAL, REJECTION),
    # The token tree's multi-draft step is this step when every node has one child.
    removed=("spec_decoding.algorithms.rejection.multi_draft_rejection_sampling",),
    # Notebook 05 tests a naive multi-draft rule whose accept line is this step's.
    dropped=("notebooks/05_token_trees.*",),
    readme="assignments/rejection_sampling/README.md",
    # Points follow the idea, the accept/reject rule: a step that never accepts and draws from p
    # (right tokens, nothing gained) earns only the residual and the end-to-end check, 2 of 10.
    checks=(
        Check("residual", (RESIDUAL,), residual_inputs, residual_probe, residual_judge, residual_form, points=1),
        Check("first_token", (REJECTION, RESIDUAL), round_inputs, round_probe, first_token_judge, round_form, points=3,
              reference=round_reference, statistical=True,
              about="(accepted?, first token) follows the exact joint law (chi-square)"),
        Check("bonus_token", (REJECTION,), lambda seed: round_inputs(seed, "same"), round_probe, bonus_judge,
              round_form, reference=round_reference, statistical=True,
              about="q == p: all accepted, the bonus follows the last row"),
        Check("acceptance_rate", (REJECTION,), round_inputs, round_probe, acceptance_judge, round_form, visible=False,
              reference=round_reference, statistical=True),
        Check("second_token", (REJECTION, RESIDUAL), round_inputs, round_probe, second_token_judge, round_form,
              points=2,
              visible=False, reference=round_reference, statistical=True),
        Check("point_mass_draft", (REJECTION, RESIDUAL), lambda seed: round_inputs(seed, "point"), round_probe,
              first_token_judge, round_form, visible=False, reference=round_reference, statistical=True,
              about="a deterministic drafter (q one-hot)"),
        Check("lossless", (REJECTION, RESIDUAL), lossless_inputs, lossless_probe, lossless_judge, lossless_form,
              visible=False, reference=lossless_reference, timeout=120, statistical=True),
    ),
)
