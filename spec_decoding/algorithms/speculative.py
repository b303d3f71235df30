"""Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): the output tokens
are distributed exactly as if the target had sampled them alone.

Notation: p is the target's next-token distribution, q the draft's (both after the same
temperature, top-k and top-p).
"""

import time

import torch

from gpt2 import GPT2
from .decoding import (check_sampling_args, record_round, roll_back, round_gamma, round_observers,
                       round_output, start_generation, take_tokens, target_forward)
from ..drafters import Drafter, as_drafter
from ..policies.gamma import make_policy
from ..result import GenerationResult, RoundReport
from ..sampling import logits_to_probs
from .greedy import speculative_sampling_greedy
from .rejection import modified_rejection_sampling, point_masses


@torch.inference_mode()
def speculative_sampling(target: GPT2, draft: GPT2 | Drafter, prompt_ids, max_gen: int, gamma,
                         temperature: float = 1.0, top_k: int | None = None,
                         top_p: float | None = None, generator: torch.Generator | None = None,
                         eos_id: int | None = None, on_tokens=None, gamma_max: int | None = None,
                         cost_model=None, trace: bool = False, on_round=None) -> GenerationResult:
    """Sample up to max_gen tokens that follow the target's distribution exactly, with the drafter
    proposing up to gamma tokens per round. temperature 0 is greedy (speculative_sampling_greedy).

    draft: a GPT2 (the usual smaller model) or any Drafter (spec_decoding.drafters).
    prompt_ids: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window. on_tokens(tokens, sources) is called after each round.
    gamma: an int, "auto", "heuristic" or a GammaPolicy, as in speculative_sampling_greedy. The
    policy sees only earlier rounds, so the output still follows the target's distribution exactly.
    trace=True records every round in result.trace (spec_decoding.presentation.trace: p, q, the draws, ...).
    on_round(report) gets every round as a RoundReport (spec_decoding.result): p, q, the Verdict.
    """
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return speculative_sampling_greedy(target, draft, prompt_ids, max_gen, gamma, eos_id, on_tokens,
                                           gamma_max, cost_model, trace, on_round)
    drafter = as_drafter(draft)
    policy = make_policy(gamma, gamma_max, cost_model, target, drafter, sampled=True)
    tokens, target_cache, stats = start_generation(target, drafter, prompt_ids, max_gen, policy.gamma_max)
    notify, round_trace = round_observers(on_round, trace, tokens, policy.gamma_max, temperature, top_k, top_p)
    out = []
    start = time.perf_counter()
    stop = None
    while not stop:
        policy.tokens_left = max_gen - len(out)
        g = round_gamma(policy.next_gamma(), len(out), max_gen, len(tokens), target, drafter)

        # 1. The drafter proposes up to g tokens with the q each was drawn from (a draft model
        #    samples them, one forward each). None means point masses: a deterministic proposal.
        draft_tokens, draft_probs = drafter.propose(tokens, g, temperature, top_k, top_p, generator)
        if draft_probs is None:
            draft_probs = point_masses(draft_tokens, target.config.vocab_size, target.wte.weight.device)

        # 2. The target gives p after every prefix in one forward: [len(draft_tokens) + 1, V].
        target_logits = target_forward(target, target_cache, tokens, draft_tokens, drafter)
        target_probs = logits_to_probs(target_logits, temperature, top_k, top_p)

        # 3. Accept a prefix of the draft tokens, then draw one token more (spec_decoding.algorithms.rejection).
        verdict = modified_rejection_sampling(target_probs, draft_probs, draft_tokens, generator)
        new_tokens, sources = round_output(draft_tokens, verdict.n_accepted, verdict.next_token)
        record_round(stats, len(draft_tokens), verdict.n_accepted, drafter.forward_calls)
        policy.update(len(draft_tokens), verdict.n_accepted)
        stop = take_tokens(tokens, out, stats, new_tokens, sources, eos_id, max_gen,
                           target.config.n_positions, on_tokens)
        if notify:
            notify(RoundReport(draft_tokens, target_logits, verdict.n_accepted, verdict.next_token, len(out),
                               temperature, target_probs, draft_probs, verdict))

        # 4. Roll the target's cache and the drafter back to the accepted sequence.
        roll_back(target_cache, drafter, len(tokens))
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats, round_trace)
