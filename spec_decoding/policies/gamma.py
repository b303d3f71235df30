"""How many tokens to draft in each round: gamma policies.

Before each round the generator asks its policy for g (0 = no drafting: a plain target step), and
after the round tells it how many tokens were drafted and how many the target accepted. A policy
sees only past rounds, so whatever it chooses, speculative sampling stays lossless.

  FixedGamma(4)       gamma=4: the same g every round (the paper's setting).
  HeuristicGamma      gamma="heuristic": transformers' schedule, +2 after a round whose draft
                      tokens were all accepted, -1 (never below 1) otherwise. Blind to costs.
  AutoGamma           gamma=a CostModel (the scripts' --gamma auto): the g with the most expected
                      tokens per second, from the acceptance seen so far and the measured costs;
                      g = 0 when speculation does not pay, with a cheap probe now and then.

AutoGamma's rule. Let a_i be the chance that draft token i is accepted given that the ones before
it were (estimated per position, see acceptance_by_position). A round drafting g tokens yields
E(g) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_g tokens (theory.expected_tokens_by_position) and takes
g * t_draft + t_target(g + 1) seconds (CostModel.round_seconds), so it picks

    g* = argmax_{g in 0..gamma_max}  E(g) / (g t_draft + t_target(g + 1))

which, divided by one target step, is Leviathan's predicted speed-up E(g) / (g c + verify_cost(g))
(g = 0 gives exactly 1: the target alone).

A losing spell ends: speculation stays on while the estimates say it pays, or while it is still
unsure (optimistic estimates), but a spell of drafting whose tokens per second, measured over its
rounds, fall below a plain step's rate ends it (measured_speedup); then only a probe now and then
drafts, until the estimates say drafting pays again. The seconds are the CostModel's (below), so
what this cannot see is a CostModel that is itself wrong, e.g. measured in a busy moment.

Costs, and what a seed reproduces. AutoGamma decides from the CostModel it is handed and the
tokens accepted, nothing else, and measures nothing itself: the same costs, prompt, models and seed
give the same gammas, so the same random draws and the same tokens, however fast the machine runs
this time. The scripts hand it the pair's costs kept on this machine (spec_decoding.cli.kept_costs:
measured the first time, then read from the kernel cache), so a seeded run reproduces in every
process on this machine; after `python -m gpt2.speed.kernel_report --remeasure`, or on another
machine, the costs, so the gammas and the sampled tokens, may differ, while their distribution stays
the target's exactly (a CostModel saved to a file, --cost-model FILE in the scripts, carries the
costs to another machine).

To write your own policy, subclass GammaPolicy and pass an instance as gamma=; the generators
need no change.
"""

import itertools
import math

from .costs import CostModel
from ..contracts import check_positive_int

DEFAULT_GAMMA_MAX = 8
POLICY_NAMES = ("auto", "heuristic")


class GammaPolicy:
    """Chooses each round's draft length from what earlier rounds showed.

    gamma_max: the most it will ever choose (the generators size their per-position stats by it).
    """
    gamma_max: int = 1
    tokens_left: int | None = None  # set by the generator before each next_gamma(): tokens still to make

    def next_gamma(self) -> int:
        """How many tokens to draft in the coming round, 0..gamma_max (the generator may draft
        fewer near the end of the output, and a drafter may propose fewer)."""
        raise NotImplementedError

    def update(self, drafted: int, accepted: int) -> None:
        """The round just finished: `drafted` tokens were proposed, the first `accepted` of them
        kept (accepted < drafted: token accepted + 1 was rejected)."""


class FixedGamma(GammaPolicy):
    def __init__(self, gamma: int):
        check_positive_int("gamma", gamma)
        self.gamma = self.gamma_max = gamma

    def next_gamma(self) -> int:
        return self.gamma

    def __repr__(self):
        return f"FixedGamma({self.gamma})"


class HeuristicGamma(GammaPolicy):
    """transformers' "heuristic" num_assistant_tokens schedule: start high, +2 after a round whose
    draft tokens were all accepted, -1 after one with a rejection, never below 1 (so it never turns
    speculation off) and here never above gamma_max."""

    def __init__(self, gamma_max: int = DEFAULT_GAMMA_MAX, start: int | None = None):
        check_positive_int("gamma_max", gamma_max)
        self.gamma_max = gamma_max
        self.gamma = gamma_max if start is None else max(1, min(start, gamma_max))

    def next_gamma(self) -> int:
        return self.gamma

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:  # nothing was drafted: nothing learned
            return
        step = 2 if accepted == drafted else -1
        self.gamma = max(1, min(self.gamma + step, self.gamma_max))

    def __repr__(self):
        return f"HeuristicGamma(gamma_max={self.gamma_max}, now {self.gamma})"


