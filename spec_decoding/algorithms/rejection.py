"""The rejection step of speculative sampling: the one place where a draft token is accepted or
replaced, so that the output follows the target's distribution exactly.

Notation: p is the target's next-token distribution, q the draft's (both after the same
temperature, top-k and top-p).

    residual_distribution           norm(max(0, p - q)): where to draw after a rejection
    modified_rejection_sampling     a chain: accept a prefix of the draft tokens, then one token more
    point_masses                    q for a proposal that was not sampled (a one-hot row per token)
    multi_draft_rejection_sampling  a tree node: several children drawn from the same q (SpecInfer)

A leaf module: it imports torch and spec_decoding.sampling only, so every generator can use it.
"""

from dataclasses import dataclass

import torch

from ..sampling import sample


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), [V]: where to sample after rejecting a draft token. If p <= q
    everywhere (only possible when p == q up to rounding) it is empty, and p itself is used."""
    residual = torch.clamp(target_probs - draft_probs, min=0)
    total = residual.sum()
    return residual / total if total > 0 else target_probs


@dataclass
class Verdict:
    """What one round's rejection step decided (and what a trace shows of it)."""

    n_accepted: int  # draft tokens accepted, a prefix of the proposal
    next_token: int  # drawn from the residual after a rejection, or from p (the bonus)
    uniforms: list[float]  # the uniform draw r_i each judged draft token was tested with
    residual: torch.Tensor | None  # [V] norm(max(0, p - q)) at the rejection, if there was one


def modified_rejection_sampling(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                                draft_tokens: list[int], generator: torch.Generator | None = None) -> Verdict:
    """One round's rejection step (Leviathan et al. 2023, Algorithm 1).

    target_probs [g + 1, V]: p after each prefix (row g follows all draft tokens).
    draft_probs [g, V]: q, the distributions the draft tokens were sampled from.
    draft_tokens: the g draft tokens.
    Draft token x_i is accepted with probability min(1, p_i(x)/q_i(x)); at the first rejection
    the next token is drawn from norm(max(0, p_i - q_i)); if all g are accepted, a bonus token is
    drawn from p_g. Returns the Verdict: verdict.n_accepted, verdict.next_token, and the draws.
    """
    uniforms = []
    for i, x in enumerate(draft_tokens):
        r = torch.rand((), generator=generator, device=target_probs.device)
        uniforms.append(float(r))
        if r * draft_probs[i, x] < target_probs[i, x]:  # r < p/q, written without dividing
            continue
        residual = residual_distribution(target_probs[i], draft_probs[i])
        return Verdict(i, int(sample(residual, generator)), uniforms, residual)
    g = len(draft_tokens)
    return Verdict(g, int(sample(target_probs[g], generator)), uniforms, None)


def point_masses(draft_tokens: list[int], vocab_size: int, device=None) -> torch.Tensor:
    """q for a deterministic proposal, [len(draft_tokens), V]: row i is one-hot on draft_tokens[i].

    With q(x) = 1, modified rejection sampling accepts x with probability min(1, p(x) / 1) = p(x),
    and after a rejection draws from norm(max(0, p - q)): p with x removed, renormalised. That is
    exactly lossless, and it is not the same as pretending q = p (which would accept everything)."""
    q = torch.zeros(len(draft_tokens), vocab_size, device=device)
    if not draft_tokens:  # a plain target step (each round of it: no index to build)
        return q
    return q.scatter_(1, torch.tensor(draft_tokens, dtype=torch.long, device=device).view(-1, 1), 1.0)


@dataclass
class MultiDraftVerdict:
    """What the rejection step decided at one node of a token tree (and what a trace shows of it)."""

    accepted: int | None  # the index (in draft_tokens) of the accepted child; None: all rejected
    next_token: int | None  # when all were rejected: the token drawn from the final residual
    uniforms: list[float]  # the uniform draw each child tried was tested with, in order
    adjusted_p: list[float]  # p'(x) each child tried faced: p(x) for the first, then the residual's
    residual: torch.Tensor  # [V] the target the last child tried faced, updated if it was rejected


def multi_draft_rejection_sampling(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                                   draft_tokens: list[int], generator=None) -> MultiDraftVerdict:
    """SpecInfer's multi-draft rejection sampling at one node (Miao et al. 2023, "multi-step
    speculative sampling", for children drawn independently from q).

    target_probs p [V] and draft_probs q [V] at the node; draft_tokens x_1..x_b were drawn
    independently from q. Children are tried one after the other: x_i is accepted with probability
    min(1, r(x_i) / q(x_i)) where r is the current target, starting at r = p; after a rejection
    r becomes norm(max(0, r - q)). If all are rejected the token is drawn from the final r.

    Why the token is distributed exactly as p. Let S(r, k) be this procedure with target r and k
    children left. Claim: S(r, k) outputs a token distributed as r. k = 0: it draws from r. k > 0:
    the first child is one step of ordinary speculative sampling with target r: draw x from q,
    accept with min(1, r(x)/q(x)), and on rejection draw from norm(max(0, r - q)). That step
    outputs exactly r (Leviathan et al. 2023, Theorem 1), whatever does the drawing after a
    rejection, as long as it follows norm(max(0, r - q)). Here S(norm(max(0, r - q)), k - 1) does,
    by the claim for k - 1. So S(p, b) outputs p. The update after each rejection is essential:
    testing every child against the unchanged p accepts too often (a token the draft likes gets
    b chances), and tests/test_tree.py shows that variant fails the exactness test.
    """
    residual, uniforms, adjusted_p = target_probs, [], []
    for i, x in enumerate(draft_tokens):
        r = torch.rand((), generator=generator, device=target_probs.device)
        uniforms.append(float(r))
        adjusted_p.append(float(residual[x]))
        if r * draft_probs[x] < residual[x]:  # r < residual(x) / q(x), written without dividing
            return MultiDraftVerdict(i, None, uniforms, adjusted_p, residual)
        residual = residual_distribution(residual, draft_probs)
    return MultiDraftVerdict(None, int(sample(residual, generator)), uniforms, adjusted_p, residual)
