"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): the output tokens
are distributed exactly as if the target had sampled them alone.

Notation: p is the target's next-token distribution, q the draft's (both after the same
temperature, top-k and top-p).
"""

import time

import torch

from gpt2 import GPT2
from ..contracts import Observers, SamplingParams, check_observers, check_sampling
from ..drafters import Drafter, as_drafter
from ..policies.gamma import make_policy
from ..result import GenerationResult, RoundReport
from ..sampling import logits_to_probs
from .decoding import (record_round, roll_back, round_gamma, round_observers,
                       round_output, start_generation, take_tokens, target_forward)
from .greedy import speculative_sampling_greedy
from .rejection import modified_rejection_sampling, point_masses


@torch.inference_mode()
def speculative_sampling(target: GPT2, draft: GPT2 | Drafter, prefix, max_gen: int, gamma,
                         sampling: SamplingParams = SamplingParams(), eos_id: int | None = None,
                         observers: Observers | None = None) -> GenerationResult:
    """Sample up to max_gen tokens that follow the target's distribution exactly, with the drafter
    proposing up to gamma tokens per round.

    draft: a GPT2 (the usual smaller model) or any Drafter (spec_decoding.drafters).
    prefix: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window.
    sampling: SamplingParams(temperature, top_k, top_p, generator), applied alike to p and q;
    temperature 0 is greedy (speculative_sampling_greedy).
    gamma: an int, a CostModel (AutoGamma, on a sampled round's costs), "heuristic" or a
    GammaPolicy, as in speculative_sampling_greedy. The policy sees only earlier rounds, so the
    output still follows the target's distribution exactly.
    observers: Observers(on_tokens, on_round, trace), as in speculative_sampling_greedy; a
    RoundReport here also holds p, q and the Verdict, a trace the draws.
    """
    sampling = check_sampling(sampling)
    if sampling.greedy:
        return speculative_sampling_greedy(target, draft, prefix, max_gen, gamma, eos_id, observers)
    observers = check_observers(observers)
    drafter = as_drafter(draft)
    policy = make_policy(gamma, target, drafter, sampled=True)
    tokens, target_cache, stats = start_generation(target, drafter, prefix, max_gen, policy.gamma_max)
    notify, round_trace = round_observers(observers, tokens, policy.gamma_max, sampling)
    temperature, top_k, top_p = sampling.filters
    out = []
    start = time.perf_counter()
    stop = None
    while not stop:
        policy.tokens_left = max_gen - len(out)
        g = round_gamma(policy.next_gamma(), len(out), max_gen, len(tokens), target, drafter)

        # 1. The drafter proposes up to g tokens with the q each was drawn from (a draft model
        #    samples them, one forward each). None means point masses: a deterministic proposal.
        draft_tokens, draft_probs = drafter.propose(tokens, g, temperature, top_k, top_p, sampling.generator)
        if draft_probs is None:
            draft_probs = point_masses(draft_tokens, target.config.vocab_size, target.wpe.weight.device)

        # 2. The target gives p after every prefix in one forward: [len(draft_tokens) + 1, V].
        target_logits = target_forward(target, target_cache, tokens, draft_tokens, drafter)
        target_probs = logits_to_probs(target_logits, temperature, top_k, top_p)

        # 3. Accept a prefix of the draft tokens, then draw one token more (spec_decoding.algorithms.rejection).
        verdict = modified_rejection_sampling(target_probs, draft_probs, draft_tokens, sampling.generator)
        new_tokens, sources = round_output(draft_tokens, verdict.n_accepted, verdict.next_token)
        record_round(stats, len(draft_tokens), verdict.n_accepted, drafter.forward_calls)
        policy.update(len(draft_tokens), verdict.n_accepted)
        stop = take_tokens(tokens, out, stats, new_tokens, sources, eos_id, max_gen,
                           target.config.n_positions, observers.on_tokens)
        if notify:
            notify(RoundReport(draft_tokens, target_logits, verdict.n_accepted, verdict.next_token, len(out),
                               temperature, target_probs, draft_probs, verdict))

        # 4. Roll the target's cache and the drafter back to the accepted sequence.
        roll_back(target_cache, drafter, len(tokens))
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats, round_trace)
