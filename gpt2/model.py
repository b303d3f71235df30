"""GPT-2, written out by hand: embeddings, pre-LayerNorm blocks, causal self-attention, MLP, and an
output head tied to the token embedding. Parameter names match the official checkpoints
(wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...), so loading is a rename-free copy.

This file is plain PyTorch: every linear layer is an nn.Linear, the head an F.linear on the token
embedding's weight. load_gpt2 returns this model as written. Speed is a separate, explicit step
(gpt2.speed.accelerate), which returns a model of its own classes (FastGPT2, FastLinear) that says
in its repr what runs where.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPT2Config
from .kv_cache import KVCache


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x, attn_mask, cache: KVCache | None, layer: int):
        """x [B, T, C] -> [B, T, C]. attn_mask [T, T_past + T] (True = may attend) or None."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, n_head, T, head_dim]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)  # now [B, n_head, T_past + T, head_dim], cache's dtype
        # With a float32 cache under a half-precision model (a CPU: see new_kv_cache), attention
        # runs in float32 and only its output goes back to the model's dtype.
        y = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=attn_mask).to(x.dtype)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, attn_mask, cache, layer):
        x = x + self.attn(self.ln_1(x), attn_mask, cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embedding
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)  # position embedding
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        # The output head is wte.weight itself (weight tying): logits = x @ wte.weight.T

    def forward(
        self, idx: torch.Tensor, cache: KVCache | None = None, num_last_logits: int | None = None, *,
        positions: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
        exit_layer: int | None = None, return_features: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """idx [B, T] token ids -> logits [B, T, vocab_size].

        With a cache, idx continues the sequence at position cache.length: its keys and values are
        written into the cache, which grows by T. num_last_logits=n computes the output head for
        the last n positions only (logits [B, n, vocab_size]): generation needs only those, and on
        a long prompt the head is a large share of the work.

        The keywords are for the algorithms beyond plain decoding; without them this is the plain
        causal forward.
        Token trees (spec_decoding/tree.py) score several continuations at once, so two new
        tokens can sit at the same position and must not see each other. For them:
        positions [T]: the position of each new token (default: start, start + 1, ...).
        attn_mask [T, start + T] bool: which keys, cached ones first, each new token may attend
        to (True = may; default causal).

        exit_layer=k runs only the first k blocks, then ln_f and the head ("early exit": the
        self-speculative drafter, spec_decoding.drafters.LayerSkipDrafter); the cache then needs
        only k layers.

        return_features=True returns (logits, features): features [B, T, n_embd] is the residual
        stream after the last block run, before ln_f, for every new position (num_last_logits
        does not cut it). Feature drafters (spec_decoding/medusa.py, eagle.py) read it; ln_f and
        the head applied to it give the logits. It is computed anyway: asking costs nothing.

        Only shapes and types are checked here; token ids are checked where they enter (the
        generators), since reading a tensor's values would wait for a GPU at every step.
        """
        start = cache.length if cache is not None else 0
        self._check_input(idx, start, cache, positions, attn_mask)
        T = idx.shape[1]
        slots = torch.arange(start, start + T, device=idx.device)  # where the new keys go
        if positions is None:
            positions = slots
        if attn_mask is None and T > 1:
            # Query i (at position start + i) may attend to keys 0 .. start + i. One token needs no mask.
            attn_mask = torch.arange(start + T, device=idx.device)[None, :] <= slots[:, None]
        x = self.wte(idx) + self.wpe(positions)
        # (a slice of the ModuleList builds a new ModuleList: only for an early exit)
        blocks = self.h if exit_layer is None else self.h[:exit_layer]
        for layer, block in enumerate(blocks):
            x = block(x, attn_mask, cache, layer)
        if cache is not None:
            cache.advance(T)
        features = x
        if num_last_logits is not None:
            x = x[:, -num_last_logits:]
        logits = self.head(self.ln_f(x))
        return (logits, features) if return_features else logits

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The output head: x [B, T, n_embd] -> logits [B, T, vocab_size] = x @ wte.weight.T, the
        token embedding's own weight (weight tying)."""
        return F.linear(x, self.wte.weight)

    def new_kv_cache(self, batch_size: int = 1, max_len: int | None = None, extra_slots: int = 0,
                     n_layer: int | None = None) -> KVCache:
        """An empty cache with room for max_len positions (default: n_positions), plus
        extra_slots: a token tree scores several tokens at the same position, each in a slot.
        n_layer: the first blocks it holds (default: all; a forward with exit_layer=n_layer needs
        only those)."""
        c = self.config
        max_len = c.n_positions if max_len is None else max_len
        if not 1 <= max_len <= c.n_positions:
            raise ValueError(f"max_len must be between 1 and n_positions={c.n_positions}, got {max_len}")
        if extra_slots < 0:
            raise ValueError(f"extra_slots must be >= 0, got {extra_slots}")
        w = self.wpe.weight  # (the model's device and dtype: wpe is a plain tensor in every format)
        # On a CPU, PyTorch's attention over a cache is 3-13x slower in bfloat16/float16 than in
        # float32 for one new token (docs/precision.md): there the keys and values
        # of a half-precision model are kept, and attended to, in float32.
        dtype = torch.float32 if w.device.type == "cpu" and w.dtype in (torch.bfloat16, torch.float16) else w.dtype
        return KVCache(n_layer or c.n_layer, batch_size, c.n_head, max_len + extra_slots, c.head_dim, w.device, dtype)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _check_input(self, idx, start, cache, positions=None, attn_mask=None):
        """Shapes and types only (nothing that reads a tensor's values), each with what to do."""
        if isinstance(idx, torch.Tensor) and idx.dim() == 2 and idx.shape[1] == 0:
            raise ValueError("idx has no tokens (T = 0): feed at least one token (a cache that "
                             "already holds every token has nothing new to score)")
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
            got = f"{tuple(idx.shape)} {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"idx must be a LongTensor of token ids with shape [B, T]; got {got}")
        B, T = idx.shape
        if T == 0:
            raise ValueError("idx has no tokens (T = 0): feed at least one token")
        n_pos = self.config.n_positions
        if positions is None and start + T > n_pos:
            raise ValueError(
                f"Positions {start}..{start + T - 1} do not fit the context window of "
                f"n_positions={n_pos}: the sequence can hold at most {n_pos} tokens in all. "
                f"Shorten the prompt or generate fewer tokens."
            )
        if positions is not None:
            if positions.shape != (T,) or positions.dtype != torch.long:
                raise ValueError(f"positions must be a LongTensor of shape [T] = [{T}]; got "
                                 f"{tuple(positions.shape)} {positions.dtype}")
        if attn_mask is not None and (attn_mask.shape != (T, start + T) or attn_mask.dtype != torch.bool):
            raise ValueError(f"attn_mask must be a bool tensor of shape [T, cached + T] = "
                             f"[{T}, {start + T}]; got {tuple(attn_mask.shape)} {attn_mask.dtype}")
        if cache is not None:
            if start + T > cache.max_len:
                raise ValueError(
                    f"The KV cache holds {start} positions and has room for {cache.max_len}; "
                    f"{T} more don't fit. Make a larger one with model.new_kv_cache(max_len=...) "
                    f"or roll it back with cache.truncate()."
                )
            if B != cache.batch_size:
                raise ValueError(f"idx has batch size {B} but the KV cache was made for {cache.batch_size}")
