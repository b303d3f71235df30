"""An explicit per-layer key/value cache, written by position.

Each layer gets two buffers of shape [B, n_head, max_len, head_dim], allocated once. A forward
pass of T new tokens writes their keys/values at positions [length, length + T) and then
`length` moves forward by T. Rolling back (what speculative decoding does after a rejected draft)
is just moving `length` back: nothing is copied or freed, the stale entries are overwritten later.
"""

import torch


class KVCache:
    def __init__(self, n_layer, batch_size, n_head, max_len, head_dim, device=None, dtype=None):
        shape = (batch_size, n_head, max_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.batch_size = batch_size
        self.max_len = max_len
        self.length = 0  # positions [0, length) hold valid keys/values

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write the new k, v [B, n_head, T, head_dim] of `layer` at positions [length, length+T).

        Returns the keys and values of all positions so far, [B, n_head, length+T, head_dim].
        `length` itself moves only in `advance()`, once every layer has been written.
        """
        start, end = self.length, self.length + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens

    def truncate(self, length: int) -> None:
        """Forget every position >= length. O(1): only the length moves."""
        if not 0 <= length <= self.length:
            raise ValueError(
                f"KVCache.truncate({length}): length must be between 0 and the current "
                f"length {self.length}"
            )
        self.length = length

    def keep(self, length: int, slots: list[int]) -> None:
        """Keep positions [0, length) and the entries in `slots` (increasing, each >= length,
        below the current length), moved down to [length, length + len(slots)); forget the rest.

        After a token tree was scored, `slots` are the nodes of the accepted path: this makes the
        cache hold exactly the accepted sequence again, as if it had been fed as a chain. It
        copies len(slots) entries per layer (a chain only needs truncate, which copies nothing).
        """
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.keep({length}, ...): length must be between 0 and the "
                             f"current length {self.length}")
        if any(b <= a for a, b in zip(slots, slots[1:])) or (slots and not length <= slots[0] <= slots[-1] < self.length):
            raise ValueError(f"KVCache.keep: slots must increase and lie in [{length}, {self.length}); "
                             f"got {slots}")
        moved = [(i, s) for i, s in enumerate(slots, start=length) if i != s]
        if moved:
            dst = torch.tensor([i for i, _ in moved], device=self.keys[0].device)
            src = torch.tensor([s for _, s in moved], device=self.keys[0].device)
            for cache in self.keys + self.values:
                # index_select copies first, so a source slot overwritten earlier is still read right
                cache.index_copy_(2, dst, cache.index_select(2, src))
        self.length = length + len(slots)

    def __repr__(self):
        k = self.keys[0]
        return (
            f"KVCache(layers={len(self.keys)}, length={self.length}, max_len={self.max_len}, "
            f"per-layer k/v shape={tuple(k.shape)}, dtype={k.dtype}, device={k.device})"
        )
