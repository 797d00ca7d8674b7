"""A pre-allocated key/value cache that can keep exactly the accepted path of a draft tree.

Used by the target runtime (all layers) and by drafters that run a few decoder
layers of their own (EAGLE-2's layer, MoA's self-attention, TLI's last N target
layers). Keys are stored after rotary embedding, as attention consumes them.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for `n_layers` layers, shape [batch, kv_heads, capacity, head_dim] each.

    `length` is the number of valid positions. Writing past the capacity grows
    the buffers (doubling), so callers never have to size it exactly.
    """

    def __init__(
        self,
        n_layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int = 256,
        batch: int = 1,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch, kv_heads, max(1, capacity), head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    @property
    def n_layers(self) -> int:
        return len(self.keys)

    def _grow(self, needed: int) -> None:
        new_cap = self.capacity
        while new_cap < needed:
            new_cap *= 2
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                grown = t.new_zeros(t.shape[0], t.shape[1], new_cap, t.shape[3])
                grown[:, :, : self.length] = t[:, :, : self.length]
                store[i] = grown

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, kv_heads, T, D]) after the valid positions of `layer`.

        Returns all keys and values of that layer including the new ones. The
        cache length advances once `commit(T)` is called after the last layer.
        """
        t = k.shape[2]
        end = self.length + t
        if end > self.capacity:
            self._grow(end)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def commit(self, t: int) -> None:
        self.length += t

    def crop(self, length: int) -> None:
        """Forget every position at or after `length`."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def keep(self, start: int, kept: torch.Tensor | list[int]) -> None:
        """Keep positions [0, start) plus `start + kept[i]` (ascending), drop the rest.

        This is how the accepted path of a verified draft tree stays in the
        cache while its rejected branches are discarded.
        """
        idx = torch.as_tensor(kept, dtype=torch.long, device=self.keys[0].device)
        if idx.numel() and (idx.min() < 0 or start + int(idx.max()) >= self.length):
            raise ValueError("kept positions fall outside the cache")
        src = start + idx
        n = idx.numel()
        for store in (self.keys, self.values):
            for t in store:
                t[:, :, start : start + n] = t[:, :, src]
        self.length = start + n

    def layer_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]
