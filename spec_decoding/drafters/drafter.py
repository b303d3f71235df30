"""Drafters: whatever proposes the tokens the target verifies.

Speculative decoding does not care where draft tokens come from, only that it knows the
distribution q each one was drawn from. A drafter is a small object with three methods (start,
propose, roll_back); both generators accept one as `draft` (a plain GPT2 is wrapped in
ModelDrafter). To try a new idea, subclass Drafter in this file; the generators do not change.

    ModelDrafter(model)            a second, smaller GPT-2 on its own KV cache (Leviathan et al.)
    NGramDrafter(max_ngram)        prompt lookup: copy what followed the last n tokens earlier on
    LayerSkipDrafter(target, k)    the target's own first k blocks (self-speculative decoding)
"""

import torch

from gpt2 import GPT2
from ..caches import forward_new_tokens, new_cache
from ..sampling import logits_to_probs, sample


def model_facts(model: GPT2) -> tuple[int, int, torch.device]:
    """(vocab_size, n_positions, device) of a drafter that drafts with this GPT-2 model."""
    return model.config.vocab_size, model.config.n_positions, model.wpe.weight.device


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

    Token trees (spec_decoding/algorithms/tree.py): a drafter may also build the round's tree itself with an
    optional method propose_tree(tokens, branching, temperature, top_k, top_p, generator) ->
    TokenTree (see MedusaDrafter), where tree.draft_probs[node] is the q the node's children were
    drawn from. Without it, trees need a draft model.

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

    def observe_target_features(self, start: int, features: torch.Tensor) -> None:
        """The target's features [T, n_embd] at positions start .. start + T - 1, which its forward
        just fed (GPT2.forward(return_features=True): the residual stream before ln_f). Called
        after every target forward, before roll_back: the rejected draft tokens' positions are
        among them, and the roll_back that follows says which positions are still the sequence.
        Drafters that read tokens only ignore it; feature drafters (spec_decoding/drafters/medusa.py,
        spec_decoding/drafters/eagle.py) draft from what the target computed, at no extra target cost."""


class FeatureDrafter(Drafter):
    """A drafter that drafts from the target's features: it keeps them per position, like a KV
    cache, so after roll_back(length) it holds the features of the first `length` positions of
    the accepted sequence (self.features[:self.n_features])."""

    def __init__(self, target: GPT2):
        self.target = target
        self.vocab_size, self.n_positions, self.device = model_facts(target)
        self.features = None
        self.n_features = 0

    def start(self, prompt: list[int], max_gen: int) -> None:
        c = self.target.config
        max_len = min(c.n_positions, len(prompt) + max_gen)
        self.features = torch.zeros(max_len, c.n_embd, device=self.device, dtype=self.target.wpe.weight.dtype)
        self.n_features = 0
        self.forward_calls = 0

    def observe_target_features(self, start: int, features: torch.Tensor) -> None:
        if start > self.n_features:
            raise ValueError(f"features start at position {start} but only {self.n_features} are known")
        self.features[start:start + len(features)] = features
        self.n_features = start + len(features)

    def roll_back(self, length: int) -> None:
        self.n_features = min(self.n_features, length)

    def last_feature(self, tokens: list[int]) -> torch.Tensor | None:
        """The target's feature [n_embd] at the position before the last token of `tokens` (the
        one its own head used to choose that token), or None before the target has seen it (the
        first round, when the prompt is not fed yet)."""
        if self.n_features < len(tokens) - 1 or len(tokens) < 2:
            return None
        return self.features[len(tokens) - 2]


class ModelDrafter(Drafter):
    """A second, smaller GPT-2 proposes the tokens: one forward per token, on its own KV cache.

    After a round its cache keeps the accepted sequence minus the last token. It never fed its
    own last proposal, so after a fully accepted round it is one token short and the next
    propose() feeds it the two tokens it lacks (forward_new_tokens feeds whatever the cache has
    not seen).
    """

    def __init__(self, model: GPT2, extra_slots: int = 0):
        """extra_slots: cache slots beyond the sequence, for a token tree's nodes (spec_decoding.algorithms.tree)."""
        if not isinstance(model, GPT2):
            raise TypeError(f"ModelDrafter needs a GPT2 model, got {type(model).__name__}")
        self.model = model
        self.extra_slots = extra_slots
        self.vocab_size, self.n_positions, self.device = model_facts(model)
        self.cache = None

    def start(self, prompt: list[int], max_gen: int) -> None:
        self.cache = new_cache(self.model, len(prompt), max_gen, self.extra_slots)
        self.forward_calls = 0

    def next_logits(self, tokens: list[int]) -> torch.Tensor:
        """One draft forward: the logits [V] of the token after `tokens`."""
        self.forward_calls += 1
        return forward_new_tokens(self.model, self.cache, tokens)[-1]

    def draw(self, logits: torch.Tensor, temperature: float, top_k=None, top_p=None,
             generator=None) -> tuple[int, torch.Tensor | None]:
        """One draft token from the draft's logits [V], and the q [V] it was drawn from (None when
        greedy: the argmax)."""
        if temperature == 0:
            return int(logits.argmax()), None
        q = logits_to_probs(logits, temperature, top_k, top_p)  # [V], as the target's p
        return int(sample(q, generator)), q

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        draft_tokens, draft_probs = [], []
        for _ in range(num_tokens):
            token, q = self.draw(self.next_logits(tokens + draft_tokens), temperature, top_k, top_p, generator)
            draft_tokens.append(token)
            if q is not None:
                draft_probs.append(q)
        return draft_tokens, torch.stack(draft_probs) if draft_probs else None

    def roll_back(self, length: int) -> None:
        self.cache.truncate(min(self.cache.length, length))