class AutoGamma(GammaPolicy):
    """The g in 0..gamma_max with the most expected tokens per second (see the module docstring),
    from the CostModel handed in (its gamma_max unless a smaller one is given) and the acceptance
    so far, plus a schedule of probes while speculation is off.

    Acceptance estimates: per draft position i, a_i = (accepted_i + s * a) / (judged_i + s), where
    judged_i counts rounds in which the target judged position i (all tokens before it accepted),
    and the prior a = (all accepted + s * prior_alpha) / (all judged + s) pools every position, so
    positions rarely drafted borrow from the others (s = PRIOR_STRENGTH). Every drafting round
    multiplies the old counts by DECAY: the estimates follow the text as it changes.

    The opening. The costs already say from which acceptance a round of g = 1 pays: (1 + a) /
    round_seconds(1) > 1 / round_seconds(0), i.e. a > c + verify_cost(1) - 1 (g1_break_even).
    Whatever the prior says, the first round drafts one token, at once: before any evidence one
    token tells the most, and the draft has only the prompt to read. Drafting goes on while the
    estimates, or optimistic ones (each a_i `optimism` posterior standard deviations higher, the
    deviations from all the rounds judged so far, so they shrink as the generation goes on), say
    some g beats a plain step, and stops as soon as neither does: with a draft that never agrees
    after one to a few rounds, fewer the dearer the draft. A spell of drafting whose tokens per
    second, in the CostModel's seconds over MIN_EVIDENCE rounds or more, fall below a plain step's
    (measured_speedup() < 1) ends too, however optimistic the estimates, and optimism then counts
    for nothing until a probe is accepted. The target scoring k tokens is taken as never cheaper
    than scoring fewer, whatever a CostModel from a busy moment says.

    Probes. While it is off, plain rounds add nothing to the estimates, so now and then it drafts one
    token anyway (a probe), which costs a round of g = 1 more than a plain step, plus the draft's
    catch-up over the plain rounds' tokens (CostModel.catch_up_seconds). The probe comes after the
    fewest plain rounds whose probe_budget share pays for it (probe_every), never after so many that
    the draft would read more than max_catch_up rows at once, and not while fewer tokens are left
    to make (the generator sets tokens_left) than that wait. Each rejected probe in a row that
    leaves the estimate of a_1 below half of g = 1's break-even doubles the wait, so a draft that
    never agrees costs a few probes per generation, while one near break-even keeps its probes.
    Where no acceptance could pay (could_pay), it never probes.

    The parameters, each default explained once:
      prior_alpha = 0.5    the acceptance assumed before any round: no lean either way.
      optimism = 2.0       posterior standard deviations added while unsure: about a one-sided 98%
                           bound, so a draft that could pay is rarely dropped on bad luck.
      probe_budget = 0.02  the share of the plain rounds' time probes may cost: a draft that never
                           agrees slows plain decoding by about 2% at most.
      max_catch_up = 64    the most rows of skipped output a probe's draft forward reads at once:
                           beyond it a catch-up forward costs more than a step, whatever the wait.
    """

    PRIOR_STRENGTH = 2.0  # the prior counts as two judged tokens: the first rounds already move it
    DECAY = 0.95  # old counts fade by 5% a drafting round: a memory of about 20 rounds
    MIN_EVIDENCE = 4  # rounds before a spell's measured rate may end it (fewer are one or two tokens' luck)

    def __init__(self, cost_model: CostModel, gamma_max: int | None = None, prior_alpha: float = 0.5,
                 optimism: float = 2.0, probe_budget: float = 0.02, max_catch_up: int = 64):
        if not isinstance(cost_model, CostModel):
            raise ValueError(f"AutoGamma needs a CostModel, got {type(cost_model).__name__}")
        gamma_max = cost_model.gamma_max if gamma_max is None else gamma_max
        check_positive_int("gamma_max", gamma_max)
        if gamma_max > cost_model.gamma_max:
            raise ValueError(f"gamma_max={gamma_max} but the CostModel covers gamma up to "
                             f"{cost_model.gamma_max}: calibrate it with gamma_max={gamma_max}")
        if not (0 <= prior_alpha <= 1 and optimism >= 0 and probe_budget > 0):
            raise ValueError("AutoGamma needs 0 <= prior_alpha <= 1, optimism >= 0 and probe_budget > 0")
        check_positive_int("max_catch_up", max_catch_up)
        self.costs, self.gamma_max = cost_model, gamma_max
        self.prior_alpha, self.optimism = prior_alpha, optimism
        self.probe_budget, self.max_catch_up = probe_budget, max_catch_up
        # The target scoring k tokens, as measured but never cheaper than scoring fewer: a
        # CostModel measured on a busy machine can say otherwise, and a longer draft would then
        # look cheaper than a shorter one.
        self.target_score_s = list(itertools.accumulate(cost_model.target_score_s, max))
        self.judged = [0.0] * gamma_max  # decayed counts per draft position
        self.judged_ever = [0] * gamma_max  # the same, not decayed: how sure the estimates are
        self.accepted = [0.0] * gamma_max
        self.plain_rounds = 0  # plain rounds chosen since the last drafting round
        self.rejected_probes = 0  # probes rejected in a row (each doubles the wait for the next)
        self._probe_round = False  # the round under way is a probe
        # Tokens the draft has not seen after the last drafting round: the round's last one, and
        # after a fully accepted round also the draft's own last proposal (it never fed it).
        self.draft_behind = 1
        # The current spell of drafting (the rounds since the last plain one): tokens made, seconds
        # spent (as costed), rounds; losing: the spell measured slower than plain decoding.
        self.made, self.spent, self.evidence = 0, 0.0, 0
        self.plain_rounds_before, self.losing = False, False
        self._rates: dict[float, list[float]] = {}  # tokens_per_second by optimism, until an estimate moves
        self._plain_until = 0  # plain steps with nothing to decide while plain_rounds is below it

    def round_seconds(self, gamma: int) -> float:
        """The expected wall time of a round drafting gamma tokens."""
        return gamma * self.costs.draft_step_s + self.target_score_s[gamma]

    def probe_extra_seconds(self, plain_rounds: int) -> float:
        """What a probe after `plain_rounds` plain rounds costs more than a plain step: a round of
        g = 1 instead of g = 0, and the draft's catch-up over the plain rounds' tokens."""
        catch_up = self.costs.catch_up_seconds(plain_rounds + self.draft_behind) - self.costs.draft_step_s
        return self.round_seconds(1) - self.round_seconds(0) + catch_up

    @property
    def probe_every(self) -> int | None:
        """Plain rounds before a probe: the fewest n whose probe_budget share of n plain steps pays
        for the probe's extra time (catch-up included), doubled for each rejected probe in a row,
        and never more than max_catch_up - draft_behind. None where no such n pays for it."""
        bound = max(1, self.max_catch_up - self.draft_behind)
        plain = self.round_seconds(0)
        base = next((n for n in range(1, bound + 1)
                     if self.probe_extra_seconds(n) <= self.probe_budget * n * plain), None)
        return None if base is None else min(base * 2 ** min(self.rejected_probes, 16), bound)

    def acceptance_by_position(self, optimism: float = 0.0) -> list[float]:
        """[gamma_max]: the current estimate of a_i for each draft position: the mean of its Beta
        posterior, plus `optimism` posterior standard deviations (capped at 1)."""
        s = self.PRIOR_STRENGTH
        pooled = (sum(self.accepted) + s * self.prior_alpha) / (sum(self.judged) + s)
        alphas = []
        for accepted, judged, ever in zip(self.accepted, self.judged, self.judged_ever):
            n, mean = ever + s, (accepted + s * pooled) / (judged + s)
            alphas.append(min(1.0, mean + optimism * math.sqrt(mean * (1 - mean) / (n + 1))))
        return alphas

    def tokens_per_second(self, optimism: float = 0.0) -> list[float]:
        """[gamma_max + 1]: expected tokens per second of a round drafting g = 0..gamma_max:
        E(g) / round_seconds(g), E(g) = E(g - 1) + a_1 ... a_g (theory.expected_tokens_by_position)."""
        if optimism not in self._rates:
            expected, all_accepted = [1.0], 1.0
            for a in self.acceptance_by_position(optimism):
                all_accepted *= a
                expected.append(expected[-1] + all_accepted)
            self._rates[optimism] = [expected[g] / self.round_seconds(g) for g in range(self.gamma_max + 1)]
        return self._rates[optimism]

    def measured_speedup(self) -> float | None:
        """Tokens per second of the current spell of drafting rounds over a plain step's rate, in
        the CostModel's seconds: below 1, speculation has been losing. None before MIN_EVIDENCE rounds."""
        if self.evidence < self.MIN_EVIDENCE:
            return None
        return self.made / self.spent * self.round_seconds(0)

    def next_gamma(self) -> int:
        if self.plain_rounds < self._plain_until:
            # Off, and nothing has changed since it decided so (a plain round changes no estimate):
            # a plain step, with no more work than a plain step's, until a probe is due.
            self.plain_rounds += 1
            return 0
        rates = self.tokens_per_second()
        opening = not self.judged_ever[0]  # no draft token judged yet: the estimates are the prior's
        best = max(range(1, 2 if opening else self.gamma_max + 1), key=rates.__getitem__)
        if rates[best] > rates[0]:  # the estimates say drafting pays
            return best
        if (measured := self.measured_speedup()) is not None and measured < 1:
            self.losing = True
        # The first round drafts one token whatever the prior says; later, optimistic estimates
        # keep it drafting while unsure, unless the spell has been losing.
        if opening and self.could_pay():
            return 1
        if not self.losing and max(self.tokens_per_second(self.optimism)[1:]) > rates[0]:
            return best
        wait = self.probe_every if self.could_pay() else None
        # A probe comes after `wait` plain rounds whose probe_budget share pays for it, and only
        # while at least as many tokens are left to make: what it finds needs rounds to pay back.
        if wait is not None and self.tokens_left is not None and self.tokens_left < wait:
            wait = None
        if wait is not None and self.plain_rounds >= wait:
            self._probe_round = True
            return 1
        self._plain_until = wait if wait is not None else \
            math.inf if self.tokens_left is None else self.plain_rounds + self.tokens_left
        self.plain_rounds += 1
        return 0

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            self.plain_rounds_before = True  # the next drafting round starts a new spell
            return
        self._plain_until = 0  # the estimates move: decide afresh
        probe, self._probe_round = self.plain_rounds_before or self._probe_round, False
        if probe:  # a probe, or a spell's first round after plain ones
            self.made, self.spent, self.evidence = 0, 0.0, 0
            self.plain_rounds_before = False
            self.losing = accepted < drafted  # a rejected probe leaves optimism nothing to hold on to
        self.plain_rounds = 0
        self.draft_behind = 2 if accepted == drafted else 1
        self.made += accepted + 1
        self.spent += self.round_seconds(min(drafted, self.gamma_max))
        self.evidence += 1
        self._rates.clear()
        self.judged = [j * self.DECAY for j in self.judged]
        self.accepted = [a * self.DECAY for a in self.accepted]
        for i in range(min(accepted + 1, drafted)):  # positions the target judged
            self.judged[i] += 1
            self.judged_ever[i] += 1
            self.accepted[i] += i < accepted
        if probe:
            # A rejected probe makes the next wait longer only where the estimate is now far below
            # what pays (a draft that never agrees); near break-even, probes keep their pace.
            if accepted == drafted:
                self.rejected_probes = 0
            elif self.acceptance_by_position()[0] < self.g1_break_even() / 2:
                self.rejected_probes += 1

    def could_pay(self) -> bool:
        """Whether some g would beat a plain step were every draft token accepted. If not (a draft
        as slow as the target), probing cannot find anything to use, and it never probes."""
        return any((g + 1) / self.round_seconds(g) > 1 / self.round_seconds(0) for g in range(1, self.gamma_max + 1))

    def g1_break_even(self) -> float:
        """The acceptance from which a round of g = 1 beats a plain step: (1 + a) / round_seconds(1)
        > 1 / round_seconds(0), i.e. a > round_seconds(1) / round_seconds(0) - 1, which is
        c + verify_cost(1) - 1 in the CostModel's terms."""
        return self.round_seconds(1) / self.round_seconds(0) - 1

    def __repr__(self):
        alphas = ", ".join(f"{a:.2f}" for a in self.acceptance_by_position())
        return f"AutoGamma(gamma_max={self.gamma_max}, acceptance by position [{alphas}])"


