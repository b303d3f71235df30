"""Assignment 3: modified rejection sampling and the residual (README.md here; instructor.md:
the notes).

The statistical checks give the student's step fixed p and q tables and count what it returns;
the grader compares the counts with the exact distributions (Pearson's chi-square, p-value
threshold spec_decoding.checks.P_VALUE_THRESHOLD) and, when they disagree, with the distributions
classic mistakes produce, to name the mistake.
"""

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..probing import function, lossless_reference, max_difference, random_distributions, seeded

RESIDUAL = "spec_decoding.rejection.residual_distribution"
# The rejection step every generator calls.
REJECTION = "spec_decoding.rejection.modified_rejection_sampling"
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


def residual_judge(inputs, ref, got):
    if len(got) != len(ref):
        raise Failed(f"expected {len(ref)} results, got {len(got)}")
    for (p, q), mine, want in zip(inputs["pairs"], got, ref):
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


# ---- one round of the step, counted -------------------------------------------------------------------

def round_inputs(seed, draft="random"):
    return {"p_seed": 500 + seed, "q_seed": 600 + seed, "draft": draft, "rounds": ROUNDS, "seed": 700 + seed}


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


def round_probe(inputs, data):
    """Run the student's step `rounds` times on fixed p, q (draft tokens drawn from q here) and
    count: the round's first output token, its second (when the first draft token was accepted),
    how many were accepted, and the bonus token (when all were)."""
    step = function(REJECTION)
    p, q = (t.float() for t in tables(inputs))
    g = seeded(inputs["seed"])
    first, second, bonus, accepted = [0] * VOCAB, [0] * VOCAB, [0] * VOCAB, [0] * (GAMMA + 1)
    for _ in range(inputs["rounds"]):
        draft_tokens = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(GAMMA)]
        n, token = verdict_of(step(p, q, draft_tokens, g))
        if not (isinstance(n, int) and 0 <= n <= GAMMA) or not 0 <= int(token) < VOCAB:
            raise TypeError(f"the step returned n accepted = {n!r}, next token = {token!r}: n must be an int "
                            f"between 0 and {GAMMA}, the token an int below {VOCAB}")
        out = draft_tokens[:n] + [int(token)]
        accepted[n] += 1
        first[out[0]] += 1
        if n >= 1:
            second[out[1]] += 1
        if n == GAMMA:
            bonus[int(token)] += 1
    return {"first": first, "second": second, "bonus": bonus, "accepted": accepted}


def round_reference(inputs, data):
    """The exact distributions the counts are compared with, and those classic mistakes give
    (to name a mistake when its distribution fits), computed with the instructor's residual."""
    residual = function(RESIDUAL)
    p, q = tables(inputs)

    def mistakes(i):
        overlap = torch.minimum(p[i], q[i])
        inverted = q[i] * torch.clamp(q[i] / p[i].clamp(min=1e-30), max=1.0)
        return {
            "after a rejection it draws from p instead of norm(max(0, p - q)) (the bug zoo's 'resample from p')":
                as_floats(overlap + (1 - overlap.sum()) * p[i]),
            "it accepts with probability min(1, q/p) instead of min(1, p/q)":
                as_floats(inverted + (1 - inverted.sum()) * residual(p[i], q[i])),
            "it accepts every draft token (the draft's distribution comes out, not the target's)": as_floats(q[i]),
        }
    return {"p": as_floats(p), "mistakes": [mistakes(i) for i in range(GAMMA)],
            "acceptance": torch.minimum(p[0], q[0]).sum().item()}


def _test(counts, probs) -> float:
    from spec_decoding.checks import chi_square_p_value

    return chi_square_p_value(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64))


HINT = ("accept draft token x with probability min(1, p(x)/q(x)); at the first rejection draw from "
        "norm(max(0, p - q)); if all are accepted draw the bonus from the last row of p")


def _named(counts, probs, mistakes: dict, what: str, hint: str = HINT):
    """Raise Failed if the counts do not follow probs, naming a mistake whose distribution fits
    (else giving the hint)."""
    from spec_decoding.checks import P_VALUE_THRESHOLD, total_variation

    p_value = _test(counts, probs)
    if p_value >= P_VALUE_THRESHOLD:
        return
    tv = total_variation(torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64))
    fits = [words for words, alternative in mistakes.items() if _test(counts, alternative) >= P_VALUE_THRESHOLD]
    cause = f"the counts fit a known mistake: {fits[0]}" if fits else hint
    raise Failed(f"{what}: total variation {tv:.3f} from the exact distribution, chi-square p = {p_value:.1g} "
                 f"(threshold {P_VALUE_THRESHOLD:g}; {sum(counts)} samples): {cause}")


