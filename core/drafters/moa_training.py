"""MoA's training: the T-step bounded, on-policy teacher-forced pass and its loss (core/drafters/moa.py is the
drafter, its module docstring says what training reads and why). A mixin of MoADrafter, split from moa.py by concern:
moa.py drafts, this file trains, moa_attention.py holds the network's parts.
"""

from __future__ import annotations

import torch

from core.drafters.trained import TrainBatch, distill_terms, rope_kv, target_tokens_in_vocab, weighted_mean
from core.layers import decoder_layer

ACC_DISTANCES = 6  # training metrics acc@1..6, by distance from the last verified position


class MoATraining:
    """The training methods of MoADrafter (self is the drafter: its config, target, LSA, SA, CA and head)."""

    def verified_positions(self, batch: TrainBatch, period: torch.Tensor | None = None) -> torch.Tensor:
        """bool [B, T]: the positions training treats as verified: every k-th (k per sequence, drawn from
        [period_min, period_max] unless `period` [B] is given) and every position with loss_mask 0."""
        ids = batch.input_ids
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)[None].expand(b, t)
        if period is None:
            period = torch.randint(self.config.period_min, self.config.period_max + 1, (b,), device=ids.device)
        return (pos % period.to(ids.device)[:, None] == 0) | (batch.loss_mask == 0)

    def last_verified(self, batch: TrainBatch, period: torch.Tensor | None = None,
                      verified: torch.Tensor | None = None) -> torch.Tensor:
        """v(j) [B, T]: the last verified position strictly before j (-1 if none).

        verified: bool [B, T] overrides the periodic rule; period: [B] overrides the random draw.
        """
        if verified is None:
            verified = self.verified_positions(batch, period)
        b, t = verified.shape
        pos = torch.arange(t, device=verified.device)[None].expand(b, t)
        upto = torch.where(verified, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # last verified <= j
        return torch.cat([torch.full_like(upto[:, :1], -1), upto[:, :-1]], dim=1)

    @staticmethod
    def reads_with_own_row(verified: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """[B, T]: the last memory row each prediction reads when verified rows read their own
        (MoAConfig.own_row_reads): j itself at a verified j, v(j) elsewhere."""
        pos = torch.arange(last.shape[1], device=last.device)[None]
        return torch.where(verified, pos.expand_as(last), last)

    def ca_read_mask(self, last: torch.Tensor) -> torch.Tensor:
        """bool [B, T, T]: the positions CA may read for the prediction at each j, those <= v(j) = last[:, j]
        (the last `ca_window` of them with a window). Positions with no verified past (only position 0) read
        position 0: a dummy that keeps the softmax finite; they carry no loss."""
        pos = torch.arange(last.shape[1], device=last.device)
        cols, lv = pos[None, None, :], last[:, :, None]
        mask = (cols <= lv) | ((lv < 0) & (cols == 0))
        if self.config.ca_window:
            mask = mask & (cols > lv - self.config.ca_window)
        return mask

    def train_forward(self, batch: TrainBatch, last: torch.Tensor, progress: float = 1.0,
                      reads: torch.Tensor | None = None, keep: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass mirroring inference. Returns (predicted state, final feature), each [B, T, H].

        last: v(j); reads: the last row CA, TLI's true keys/values and the staircase start from (default v(j);
        reads_with_own_row() for the reference's training masks); keep: a dict that receives the LSA memory rows
        [B, T, H] under "memory" (MoAConfig.memory_loss reads them)."""
        tgt, cfg = self.target, self.config
        ids = batch.input_ids
        b, t = ids.shape
        big_l, n = cfg.n_target_layers, cfg.tli
        kv = batch.layer_kv
        pos = torch.arange(t, device=ids.device)[None].expand(b, t)
        cos, sin = self._rope(pos)
        reads = last if reads is None else reads
        rows, cols, lv = pos[:, :, None], pos[:, None, :], reads[:, :, None]
        causal = cols <= rows
        # LSA runs on each token on its own, so computing it for every position is exact; CA's mask
        # decides which positions a prediction may read.
        vec, _ = self.lsa(kv.reshape(b * t, big_l, -1),
                          final=batch.hidden[big_l].reshape(b * t, -1) if cfg.final_feature else None)
        vec = vec.view(b, t, -1)
        if keep is not None:
            keep["memory"] = vec[..., :cfg.hidden_size]
        shortcut = None
        if cfg.final_feature:  # the projected final feature at v(j) joins position j's stream (see inference)
            h = cfg.hidden_size
            vec, feats = vec[..., :h], vec[..., h:]
            shortcut = feats.gather(1, last.clamp(min=0)[..., None].expand(b, t, h))
        frac = 1.0 if cfg.staircase_until <= 0 else min(1.0, max(0.0, progress) / cfg.staircase_until)
        if cfg.staircase == "window":  # one mask whose reach into earlier segments grows with progress
            sa_mask = causal & (cols > lv - round(frac * t))
        else:  # per sequence: the staircase (current unverified segment only) with probability 1 - frac
            stair = torch.rand(b, device=ids.device) < 1.0 - frac
            sa_mask = causal & ((cols > lv) | (cols == rows) | ~stair[:, None, None])
        emb = tgt.embed_tokens(ids).to(self._dtype)
        sa_out, _ = decoder_layer(self.sa, emb, cos, sin, sa_mask[:, None], None, 0, tgt.head_dim)
        if self.training and cfg.sa_drop > 0:  # per sequence: the token's embedding only (MoAConfig.sa_drop)
            dropped = torch.rand(b, device=ids.device) < cfg.sa_drop
            sa_out = torch.where(dropped[:, None, None], emb, sa_out)
        if shortcut is not None:
            sa_out = sa_out + shortcut
        mem_k, mem_v = self.memory(vec, cos, sin)
        state = self._predict(sa_out, cos, sin, mem_k, mem_v, self.ca_read_mask(reads)[:, None])
        final = state
        if n:
            tcos, tsin = tgt.rope(pos)
            tli_mask = torch.cat([cols <= lv, causal & (cols > lv)], dim=2)[:, None]  # [true K/V | predicted]
            final = state.to(tgt.dtype)
            for i in range(n):
                k_true, v_true = rope_kv(kv[:, :, big_l - n + i], tcos, tsin, tgt.kv_heads, tgt.head_dim)
                final, _ = decoder_layer(tgt.layers[big_l - n + i], final, tcos, tsin, tli_mask, None, 0,
                                         tgt.head_dim, extra_kv=(k_true, v_true))
        return state, final

    def memory_read_loss(self, memory: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        """MoAConfig.memory_loss: 1 - R^2 of `memory_readout`'s linear read of the target's normed final feature
        from the memory row, over every real position of the batch. Both sides are centred and scaled per channel
        with the batch's own statistics (not learned), so the readout's weights are correlations and it can follow
        the LSA at once; the error is weighted by each channel's variance, as the probe's R^2 is."""
        keep = batch.attention_mask.bool()
        truth = self.target.final_norm(batch.hidden[self.config.n_target_layers].detach())[keep].float()
        truth = truth - truth.mean(0)
        scale = truth.std(0)
        x = memory[keep].float()
        x = (x - x.mean(0).detach()) / (x.std(0).detach() + 1e-6)
        read = self.memory_readout(x.to(self.memory_readout.weight.dtype)).float() * scale
        return ((read - truth) ** 2).sum() / (truth ** 2).sum().clamp(min=1e-6)

    def training_loss(self, batch: TrainBatch, progress: float) -> tuple[torch.Tensor, dict[str, float]]:
        """0.1 * CE(target, drafter) + SmoothL1 on the final feature (0.5/0.5 with the layer L-N state if N > 0).

        The prediction at j counts with weight loss_mask[j] * attention_mask[j] (the query token is
        part of the answer, as every root and drafted token is). Sequences are assumed right-padded.
        """
        cfg = self.config
        big_l, n = cfg.n_target_layers, cfg.tli
        verified = self.verified_positions(batch)
        last = self.last_verified(batch, verified=verified)
        # held-out evaluation (eval mode) always reads as inference does, so its figures compare across recipes
        own = cfg.own_row_reads and self.training
        reads = self.reads_with_own_row(verified, last) if own else last
        kept: dict = {}
        state, final = self.train_forward(batch, last, progress, reads, kept)
        t = batch.input_ids.shape[1]
        dist = torch.arange(t, device=last.device)[None] - reads  # 0 at a row that reads its own memory
        w = (batch.loss_mask * batch.attention_mask).float() * (last >= 0)
        sel = w > 0
        wr = w[sel]
        f_true = batch.hidden[big_l].detach()
        loss_final = weighted_mean(self.feature_loss_rows(final[sel], f_true[sel]), wr)
        metrics = {}
        if n:
            loss_state = weighted_mean(self.feature_loss_rows(state[sel], batch.hidden[big_l - n].detach()[sel]), wr)
            loss_feat = 0.5 * loss_final + 0.5 * loss_state
            metrics["loss_state"] = float(loss_state.detach())
        else:
            loss_feat = loss_final
        ce, d_top, t_top = distill_terms(self.vocab, final[sel], f_true[sel])
        # the prediction at j is of token j + 1; the last one lies past the data (padded in-vocabulary)
        ids = batch.input_ids
        next_ids = torch.cat([ids[:, 1:], self.vocab.to_token_ids(torch.zeros_like(ids[:, :1]))], dim=1)
        t_top = target_tokens_in_vocab(self.vocab, t_top, next_ids[sel])
        loss_ce = weighted_mean(ce, wr)
        loss = loss_feat + cfg.ce_weight * loss_ce
        if cfg.memory_loss > 0:
            loss_memory = self.memory_read_loss(kept["memory"], batch)
            loss = loss + cfg.memory_loss * loss_memory
            metrics["loss_memory"] = float(loss_memory.detach())
        agree = (d_top == t_top).float()
        metrics.update({"loss": float(loss.detach()), "loss_feat": float(loss_feat.detach()),
                        "loss_final": float(loss_final.detach()), "loss_ce": float(loss_ce.detach()),
                        "acc": float(weighted_mean(agree, wr))})
        d_sel = dist[sel]
        for d in range(0 if own else 1, ACC_DISTANCES + 1):
            at = d_sel == d
            if bool(at.any()):
                metrics[f"acc@{d}"] = float(weighted_mean(agree[at], wr[at]))
        return loss, metrics