def make_policy(gamma, target=None, draft=None, sampled: bool = False) -> GammaPolicy:
    """The policy the generators use for their `gamma` argument: an int >= 1 (FixedGamma), a
    CostModel (AutoGamma deciding from those costs, which must be for target and draft: a seeded
    run reproduces; cost_model.up_to(g) bounds it at g), "heuristic" (HeuristicGamma up to
    DEFAULT_GAMMA_MAX), or a GammaPolicy (used as it is). sampled: the rounds sample
    (temperature > 0), so AutoGamma decides from the costs with the sampling a round does
    (CostModel.sampled)."""
    if isinstance(gamma, GammaPolicy):
        return gamma
    if isinstance(gamma, CostModel):
        if target is not None:
            gamma.check_models(target, draft)
        return AutoGamma(gamma.sampled() if sampled else gamma)
    if gamma == "heuristic":
        return HeuristicGamma(DEFAULT_GAMMA_MAX)
    if gamma == "auto":
        raise ValueError('gamma="auto" decides from measured costs: pass the CostModel itself as gamma, '
                         'e.g. gamma=spec_decoding.calibration.calibrate_costs(target, draft) (or a saved one, '
                         'CostModel.load(path); the scripts keep one per machine: spec_decoding.cli.kept_costs)')
    if isinstance(gamma, int) and not isinstance(gamma, bool) and gamma >= 1:
        return FixedGamma(gamma)
    raise ValueError(f"gamma must be an int >= 1, a CostModel (AutoGamma), \"heuristic\" or a GammaPolicy; "
                     f"got {gamma!r}")
