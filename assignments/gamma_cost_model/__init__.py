"""Assignment 6: choose gamma from a cost model (README.md here; instructor.md: the notes).

Everything here is arithmetic: the probes call the student's functions on a grid of inputs and
return the numbers; the judge compares them with the instructor's and names the usual slips."""

import math
import random

from ..definition import Assignment, Check, Failed
from ..forms import Int, List, Real, Record, Tensor, Tuple
from ..probing import function, number, plain

PER_ROUND = "spec_decoding.policies.theory.expected_tokens_per_round"
SPEEDUP = "spec_decoding.policies.theory.predicted_speedup"
BEST = "spec_decoding.policies.theory.best_gamma"
BY_POSITION = "spec_decoding.policies.theory.expected_tokens_by_position"
ROUND_SECONDS = "spec_decoding.policies.costs.CostModel.round_seconds"
FUNCTIONS = (PER_ROUND, SPEEDUP, BEST, BY_POSITION, ROUND_SECONDS)


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def drawn(seed: int) -> random.Random:
    """The hidden inputs' random numbers (seed 0, the visible inputs, draws none)."""
    return random.Random(f"gamma_cost_model/{seed}")


def grid_inputs(seed):
    if seed == 0:
        return {"alphas": [0.0, 0.3, 0.8, 1.0], "gammas": [0, 1, 4, 8], "cs": [0.05, 0.4]}
    r = drawn(seed)
    alphas = sorted(round(r.uniform(0.05, 0.97), 3) for _ in range(4)) + [1.0]  # alpha = 1: gamma + 1
    gammas = [0] + sorted(r.sample(range(1, 10), 3))
    return {"alphas": alphas, "gammas": gammas, "cs": sorted(round(r.uniform(0.02, 0.5), 3) for _ in range(2))}


def grid_form(inputs, ref):
    return Tensor((len(inputs["alphas"]), len(inputs["gammas"])))


def per_round_probe(inputs, data):
    f = function(PER_ROUND)
    return [[number(f(a, g), "expected_tokens_per_round") for g in inputs["gammas"]] for a in inputs["alphas"]]


def per_round_judge(inputs, ref, got):
    for a, mine, want in zip(inputs["alphas"], got, ref, strict=True):
        for g, x, y in zip(inputs["gammas"], mine, want, strict=True):
            if _close(x, y):
                continue
            hint = ""
            if a == 1.0:
                hint = " (alpha = 1: every draft token is accepted, so gamma + 1; the closed form divides by zero)"
            elif _close(x, y - a ** g * a) or _close(x, y - 1):
                hint = " (the target's own token, the correction or bonus, is missing: it comes every round)"
            raise Failed(f"expected_tokens_per_round(alpha={a}, gamma={g}) = {x}, expected {y}{hint}")


def speedup_probe(inputs, data):
    f = function(SPEEDUP)
    return [[[number(f(a, g, c, 1.2), "predicted_speedup") for g in inputs["gammas"]] for c in inputs["cs"]]
            for a in inputs["alphas"]]


def speedup_form(inputs, ref):
    return Tensor((len(inputs["alphas"]), len(inputs["cs"]), len(inputs["gammas"])))


def speedup_judge(inputs, ref, got):
    for a, by_c, want_c in zip(inputs["alphas"], got, ref, strict=True):
        for c, mine, want in zip(inputs["cs"], by_c, want_c, strict=True):
            for g, x, y in zip(inputs["gammas"], mine, want, strict=True):
                if not _close(x, y):  # a hidden check: the message never shows the expected value
                    raise Failed(f"predicted_speedup(alpha={a}, gamma={g}, c={c}, verify_cost=1.2) = {x} is wrong: "
                                 f"tokens per round over the round's cost, gamma * c + verify_cost")


def _speedup(a, g, c, verify=1.0):
    return (g + 1 if a == 1 else (1 - a ** (g + 1)) / (1 - a)) / (g * c + verify)


def _clear_winner(values) -> bool:
    """The best of these is ahead of the second by more than rounding: another correct way of
    computing them picks the same one."""
    top = sorted(values, reverse=True)
    return len(top) < 2 or top[0] - top[1] > 1e-6 * abs(top[0])


def best_inputs(seed):
    if seed == 0:
        return {"cases": [[0.8, 0.05, 16], [0.6, 0.3, 16], [0.95, 0.01, 12], [0.2, 0.5, 8], [0.9, 0.1, 16]]}
    r, cases = drawn(seed), []
    while len(cases) < 5:
        a, c, n = round(r.uniform(0.2, 0.97), 3), round(r.uniform(0.01, 0.5), 3), r.randint(4, 16)
        if all(_clear_winner([_speedup(a, g, c, v(g)) for g in range(1, n + 1)])
               for v in (lambda g: 1.0, lambda g: 1 + 0.15 * g)):
            cases.append([a, c, n])
    return {"cases": cases}


def best_form(inputs, ref):
    return Record({key: Tuple(tuple(Int(1, n, "a gamma (an int, not its speed-up)") for _, _, n in inputs["cases"]),
                              what="cases")
                   for key in ("plain", "costly")})


