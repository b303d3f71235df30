"""The baseline: the target alone, one forward per new token, on its KV cache."""

import time

import torch

from gpt2 import GPT2
from ..caches import forward_new_tokens, new_cache
from ..contracts import check_positive_int
from ..result import FROM_TARGET, GenerationResult, GenerationStats
from ..sampling import next_token
from .decoding import check_sampling_args, prompt_to_list, take_tokens


@torch.inference_mode()
def autoregressive_generate(model: GPT2, prompt_ids, max_gen: int, temperature: float = 0.0,
                            top_k: int | None = None, top_p: float | None = None,
                            generator: torch.Generator | None = None, eos_id: int | None = None,
                            on_tokens=None) -> GenerationResult:
    """Generate up to max_gen tokens after prompt_ids (a list of ints or a 1-D LongTensor).

    temperature 0 is greedy; otherwise temperature, top-k and top-p shape the distribution drawn
    from. Stops at eos_id (kept), max_gen, or a full context window. on_tokens(tokens, sources),
    if given, is called with each new token as it is made.
    """
    check_positive_int("max_gen", max_gen)
    check_sampling_args(temperature, top_k, top_p)
    tokens = prompt_to_list(prompt_ids, model)
    cache = new_cache(model, len(tokens), max_gen)
    out, stats = [], GenerationStats()
    start = time.perf_counter()
    while True:
        logits = forward_new_tokens(model, cache, tokens)[-1]
        stats.target_calls += 1
        token = next_token(logits, temperature, top_k, top_p, generator)
        stop = take_tokens(tokens, out, stats, [token], [FROM_TARGET], eos_id, max_gen,
                           model.config.n_positions, on_tokens)
        if stop:
            break
    stats.stop_reason = stop
    stats.seconds = time.perf_counter() - start
    return GenerationResult(out, stats)