def first_token_judge(inputs, ref, got):
    _named(got["first"], ref["p"][0], ref["mistakes"][0], "the first token of a round does not follow p[0]")


def second_token_judge(inputs, ref, got):
    _named(got["second"], ref["p"][1], ref["mistakes"][1],
           "after an accepted first draft token, the round's second token does not follow p[1]")


def acceptance_judge(inputs, ref, got):
    expected = ref["acceptance"]
    rounds = sum(got["accepted"])
    rate = 1 - got["accepted"][0] / rounds
    sd = (expected * (1 - expected) / rounds) ** 0.5
    if abs(rate - expected) > 5 * sd:
        raise Failed(f"the first draft token was accepted {rate:.3f} of the time; the theory says "
                     f"sum(min(p, q)) = {expected:.3f} (accept x with probability min(1, p(x)/q(x)))")


def bonus_judge(inputs, ref, got):
    p = ref["p"]
    rounds = sum(got["accepted"])
    if got["accepted"][GAMMA] != rounds:
        raise Failed(f"with q == p every draft token must be accepted (min(1, p/q) = 1), but in "
                     f"{rounds - got['accepted'][GAMMA]} of {rounds} rounds some were rejected")
    wrong_rows = {f"the bonus token is drawn from row {i} of p; it comes after all {GAMMA} draft tokens, "
                  f"so from row {GAMMA} (the last)": p[i] for i in range(GAMMA)}
    _named(got["bonus"], p[GAMMA], wrong_rows, f"the bonus token does not follow the last row of p (p[{GAMMA}])")


# ---- end to end: speculative sampling with the student's functions --------------------------------------

def lossless_inputs(seed):
    return {"prompt": [1, 2, 3], "n_tokens": 3, "samples": 500, "gamma": 2, "seed": seed}


def lossless_probe(inputs, data):
    from spec_decoding import speculative_sampling
    from spec_decoding.checks import counts_of

    from ..probing import load

    target, draft = load(data, "vocab_target"), load(data, "vocab_draft")
    g = seeded(inputs["seed"])
    samples = [speculative_sampling(target, draft, inputs["prompt"], inputs["n_tokens"], inputs["gamma"],
                                    temperature=1.0, generator=g).tokens for _ in range(inputs["samples"])]
    return counts_of(samples, target.config.vocab_size, inputs["n_tokens"]).tolist()


def lossless_judge(inputs, ref, got):
    _named(got, ref, {},
           f"speculative sampling with your functions: {inputs['samples']} samples of {inputs['n_tokens']} "
           f"tokens do not follow the target's exactly enumerated distribution")


ASSIGNMENT = Assignment(
    name="rejection_sampling",
    functions=(RESIDUAL, REJECTION),
    # The token tree's multi-draft step is this step when every node has one child.
    removed=("spec_decoding.rejection.multi_draft_rejection_sampling",),
    # Notebook 05 tests a naive multi-draft rule whose accept line is this step's.
    dropped=("notebooks/05_token_trees.*",),
    readme="assignments/rejection_sampling/README.md",
    checks=(
        Check("residual", (RESIDUAL,), residual_inputs, residual_probe, residual_judge, points=2),
        Check("first_token", (REJECTION, RESIDUAL), round_inputs, round_probe, first_token_judge, points=2,
              reference=round_reference, about="the round's first token follows p[0] (chi-square)"),
        Check("bonus_token", (REJECTION,), lambda seed: round_inputs(seed, "same"), round_probe, bonus_judge,
              reference=round_reference, about="q == p: all accepted, the bonus follows the last row"),
        Check("acceptance_rate", (REJECTION,), round_inputs, round_probe, acceptance_judge, visible=False,
              reference=round_reference),
        Check("second_token", (REJECTION, RESIDUAL), round_inputs, round_probe, second_token_judge,
              visible=False, reference=round_reference),
        Check("point_mass_draft", (REJECTION, RESIDUAL), lambda seed: round_inputs(seed, "point"), round_probe,
              first_token_judge, visible=False, reference=round_reference,
              about="a deterministic drafter (q one-hot)"),
        Check("lossless", (REJECTION, RESIDUAL), lossless_inputs, lossless_probe, lossless_judge, points=2,
              visible=False, reference=lossless_reference, timeout=120),
    ),
)
