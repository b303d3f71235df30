"""Greedy speculative decoding: the output is exactly the target's own greedy output."""

import time

import torch

from gpt2 import GPT2
from ..contracts import GREEDY, Observers, check_observers
from ..drafters import Drafter, as_drafter
from ..policies.gamma import make_policy
from ..result import GenerationResult, RoundReport
from .decoding import (record_round, roll_back, round_gamma, round_observers, round_output,
                       start_generation, take_tokens, target_forward)


@torch.inference_mode()
def speculative_sampling_greedy(target: GPT2, draft: GPT2 | Drafter, prefix, max_gen: int, gamma,
                                eos_id: int | None = None, observers: Observers | None = None) -> GenerationResult:
    """Each round the drafter proposes up to gamma tokens (a draft model: its argmax, one forward
    each), the target scores them all in one forward, and draft tokens are kept while they equal
    the target's argmax; then the target's own argmax is appended (a correction, or a bonus if all
    matched).

    draft: a GPT2 (the usual smaller model) or any Drafter (spec_decoding.drafters).
    prefix: list of ints or 1-D LongTensor. Stops at eos_id (kept), exactly max_gen new tokens,
    or a full context window.
    gamma: an int, or a policy that chooses each round's draft length from the rounds before it
    (spec_decoding/policies/gamma.py): a CostModel (AutoGamma decides from those measured costs and
    the acceptance so far), "heuristic" (transformers' schedule) or any GammaPolicy.
    observers: Observers(on_tokens, on_round, trace), all optional (spec_decoding.contracts):
    on_tokens(tokens, sources) after each round, on_round(report) with every round as a RoundReport
    (spec_decoding.result), trace=True records every round in result.trace.
    """
    observers = check_observers(observers)
    drafter = as_drafter(draft)
    policy = make_policy(gamma, target, drafter)
    tokens, target_cache, stats = start_generation(target, drafter, prefix, max_gen, policy.gamma_max)
    notify, round_trace = round_observers(observers, tokens, policy.gamma_max, GREEDY)
    out = []
    start = time.perf_counter()
    stop = None
    while not stop:
        policy.tokens_left = max_gen - len(out)
        g = round_gamma(policy.next_gamma(), len(out), max_gen, len(tokens), target, drafter)

        # 1. The drafter proposes up to g tokens (temperature 0: greedy; q is not needed).
        draft_tokens, _ = drafter.propose(tokens, g)

        # 2. The target scores them all in one forward: its argmax after every prefix, [g + 1].
        target_logits = target_forward(target, target_cache, tokens, draft_tokens, drafter)
        target_choice = target_logits.argmax(dim=-1).tolist()

        # 3. Keep the draft tokens the target would have chosen itself, then the target's token.
        n = 0
        while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
            n += 1
        new_tokens, sources = round_output(draft_tokens, n, target_choice[n])
        record_round(stats, len(draft_tokens), n, drafter.forward_calls)
        policy.update(len(draft_tokens), n)
        stop = take_tokens(tokens, out, stats, new_tokens, sources, eos_id, max_gen,
                           target.config.n_positions, observers.on_tokens)
        if notify:
            notify(RoundReport(draft_tokens, target_logits, n, target_choice[n], len(out), 0.0))

        # 4. Roll the target's cache and the drafter back to the accepted sequence.
        roll_back(target_cache, drafter, len(tokens))
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats, round_trace)
