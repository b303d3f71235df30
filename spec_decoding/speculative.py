"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): the output tokens
are distributed exactly as if the target had sampled them alone.

Notation: p is the target's next-token distribution, q the draft's (both after the same
temperature, top-k and top-p).
"""

import time

import torch

from gpt2 import GPT2
from .decoding import (check_pair, check_positive_int, check_sampling_args, forward_new_tokens,
                       last_token_source, new_cache, prompt_to_list, record_round, roll_back,
                       round_gamma, take_tokens)
from .gamma import make_policy
from .greedy import speculative_sampling_greedy
from .result import FROM_DRAFT, GenerationResult, GenerationStats
from .sampling import logits_to_probs, sample


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), [V]: where to sample after rejecting a draft token. If p <= q
    everywhere (only possible when p == q up to rounding) it is empty, and p itself is used."""
    residual = torch.clamp(target_probs - draft_probs, min=0)
    total = residual.sum()
    return residual / total if total > 0 else target_probs


def modified_rejection_sampling(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                                draft_tokens: list[int], generator: torch.Generator | None = None):
    """One round's accept/resample step.

    target_probs [g + 1, V]: p after each prefix (row g follows all draft tokens).
    draft_probs [g, V]: q, the distributions the draft tokens were sampled from.
    draft_tokens: the g draft tokens.
    Returns (n accepted, next token): draft token x_i is accepted with probability
    min(1, p_i(x)/q_i(x)); at the first rejection the next token is drawn from
    norm(max(0, p_i - q_i)); if all g are accepted, a bonus token is drawn from p_g.
    """
    for i, x in enumerate(draft_tokens):
        r = torch.rand((), generator=generator, device=target_probs.device)
        if r * draft_probs[i, x] < target_probs[i, x]:  # r < p/q, written without dividing
            continue
        return i, int(sample(residual_distribution(target_probs[i], draft_probs[i]), generator))
    g = len(draft_tokens)
    return g, int(sample(target_probs[g], generator))


@torch.inference_mode()
def speculative_sampling(target: GPT2, draft: GPT2, prompt_ids, max_gen: int, gamma,
                         temperature: float = 1.0, top_k: int | None = None,
                         top_p: float | None = None, generator: torch.Generator | None = None,
                         eos_id: int | None = None, on_tokens=None, gamma_max: int | None = None,
                         cost_model=None) -> GenerationResult:
    """Sample up to max_gen tokens that follow the target's distribution exactly, with the draft
    proposing gamma tokens per round. temperature 0 is greedy (speculative_sampling_greedy).

    prompt_ids: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window. on_tokens(tokens, sources) is called after each round.
    gamma: an int, "auto", "heuristic" or a GammaPolicy, as in speculative_sampling_greedy. The
    policy sees only past rounds, so the output stays distributed exactly as the target's.
    """
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return speculative_sampling_greedy(target, draft, prompt_ids, max_gen, gamma, eos_id, on_tokens,
                                           gamma_max, cost_model)
    check_pair(target, draft)
    check_positive_int("max_gen", max_gen)
    policy = make_policy(gamma, gamma_max, cost_model, target, draft)
    tokens = prompt_to_list(prompt_ids, target)  # the whole sequence, prompt first
    target_cache = new_cache(target, len(tokens), max_gen)
    draft_cache = new_cache(draft, len(tokens), max_gen)
    out, stats = [], GenerationStats(drafted_by_position=[0] * policy.gamma_max,
                                 accepted_by_position=[0] * policy.gamma_max)
    start = time.perf_counter()
    stop = None
    while not stop:
        g = round_gamma(policy.next_gamma(), len(out), max_gen, len(tokens), target, draft)

        # 1. The draft samples g tokens, one forward each, keeping each q it sampled from.
        draft_tokens, draft_probs = [], []
        for _ in range(g):
            draft_logits = forward_new_tokens(draft, draft_cache, tokens + draft_tokens)[-1]
            q = logits_to_probs(draft_logits, temperature, top_k, top_p)
            draft_tokens.append(int(sample(q, generator)))
            draft_probs.append(q)

        # 2. The target gives p after every prefix in one forward: [g + 1, V].
        target_logits = forward_new_tokens(target, target_cache, tokens + draft_tokens, g + 1)
        target_probs = logits_to_probs(target_logits, temperature, top_k, top_p)

        # 3. Accept or resample.
        q_all = torch.stack(draft_probs) if draft_probs else target_probs[:0]
        n, next_token = modified_rejection_sampling(target_probs, q_all, draft_tokens, generator)
        new_tokens = draft_tokens[:n] + [next_token]
        sources = [FROM_DRAFT] * n + [last_token_source(n, g)]
        record_round(stats, g, n)
        policy.update(g, n)
        stop = take_tokens(tokens, out, stats, new_tokens, sources, eos_id, max_gen,
                           target.config.n_positions, on_tokens)

        # 4. Roll both caches back to the accepted sequence (O(1): only their lengths move).
        roll_back(target_cache, draft_cache, len(tokens))
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats)