def best_probe(inputs, data):
    f = function(BEST)
    fixed = [plain(f(a, c, range(1, n + 1)), "best_gamma") for a, c, n in inputs["cases"]]
    # a verification cost that grows with gamma (as measured on a CPU): 1 + 0.15 gamma
    costly = [plain(f(a, c, range(1, n + 1), lambda g: 1 + 0.15 * g), "best_gamma") for a, c, n in inputs["cases"]]
    return {"plain": fixed, "costly": costly}


def best_judge(inputs, ref, got):
    for key, what in (("plain", "verify_cost=None"), ("costly", "verify_cost=lambda g: 1 + 0.15 * g")):
        for (a, c, n), x, y in zip(inputs["cases"], got[key], ref[key], strict=True):
            if not isinstance(x, int) or isinstance(x, bool):
                raise Failed(f"best_gamma returned {x!r}: return the gamma (an int), not its speed-up")
            if x != y:
                hint = (" (the measured verification cost is ignored: it makes long drafts dearer)"
                        if key == "costly" and x == ref["plain"][inputs["cases"].index([a, c, n])] else "")
                raise Failed(f"best_gamma(alpha={a}, c={c}, gammas=1..{n}, {what}) = {x}, expected {y}: the gamma "
                             f"with the largest predicted speed-up{hint}")


def by_position_inputs(seed):
    if seed == 0:
        return {"cases": [[], [0.5], [0.9, 0.8, 0.5], [1.0, 1.0, 1.0, 0.0, 1.0], [0.3] * 4]}
    r = drawn(seed)
    ones = [1.0] * r.randint(1, 3) + [0.0] + [1.0] * r.randint(1, 2)  # nothing after a rejection counts
    return {"cases": [[], [round(r.uniform(0.05, 0.95), 3)],
                      sorted((round(r.uniform(0.05, 0.99), 3) for _ in range(r.randint(2, 6))), reverse=True),
                      ones, [round(r.uniform(0.1, 0.95), 3)] * r.randint(2, 6)]}


def by_position_form(inputs, ref):
    return List(Real(), len(inputs["cases"]), what="cases")


def by_position_probe(inputs, data):
    f = function(BY_POSITION)
    return [number(f(alphas), "expected_tokens_by_position") for alphas in inputs["cases"]]


def by_position_judge(inputs, ref, got):
    for alphas, x, y in zip(inputs["cases"], got, ref, strict=True):
        if _close(x, y):
            continue
        hint = ""
        if _close(x, 1 + sum(alphas)):
            hint = (" (it adds the alphas: draft token j is kept only if tokens 1..j all are, so add the "
                    "products a1, a1 a2, a1 a2 a3, ...)")
        elif _close(x, y - 1):
            hint = " (the target's own token, 1 every round, is missing)"
        raise Failed(f"expected_tokens_by_position({alphas}) = {x}, expected {y}{hint}")


def seconds_inputs(seed):
    if seed == 0:
        return {"draft_step_s": 0.002, "target_score_s": [0.02, 0.021, 0.023, 0.026, 0.03]}
    return _timing(drawn(seed))


def _timing(r: random.Random) -> dict:
    """A draft step's time, and the target's time to score 1, 2, ... tokens (growing)."""
    scores = [round(r.uniform(0.01, 0.05), 4)]
    for _ in range(r.randint(4, 7)):
        scores.append(round(scores[-1] + r.uniform(0.0005, 0.006), 4))
    return {"draft_step_s": round(r.uniform(0.001, 0.02), 4), "target_score_s": scores}


def seconds_form(inputs, ref):
    return List(Real(0.0), len(inputs["target_score_s"]), what="gammas")


def seconds_probe(inputs, data):
    from spec_decoding.policies.costs import CostModel

    model = CostModel("target", "draft", inputs["draft_step_s"], inputs["target_score_s"])
    return [number(model.round_seconds(g), "CostModel.round_seconds") for g in range(len(inputs["target_score_s"]))]


def seconds_judge(inputs, ref, got):
    d, scores = inputs["draft_step_s"], inputs["target_score_s"]
    for g, (x, y) in enumerate(zip(got, ref, strict=True)):
        if _close(x, y):
            continue
        hint = ""
        if _close(x, g * d + scores[0]):
            hint = " (the target's cost is always one step's: verifying g tokens scores g + 1, target_score_s[g])"
        elif _close(x, g * d + scores[min(g + 1, len(scores) - 1)]):
            hint = " (off by one: target_score_s[k - 1] is k tokens; a round of g draft tokens scores g + 1)"
        raise Failed(f"CostModel.round_seconds({g}) = {x}, expected {y} with draft_step_s={d}, "
                     f"target_score_s={scores}{hint}")