class NGramDrafter(Drafter):
    """Prompt lookup: no model at all. Find the most recent earlier place where the sequence's
    last n tokens occurred (n = max_ngram, then smaller, down to 1) and propose the tokens that
    followed them there. It pays when the output repeats the prompt (editing code, summarising,
    answering from a document) and costs nothing but a target step when no n-gram matches.
    (transformers' PromptLookupCandidateGenerator, vLLM's "ngram" method.)

    q is a point mass. The proposal is a deterministic function of the sequence: nothing is
    sampled, so each token x was "drawn" from q with q(x) = 1, and propose() returns None for q.
    The generator then accepts x with probability min(1, p(x)/q(x)) = p(x), and after a rejection
    draws from the residual norm(max(0, p - q)) = p with x set to 0, renormalised. The usual
    mistake is to pass q = p for such a token (accepting it always) or to resample from p itself
    after a rejection (x then comes out too often): both bias the output towards the copied text.

    max_ngram: the longest n-gram looked up (>= 1). num_tokens: propose at most this many per
    round (None: as many as the round allows).
    """

    def __init__(self, max_ngram: int = 3, num_tokens: int | None = None):
        if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or max_ngram < 1:
            raise ValueError(f"max_ngram must be an int >= 1 (the longest n-gram to look up), got {max_ngram!r}")
        if num_tokens is not None and (isinstance(num_tokens, bool) or not isinstance(num_tokens, int)
                                       or num_tokens < 1):
            raise ValueError(f"num_tokens must be an int >= 1 or None, got {num_tokens!r}")
        self.max_ngram = max_ngram
        self.num_tokens = num_tokens

    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        if self.num_tokens is not None:
            num_tokens = min(num_tokens, self.num_tokens)
        if num_tokens == 0:
            return [], None
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            suffix = tokens[-n:]
            # the most recent earlier occurrence: start at len - n - 1 and go back
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start:start + n] == suffix:
                    follow = start + n
                    return tokens[follow:follow + num_tokens], None
        return [], None


class LayerSkipDrafter(ModelDrafter):
    """Self-speculative decoding (Draft & Verify, Zhang et al. 2023; LayerSkip, Elhoushi et al.
    2024): the target drafts for itself with only its first n_layers blocks, then its own final
    LayerNorm and output head. No second model: the blocks are the target's own modules (shared
    weights, nothing copied); only a KV cache for those n_layers blocks is extra.

    A draft step costs about n_layers / n_layer of a target step, plus the output head's share
    (the head is the same size in both). How well it drafts depends on how close the target's
    early layers already are to its final answer; models trained with early-exit losses (LayerSkip)
    do much better than plain GPT-2.

    Its own cache holds the same keys/values as the target's first n_layers layers (same weights,
    same inputs, up to rounding): see docs/drafters.md for how they could be shared.
    """

    def __init__(self, target: GPT2, n_layers: int):
        super().__init__(target)
        n_layer = target.config.n_layer
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= n_layer - 1:
            raise ValueError(
                f"n_layers must be an int between 1 and n_layer - 1 = {n_layer - 1} (the target has "
                f"{n_layer} blocks; drafting with all of them is just the target), got {n_layers!r}"
            )
        self.n_layers = n_layers

    def start(self, prompt: list[int], max_gen: int) -> None:
        # The target's own cache factory for its first n_layers blocks: the same dtype rule as
        # the target's cache (float32 keys and values for a half-precision model on a CPU).
        self.cache = new_cache(self.model, len(prompt), max_gen, n_layer=self.n_layers)
        self.forward_calls = 0

    def next_logits(self, tokens: list[int]) -> torch.Tensor:
        """One draft forward through the first n_layers blocks: the logits [V] after `tokens`."""
        self.forward_calls += 1
        new = torch.tensor([tokens[self.cache.length:]], device=self.device)
        return self.model(new, self.cache, num_last_logits=1, exit_layer=self.n_layers)[0, -1]


def as_drafter(draft) -> Drafter:
    """The generators' `draft` argument: a Drafter, or a GPT2 (wrapped in a ModelDrafter)."""
    if isinstance(draft, Drafter):
        return draft
    if isinstance(draft, GPT2):
        return ModelDrafter(draft)
    raise TypeError(
        f"draft must be a GPT2 model or a Drafter (spec_decoding.drafters), got {type(draft).__name__}"
    )
