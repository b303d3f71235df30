"""An EAGLE-style feature drafter (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking
Feature Uncertainty"): one small transformer block drafts the target's next *feature*, and the
target's own ln_f and head turn each drafted feature into q.

Notation: f_i is the target's feature at position i (the residual stream after its last block,
before ln_f); the target's head reads f_i to choose token t_{i+1}. The drafter reads, at
position i, [embedding of t_{i+1} ; f_i] (the feature AND the token actually chosen from it: a
sampled token is not determined by the feature, Medusa's heads never learn which one came) and
predicts f_{i+1}:

    x_i   = W_in [wte(t_{i+1}) ; f_i]            a projection, 2 n_embd -> n_embd
    f'_i+1 = Block(x_0 .. x_i)                   one GPT-2 block, causal, with its own KV cache
    q     = softmax(ln_f(f'_i+1) @ wte.T / T)    the target's own ln_f and head (then top-k/p)

During a round it runs autoregressively on its own predictions: the first draft token t_n comes
from f'_{n-1} (the input at n - 2 uses the real f_{n-2} and t_{n-1}), the next step reads
[wte(t_n) ; f'_{n-1}], and so on. After the round the target's real features replace the
predicted ones (the generators hand them over, Drafter.observe_target_features), so the drafter's
cache keeps only positions fed with real features.

No position embedding: the target's features already carry their position (GPT-2 adds wpe at the
bottom of the residual stream), and the block's causal mask orders what it reads.

Reduced draft vocabulary (EAGLE-3): draft_vocab, a LongTensor of token ids (the token map), limits
the head to those rows of wte: a smaller output layer, so a cheaper draft step. q is zero outside
it, and speculative sampling stays exact (a target token outside it is just never drafted).

q is the distribution each draft token really was drawn from, after the same temperature, top-k
and top-p as the target, given the tokens before it (which the drafter read), so propose() returns
it and the output is exactly the target's distribution.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2 import GPT2, KVCache
from gpt2.model import Block
from ..sampling import logits_to_probs, sample
from .drafter import FeatureDrafter


class EagleNet(nn.Module):
    """The trainable part: W_in and one GPT-2 block of the target's width and heads. The token
    embedding, ln_f and head are the target's (not copied, not trained)."""

    def __init__(self, target: GPT2):
        super().__init__()
        c = target.config
        self.config = c
        self.w_in = nn.Linear(2 * c.n_embd, c.n_embd)
        self.block = Block(c)
        with torch.no_grad():
            for name, p in self.block.named_parameters():  # GPT-2's initialisation
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02 / (2 ** 0.5 if name.endswith("c_proj.weight") else 1))
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
            # Start as "the next feature is this feature": W_in passes f_i through unchanged.
            nn.init.zeros_(self.w_in.weight)
            nn.init.zeros_(self.w_in.bias)
            self.w_in.weight[:, c.n_embd:] = torch.eye(c.n_embd)
        self.to(device=target.wpe.weight.device, dtype=target.wpe.weight.dtype)

    def forward(self, token_embeddings: torch.Tensor, features: torch.Tensor,
                cache: KVCache | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """token_embeddings [B, T, C] (wte of t_{i+1}), features [B, T, C] (f_i) -> the predicted
        next features [B, T, C]. With a cache, these continue the positions it holds.
        attn_mask [T, T] (True = may attend; training only, without a cache): another mask than the
        causal one, e.g. offline.train_drafter's training-time test."""
        x = self.w_in(torch.cat([token_embeddings, features], dim=-1))
        T = x.shape[1]
        start = cache.length if cache is not None else 0
        if attn_mask is not None:
            if cache is not None:
                raise ValueError("attn_mask is for training, without a cache (a cache's mask is causal)")
            return self.block(x, attn_mask, None, 0)
        if T > 1:  # causal, over the cached positions and the new ones
            slots = torch.arange(start, start + T, device=x.device)
            attn_mask = torch.arange(start + T, device=x.device)[None, :] <= slots[:, None]
        x = self.block(x, attn_mask, cache, 0)
        if cache is not None:
            cache.advance(T)
        return x


class EagleDrafter(FeatureDrafter):
    """Drafts up to gamma tokens per round, one EagleNet step each, from the target's features.

    target: the GPT2 being decoded (its wte, ln_f and head are used; its features arrive through
    the generators). net: an EagleNet trained for it (offline/train_drafter.py) or a fresh one.
    draft_vocab: None (the whole vocabulary) or a 1-D LongTensor of token ids, the token map.
    """

    def __init__(self, target: GPT2, net: EagleNet, draft_vocab: torch.Tensor | None = None):
        super().__init__(target)
        if not isinstance(net, EagleNet):
            raise TypeError(f"net must be an EagleNet, got {type(net).__name__}")
        if net.w_in.out_features != target.config.n_embd:
            raise ValueError(f"this EAGLE drafter has width {net.w_in.out_features}, the target "
                             f"{target.config.n_embd}: it was trained for another target")
        self.net = net
        V = target.config.vocab_size
        if draft_vocab is not None:
            draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long, device=self.device)
            if draft_vocab.dim() != 1 or len(draft_vocab) == 0 or draft_vocab.min() < 0 or draft_vocab.max() >= V:
                raise ValueError(f"draft_vocab must be a non-empty 1-D list of token ids in [0, {V})")
            if len(draft_vocab.unique()) != len(draft_vocab):
                raise ValueError("draft_vocab lists a token twice: each token id once")
            # The reduced head: those rows of wte, copied once so each step multiplies only them.
            self.draft_head = target.wte(draft_vocab).detach().clone()
        self.draft_vocab = draft_vocab
        self.cache = None

    def start(self, prompt, max_gen):
        super().start(prompt, max_gen)
        c, w = self.target.config, self.target.wpe.weight
        max_len = min(c.n_positions, len(prompt) + max_gen)
        self.cache = KVCache(1, 1, c.n_head, max_len, c.head_dim, w.device, w.dtype)

    def step(self, next_tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """One EagleNet forward over positions cache.length .. + T - 1: the last predicted feature [C]."""
        self.forward_calls += 1
        embeddings = self.target.wte(torch.tensor([next_tokens], device=self.device))
        return self.net(embeddings, features[None], self.cache)[0, -1]

    def draft_logits(self, feature: torch.Tensor) -> torch.Tensor:
        """The target's ln_f and head on a drafted feature: logits [V] (-inf outside draft_vocab)."""
        x = self.target.ln_f(feature)
        if self.draft_vocab is None:
            return self.target.head(x).float()
        logits = torch.full((self.vocab_size,), float("-inf"), device=self.device)
        return logits.index_copy_(0, self.draft_vocab, F.linear(x, self.draft_head).float())

    @torch.inference_mode()
    def propose(self, tokens, num_tokens, temperature=0.0, top_k=None, top_p=None, generator=None):
        n = len(tokens)
        if num_tokens == 0 or self.last_feature(tokens) is None:
            return [], None  # the first round: the target has not read the prompt yet
        # Catch up on the positions with real features it has not read: i = cache.length .. n - 2,
        # each [wte(t_{i+1}) ; f_i]. The last one predicts f'_{n-1}, which drafts t_n.
        first = min(self.cache.length, n - 2)
        self.cache.truncate(first)
        feature = self.step(tokens[first + 1:n], self.features[first:n - 1])
        draft_tokens, draft_probs = [], []
        for i in range(num_tokens):
            logits = self.draft_logits(feature)
            if temperature == 0:
                draft_tokens.append(int(logits.argmax()))
            else:
                q = logits_to_probs(logits, temperature, top_k, top_p)  # [V], as the target's p
                draft_tokens.append(int(sample(q, generator)))
                draft_probs.append(q)
            if i + 1 < num_tokens:  # its own prediction and its own token: [wte(t_n+i) ; f'_n-1+i]
                feature = self.step(draft_tokens[-1:], feature[None])
        # Positions fed with predicted features are replaced by real ones after the round.
        self.cache.truncate(n - 1)
        return draft_tokens, torch.stack(draft_probs) if draft_probs else None

    def roll_back(self, length: int) -> None:
        super().roll_back(length)
        # Cache entry i read t_{i+1}: only entries i < length - 1 read tokens still in the sequence.
        self.cache.truncate(min(self.cache.length, max(length - 1, 0)))
