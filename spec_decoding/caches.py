"""A model's KV cache during a generation: made with room for the whole generation, and fed
the tokens it has not seen yet. The generators and the drafters both feed models this way."""

import torch

from gpt2 import GPT2


def new_cache(model: GPT2, prompt_len: int, max_gen: int, extra_slots: int = 0, n_layer: int | None = None):
    """A KV cache with room for the longest sequence this generation can feed (plus extra_slots
    for a token tree's nodes, which share positions), made by the model's own factory
    (GPT2.new_kv_cache: it decides the cache's dtype). n_layer: only the first blocks' (default: all)."""
    return model.new_kv_cache(max_len=min(model.config.n_positions, prompt_len + max_gen),
                              extra_slots=extra_slots, n_layer=n_layer)


def forward_new_tokens(model: GPT2, cache, tokens: list[int], num_last_logits: int = 1) -> torch.Tensor:
    """Feed the tokens the cache has not seen yet (tokens[cache.length:]), return the logits of the
    last num_last_logits positions, [num_last_logits, V].

    This one rule covers the prompt (the first call feeds all of it), a single decoding step, and
    the target's verification of the draft tokens."""
    new = torch.tensor([tokens[cache.length:]], device=model.wpe.weight.device)
    return model(new, cache, num_last_logits=num_last_logits)[0]
