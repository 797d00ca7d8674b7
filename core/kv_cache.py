"""A pre-allocated key/value cache that can keep exactly the accepted path of a draft tree.

Used by the target runtime (all layers) and by drafters that run a few decoder
layers of their own (EAGLE-2's layer, MoA's self-attention, TLI's last N target
layers). Keys are stored after rotary embedding, as attention consumes them.

Layout (static): one buffer `[n_layers, 2, batch, kv_heads, capacity, head_dim]` holds every layer's keys
(index 0) and values (index 1); `keys[i]` / `values[i]` are views into it. Keeping the accepted path of a
tree is then one gather-and-copy over all layers at once (not one per layer and tensor), and a chain that
was accepted from its start needs no copy at all.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for `n_layers` layers, shape [batch, kv_heads, capacity, head_dim] each.

    `length` is the number of valid positions. Writing past the capacity grows
    the buffer (doubling), so callers never have to size it exactly.
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
        self.buffer = torch.zeros((n_layers, 2, batch, kv_heads, max(1, capacity), head_dim), dtype=dtype,
                                  device=device)
        self._views()
        self.length = 0

    def _views(self) -> None:
        self.keys = list(self.buffer[:, 0].unbind(0))
        self.values = list(self.buffer[:, 1].unbind(0))

    @property
    def capacity(self) -> int:
        return self.buffer.shape[4]

    @property
    def n_layers(self) -> int:
        return self.buffer.shape[0]

    def _grow(self, needed: int) -> None:
        new_cap = self.capacity
        while new_cap < needed:
            new_cap *= 2
        shape = list(self.buffer.shape)
        shape[4] = new_cap
        grown = self.buffer.new_zeros(shape)
        grown[:, :, :, :, : self.length] = self.buffer[:, :, :, :, : self.length]
        self.buffer = grown
        self._views()

    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions in all (one growth up front instead of one inside a pass)."""
        if needed > self.capacity:
            self._grow(needed)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([B, kv_heads, T, D]) after the valid positions of `layer`.

        Returns all keys and values of that layer including the new ones. The
        cache length advances once `commit(T)` is called after the last layer.
        """
        t = k.shape[2]
        end = self.length + t
        if end > self.capacity:
            self._grow(end)
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, self.length: end] = k
        values[:, :, self.length: end] = v
        return keys[:, :, :end], values[:, :, :end]

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
        idx = torch.as_tensor(kept, dtype=torch.long, device=self.buffer.device)
        n = idx.numel()
        if n:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or start + hi >= self.length:
                raise ValueError("kept positions fall outside the cache")
            if not (lo == 0 and hi == n - 1):  # [0, 1, .., n-1] (ascending, distinct) is already in place
                src = start + idx
                self.buffer[:, :, :, :, start: start + n] = self.buffer[:, :, :, :, src]
        self.length = start + n

    def layer_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]
