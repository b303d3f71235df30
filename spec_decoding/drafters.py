"""Drafters: whatever proposes the tokens the target verifies.

Speculative decoding does not care where draft tokens come from, only that it knows the
distribution q each one was drawn from. A drafter is a small object with three methods (start,
propose, roll_back); both generators accept one as `draft` (a plain GPT2 is wrapped in
ModelDrafter). To try a new idea, subclass Drafter in this file; the generators do not change.

    ModelDrafter(model)            a second, smaller GPT-2 on its own KV cache (Leviathan et al.)
"""

import torch

from gpt2 import GPT2
from .decoding import forward_new_tokens, new_cache
from .sampling import logits_to_probs, sample


class Drafter:
    """What proposes draft tokens for the target to verify.

    To write your own, subclass this and implement propose() (and start/roll_back if you keep
    state between rounds). Each round the generator:

        1. asks propose(tokens, g, ...) for up to g tokens to follow `tokens`;
        2. scores them with one target forward, accepts a prefix and adds one target token;
        3. calls roll_back(len(tokens) - 1) with the grown sequence: your state may keep only
           its first len(tokens) - 1 tokens (the last one you have not seen yet).

    The one rule that keeps the output exactly the target's: propose() must return the q each
    token was *really* drawn from, after the same temperature/top-k/top-p as the target. A q that
    differs from the one you sampled from (say, before top-k while you sampled after it) makes the
    output drift from the target's distribution without any error; tests/test_drafters.py shows
    the chi-square test catching such a drafter. If your proposal is deterministic, return None
    for q: the generator then treats each token as drawn from a point mass (q(x) = 1).

    Attributes the generators read:
        vocab_size:    the vocabulary its tokens come from, checked against the target's;
                       None if it only proposes tokens it has seen in the sequence.
        n_positions:   the longest sequence it can read (None: no limit); rounds near it draft
                       fewer tokens.
        device:        where its tensors live, checked against the target's (None: no tensors).
        forward_calls: neural-network forward passes since start() (0 for a model-free
                       drafter); the generators report it as the stats' draft_calls.
    """

    vocab_size: int | None = None
    n_positions: int | None = None
    device: torch.device | None = None
    forward_calls: int = 0

    def start(self, prompt: list[int], max_gen: int) -> None:
        """A new generation of up to max_gen tokens after `prompt` begins: allocate caches and
        reset state. The sequence will never be longer than len(prompt) + max_gen."""

    def propose(self, tokens: list[int], num_tokens: int, temperature: float = 0.0,
                top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Up to num_tokens draft tokens to follow `tokens` (the whole sequence so far, prompt
        first; read it, do not keep or change it).

        Returns (draft_tokens, draft_probs). draft_probs [len(draft_tokens), V] float32 is the q
        each token was drawn from (after the same temperature/top-k/top-p as the target), or
        None for a deterministic proposal: a point mass q(x) = 1 on each token. Then token x is
        accepted with probability p(x), and after a rejection the replacement is drawn from the
        residual norm(max(0, p - q)), which is p with x removed, renormalised.
        temperature 0 means greedy: the generator compares tokens with the target's argmax and
        ignores q. Fewer tokens than asked (even none) are fine; none makes the round a plain
        target step.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement propose()")

    def roll_back(self, length: int) -> None:
        """Only the first `length` tokens of what it was shown are still the sequence."""


class ModelDrafter(Drafter):
    """A second, smaller GPT-2 proposes the tokens: one forward per token, on its own KV cache.

    After a round its cache keeps the accepted sequence minus the last token. It never fed its
    own last proposal, so after a fully accepted round it is one token short and the next
    propose() feeds it the two tokens it lacks (forward_new_tokens feeds whatever the cache has
    not seen).
    """

    def __init__(self, model: GPT2):
        if not isinstance(model, GPT2):
            raise TypeError(f"ModelDrafter needs a GPT2 model, got {type(model).__name__}")
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.n_positions = model.config.n_positions
        self.device = model.wte.weight.device
        self.cache = None

    def start(self, prompt: list[int], max_gen: int) -> None:
        self.cache = new_cache(self.model, len(prompt), max_gen)
        self.forward_calls = 0

    def next_logits(self, tokens: list[int]) -> torch.Tensor:
        """One draft forward: the logits [V] of the token after `tokens`."""
        self.forward_calls += 1
        return forward_new_tokens(self.model, self.cache, tokens)[-1]

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        draft_tokens, draft_probs = [], []
        for _ in range(num_tokens):
            logits = self.next_logits(tokens + draft_tokens)
            if temperature == 0:
                draft_tokens.append(int(logits.argmax()))
            else:
                q = logits_to_probs(logits, temperature, top_k, top_p)  # [V], as the target's p
                draft_tokens.append(int(sample(q, generator)))
                draft_probs.append(q)
        return draft_tokens, torch.stack(draft_probs) if draft_probs else None

    def roll_back(self, length: int) -> None:
        self.cache.truncate(min(self.cache.length, length))


def as_drafter(draft) -> Drafter:
    """The generators' `draft` argument: a Drafter, or a GPT2 (wrapped in a ModelDrafter)."""
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, GPT2):
        return ModelDrafter(draft)
    raise TypeError(
        f"draft must be a GPT2 model or a Drafter (spec_decoding.drafters), got {type(draft).__name__}"
    )
