"""The baseline: the target alone, one forward per new token, on its KV cache."""

import time

import torch

from gpt2 import GPT2
from ..caches import forward_new_tokens, new_cache
from ..contracts import GREEDY, Observers, SamplingParams, check_observers, check_positive_int, check_sampling
from ..result import FROM_TARGET, GenerationResult, GenerationStats
from ..sampling import next_token
from .decoding import prompt_to_list, take_tokens


@torch.inference_mode()
def autoregressive_generate(model: GPT2, prefix, max_gen: int, sampling: SamplingParams = GREEDY,
                            eos_id: int | None = None, observers: Observers | None = None) -> GenerationResult:
    """Generate up to max_gen tokens after prefix (a list of ints or a 1-D LongTensor).

    sampling: SamplingParams(temperature, top_k, top_p, generator); the default, GREEDY, takes the
    argmax. Stops at eos_id (kept), max_gen, or a full context window. observers: only on_tokens
    (tokens, sources), called with each new token as it is made (there are no rounds to report).
    """
    check_positive_int("max_gen", max_gen)
    sampling = check_sampling(sampling)
    observers = check_observers(observers, allowed=("on_tokens",), who="autoregressive_generate")
    tokens = prompt_to_list(prefix, model)
    cache = new_cache(model, len(tokens), max_gen)
    out, stats = [], GenerationStats()
    start = time.perf_counter()
    while True:
        logits = forward_new_tokens(model, cache, tokens)[-1]
        stats.target_calls += 1
        token = next_token(logits, *sampling.filters, sampling.generator)
        stop = take_tokens(tokens, out, stats, [token], [FROM_TARGET], eos_id, max_gen,
                           model.config.n_positions, observers.on_tokens)
        if stop:
            break
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats)