def measured_inputs(seed):
    if seed == 0:
        return {"draft_step_s": 0.004, "target_score_s": [0.02, 0.021, 0.023, 0.026, 0.03, 0.035, 0.041],
                "alphas": [[0.9, 0.85, 0.8, 0.7, 0.6, 0.5], [0.5, 0.4, 0.3, 0.3, 0.2, 0.2],
                           [0.99, 0.98, 0.97, 0.96, 0.95, 0.94], [0.1] * 6]}
    r = drawn(seed)
    while True:
        timing = _timing(r)
        d, scores = timing["draft_step_s"], timing["target_score_s"]
        profiles = [sorted((round(r.uniform(lo, hi), 3) for _ in range(len(scores) - 1)), reverse=True)
                    for lo, hi in ((0.6, 0.99), (0.2, 0.7), (0.9, 0.999), (0.02, 0.3))]
        rates = [[(1 + sum(math.prod(alphas[:j + 1]) for j in range(g))) / (g * d + scores[g])
                  for g in range(len(alphas) + 1)] for alphas in profiles]
        if all(_clear_winner(rate) for rate in rates):
            return {"draft_step_s": d, "target_score_s": scores, "alphas": profiles}


def measured_form(inputs, ref):
    return Tuple(tuple(Record({"rates": List(Real(), len(alphas) + 1, what="gammas"), "best": Int(0, len(alphas))})
                       for alphas in inputs["alphas"]), what="acceptance profiles")


def measured_probe(inputs, data):
    """Choosing gamma as AutoGamma does, with the student's functions: for each acceptance
    profile, the tokens per second of every g (expected tokens of a round over its time) and the g
    with the most."""
    from spec_decoding.policies.costs import CostModel

    model = CostModel("target", "draft", inputs["draft_step_s"], inputs["target_score_s"])
    by_position = function(BY_POSITION)
    out = []
    for alphas in inputs["alphas"]:
        rates = [number(by_position(alphas[:g]), "expected_tokens_by_position")
                 / number(model.round_seconds(g), "CostModel.round_seconds") for g in range(len(alphas) + 1)]
        out.append({"rates": rates, "best": max(range(len(rates)), key=rates.__getitem__)})
    return out


def measured_judge(inputs, ref, got):
    for alphas, mine, want in zip(inputs["alphas"], got, ref, strict=True):
        wrong = [g for g, y in enumerate(want["rates"]) if g >= len(mine["rates"]) or not _close(mine["rates"][g], y)]
        if wrong or mine["best"] != want["best"]:  # a hidden check: the message never shows the right values
            where = (f"the rate for g = {wrong[0]} is wrong" if wrong
                     else "the best g is not the one with the most tokens per second")
            raise Failed(f"with acceptance by position {alphas} and the CostModel's times, tokens per second for "
                         f"g = 0, 1, ... are {[round(x, 2) for x in mine['rates']]}, best g = {mine['best']}: {where} "
                         f"(expected_tokens_by_position(alphas[:g]) / CostModel.round_seconds(g))")


ASSIGNMENT = Assignment(
    name="gamma_cost_model",
    functions=FUNCTIONS,
    # Siblings that hold the answers: break_even_alpha evaluates the speed-up over gammas as
    # best_gamma does; the token tree's expectation and speed-up are the chain's with other names;
    # AutoGamma's round time is the CostModel's with a refitted scale, its tokens per second the
    # expectation by position over it; the batch cost model's best gamma is best_gamma's argmax,
    # its speed-up and verify cost (as CostModel.verify_cost) the round's cost terms.
    removed=("spec_decoding.policies.theory.break_even_alpha", "spec_decoding.policies.theory.expected_tokens_per_tree_round",
             "spec_decoding.policies.theory.predicted_tree_speedup", "spec_decoding.policies.gamma.AutoGamma.round_seconds",
             "spec_decoding.policies.gamma.AutoGamma.tokens_per_second", "spec_decoding.policies.costs.CostModel.verify_cost",
             "spec_decoding.policies.costs.BatchCostModel.verify_cost",
             "spec_decoding.policies.costs.BatchCostModel.predicted_speedup",
             "spec_decoding.policies.costs.BatchCostModel.best_gamma"),
    # The speed-up notebook derives and plots these formulas.
    dropped=("notebooks/04_speedup_theory.*",),
    readme="assignments/gamma_cost_model/README.md",
    checks=(
        Check("tokens_per_round", (PER_ROUND,), grid_inputs, per_round_probe, per_round_judge, grid_form, points=2),
        Check("speedup", (SPEEDUP, PER_ROUND), grid_inputs, speedup_probe, speedup_judge, speedup_form,
              visible=False),
        Check("best_gamma_choice", (BEST, SPEEDUP, PER_ROUND), best_inputs, best_probe, best_judge, best_form,
              points=2),
        Check("tokens_by_position", (BY_POSITION,), by_position_inputs, by_position_probe, by_position_judge,
              by_position_form, points=2),
        Check("round_seconds", (ROUND_SECONDS,), seconds_inputs, seconds_probe, seconds_judge, seconds_form),
        Check("measured_best_gamma", (BY_POSITION, ROUND_SECONDS), measured_inputs, measured_probe, measured_judge,
              measured_form, points=2, visible=False, about="tokens per second of each g from a CostModel, and the best g"),
    ),
)
