"""The speed-up theory of Leviathan et al. (2023), section 3.

alpha: the chance that the target accepts a draft token it judges (measured: GenerationStats.alpha,
accepted / (accepted + rejected); tokens drafted after a rejection are never judged).
gamma: draft tokens per round.
c: the cost of one draft step relative to one target step.
verify_cost: the target's cost of scoring gamma + 1 tokens in one forward, relative to one target
step (1 in the paper's idealisation; a bit more on real hardware).
"""


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """(1 - alpha^(gamma+1)) / (1 - alpha): accepted draft tokens plus the target's own token."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-time speed-up over the target alone: tokens per round over the round's cost,
    (1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + verify_cost))."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + verify_cost)


def best_gamma(alpha: float, c: float, gammas=range(1, 17), verify_cost=None) -> int:
    """The gamma with the largest predicted speed-up. verify_cost: None (=1) or a function of
    gamma giving the measured cost of verifying gamma + 1 tokens."""
    def cost(g):
        return 1.0 if verify_cost is None else verify_cost(g)
    return max(gammas, key=lambda g: predicted_speedup(alpha, g, c, cost(g)))


def expected_tokens_by_position(alphas) -> float:
    """The same expectation when the acceptance chance depends on the draft position: alphas[i]
    is the chance that draft token i + 1 is accepted given that those before it were. Draft token
    j is kept if tokens 1..j all are, so E = 1 + a1 + a1 a2 + ... + a1 ... a_gamma; with every
    alpha equal this is expected_tokens_per_round(alpha, gamma)."""
    expected, all_kept = 1.0, 1.0
    for alpha in alphas:
        all_kept *= alpha
        expected += all_kept
    return expected


def break_even_alpha(c: float, verify_cost=None, gamma_max: int = 16, tol: float = 1e-4) -> float | None:
    """The smallest alpha at which some gamma in 1..gamma_max has predicted_speedup > 1: below it
    speculation does not pay with these costs. None if it never pays (not even at alpha = 1).
    verify_cost: as in best_gamma. The speed-up grows with alpha, so bisection finds it."""
    def cost(g):
        return 1.0 if verify_cost is None else verify_cost(g)

    def pays(alpha):
        return max(predicted_speedup(alpha, g, c, cost(g)) for g in range(1, gamma_max + 1)) > 1.0
    if not pays(1.0):
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pays(mid) else (mid, hi)
    return hi


def expected_tokens_per_tree_round(branching, hit_rate) -> float:
    """A greedy token tree's expected tokens per round, under the simple model that the target's
    token is among the draft's top-b children with probability hit_rate(b), independently at each
    depth: 1 + sum over depths d of prod_{i <= d} hit_rate(branching[i]). With branching (1,) * gamma
    and hit_rate(1) = alpha this is the chain's (1 - alpha^(gamma+1)) / (1 - alpha)."""
    expected, reach = 1.0, 1.0
    for b in branching:
        reach *= hit_rate(b)
        expected += reach
    return expected


def predicted_tree_speedup(tokens_per_round: float, depth: int, c: float, verify_cost: float) -> float:
    """Leviathan's speed-up for any round shape: tokens per round over the round's cost,
    tokens_per_round / (depth * c + verify_cost).

    depth * c is the draft's cost of a round, c being the drafter's draft step (CostModel.c). It
    fits both kinds of tree drafter here, which both spend one draft step per depth:
    - a draft model (spec_decoding.algorithms.tree.build_draft_tree) runs one forward per depth, feeding all
      nodes of that depth at once: one step's cost while a forward is memory-bound (more nodes
      than that start to cost more, and then depth * c is too low);
    - Medusa heads (MedusaDrafter.propose_tree) run one small forward for the whole tree, in which
      each depth is one head on the same feature: depth heads, and c is one head's cost (its
      draft step is a propose of one token, one head).
    depth: the depths the drafter really drafts (Medusa drafts at most one per head).
    verify_cost: the target scoring the root and all the nodes in one forward, relative to one
    target step. A chain is the tree (1,) * gamma: predicted_speedup(alpha, gamma, c, verify_cost)
    is this with tokens_per_round = expected_tokens_per_round(alpha, gamma) and depth = gamma."""
    return tokens_per_round / (depth * c + verify_cost)


# ------------------------------------------------------------------------------------------------
# Batches (spec_decoding/algorithms/batched.py)
# ------------------------------------------------------------------------------------------------
# With B rows decoding together, a round of every row costs gamma batched draft steps of B rows and
# one target forward over B * (gamma + 1) rows, and yields B * (1 - alpha^(gamma+1)) / (1 - alpha)
# tokens on average (every row accepts its own count). Batched autoregressive decoding yields B
# tokens per target forward over B rows. Divide the two throughputs and B cancels: the speed-up
# at batch B is predicted_speedup with the costs measured at B rows,
#     c(B) = draft step of B rows / target step of B rows,
#     verify_cost(B, gamma) = target forward of B * (gamma + 1) rows / target step of B rows.
# While a forward is memory-bound (reading the weights dominates), more rows cost little, and
# verify_cost stays near 1. Once the rows' arithmetic dominates, a forward of B * (gamma + 1) rows
# costs about gamma + 1 steps of B rows: verification is no longer free, and the speed-up falls
# below 1. spec_decoding.policies.costs.BatchCostModel holds the measured costs by rows.


def crossover_batch_size(speedup_by_batch: dict[int, float]) -> int | None:
    """The smallest batch size whose speed-up is <= 1 (from there on speculation does not pay),
    or None if it pays at every batch size given."""
    return next((b for b in sorted(speedup_by_batch) if speedup_by_batch[b] <= 1.0), None)
