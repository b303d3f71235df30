"""Turning logits into a next token: temperature, then top-k, then top-p, then a draw.

The speculative functions apply exactly these steps to both models, so the draft's distribution q
and the target's distribution p are filtered the same way.
"""

import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] (float32, each row sums to 1).

    temperature > 0 divides the logits; top_k keeps the k largest logits (ties with the k-th are
    kept too); top_p keeps the smallest set of most likely tokens whose probability reaches top_p.
    """
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Drop a token if the more likely ones already reach top_p (the first one is always kept).
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """probs [..., V] -> token ids [...], one draw per row.

    Inverse-CDF sampling: draw u uniformly below the total probability and take the first token
    whose cumulative probability exceeds u. Tokens of probability 0 are never picked. (The same
    law as torch.multinomial, which is far slower per draw over GPT-2's 50257 tokens on a CPU.)
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(cdf.shape[:-1] + (1,), generator=generator, device=cdf.device, dtype=cdf.dtype)
    token = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return token.squeeze(-1).clamp(max=probs.shape[-1] - 1)


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, generator: torch.Generator | None = None) -> int:
    """logits [V] -> one token id: the argmax when temperature == 0, else a draw."""
    if temperature == 0:
        return int(logits.argmax())
    return int(sample(logits_to_probs(logits, temperature, top_k, top_p), generator))
