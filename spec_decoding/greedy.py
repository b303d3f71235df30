"""Greedy speculative decoding: the output is exactly the target's own greedy output."""

import time

import torch

from gpt2 import GPT2
from .decoding import (check_pair, check_positive_int, forward_new_tokens, last_token_source,
                       new_cache, prompt_to_list, record_round, roll_back, round_gamma, take_tokens)
from .gamma import make_policy
from .result import FROM_DRAFT, GenerationResult, GenerationStats


@torch.inference_mode()
def speculative_sampling_greedy(target: GPT2, draft: GPT2, prompt_ids, max_gen: int, gamma,
                                eos_id: int | None = None, on_tokens=None, gamma_max: int | None = None,
                                cost_model=None) -> GenerationResult:
    """Each round the draft proposes gamma tokens (its argmax, one forward each), the target
    scores them all in one forward, and draft tokens are kept while they equal the target's
    argmax; then the target's own argmax is appended (a correction, or a bonus if all matched).

    prompt_ids: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window. on_tokens(tokens, sources) is called after each round.
    gamma: an int, or a policy choosing each round's draft length (spec_decoding/gamma.py): "auto"
    (from the measured costs, cost_model, and the acceptance so far), "heuristic", or a GammaPolicy;
    gamma_max bounds them.
    """
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

        # 1. The draft proposes g tokens greedily, one forward each.
        draft_tokens = []
        for _ in range(g):
            draft_logits = forward_new_tokens(draft, draft_cache, tokens + draft_tokens)[-1]
            draft_tokens.append(int(draft_logits.argmax()))

        # 2. The target scores them all in one forward. Row i of target_logits comes after
        #    draft_tokens[:i], so it checks draft_tokens[i]; row g gives the token after all of them.
        target_logits = forward_new_tokens(target, target_cache, tokens + draft_tokens, g + 1)
        target_choice = target_logits.argmax(dim=-1).tolist()  # [g + 1]

        # 3. Keep the draft tokens the target would have chosen itself, then the target's token.
        n = 0
        while n < g and draft_tokens[n] == target_choice[n]:
            n += 1
        new_tokens = draft_tokens[:n] + [target_choice[n]]
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
