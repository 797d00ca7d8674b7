"""Mixture of Attentions (MoA) drafter with Target Layer Inference (docs/ARCHITECTURE.md, "MoA").

Zimmer et al., "Mixture of Attentions for Speculative Decoding" (2024). Three parts on
top of the target's frozen embedding and LM head:

    LSA  per verified token: its keys+values at every target layer ([L, 2*kv_heads*head_dim],
         384 wide on SmolLM2) + a learned layer-index embedding -> one encoder layer with
         bidirectional attention across the L layers at that full width (the reference code's
         layout; lsa_full_width=False first narrows to `lsa_dim`, the layout of our earlier
         drafters) -> mean over layers -> linear to H. Runs once per cycle, in accept(), on
         the newly verified tokens only, so its width costs no per-node drafting time. Its
         attention (per token, layer x layer, averaged over heads) goes to the next tree's extras.
    SA   one causal Llama decoder layer over the target's token embeddings of prompt,
         accepted and drafted tokens, with its own KV cache. Never sees predicted states.
    CA   queries from the SA output, keys/values from the LSA vectors of verified tokens
         (RoPE on both sides, so a query knows how far it is from the last verified token),
         then a linear head -> the predicted state (ca_mlp: an MLP block before the head).

Indexing. The prediction at position j (SA query token x_j) estimates the target's state
at j, i.e. the distribution of x_{j+1}. When drafting from the root at position r, CA sees
the LSA vectors of positions <= r - 1: everything the target has verified (the root itself
is the target's own bonus token, not yet run through it). Deeper nodes (position r + d)
see exactly the same memory, so only the CA query changes. The distance j - (last verified
position) is 1 for the root's children and d for a node's children at depth d.

Target Layer Inference (TLI), N = config.tli:
    N = 0: the predicted state is the target's final hidden state (pre-norm) -> target.logits.
    N > 0: the predicted state is the residual entering layer L - N; the frozen target
           layers L-N .. L-1 run on it with their own KV cache: verified positions use the
           target's true keys/values (Verified.layer_kv, RoPE applied at their positions),
           the root and drafted nodes use keys/values computed from predicted states under
           the tree mask. Then the final norm and LM head.

Cache invariants after accept(): SA cache = the verified tokens (drafted entries are cropped),
CA memory = LSA of every verified token, TLI cache = true keys/values of every verified token.
accept() also drafts the next root: it runs in the same SA call as the newly verified tokens (one
layer call a cycle, not two), its keys/values wait one slot past the verified ones, uncounted, and
draft() counts them back in and starts from the log-probs accept() left.

Offline drafting (docs/ARCHITECTURE.md, "Client-server"): when the link to the target drops,
the drafter keeps going on its own. `extend_unverified(tokens)` accepts tokens
provisionally: the current root and all but the last of `tokens` enter the SA cache (and
the TLI cache, from predicted states) exactly as drafted tree nodes would, while CA memory
keeps only the verified tokens; the last of `tokens` becomes the new root, at position
(verified count + n_unverified). `draft(new root)` then drafts from there, seeing what a
drafted node that deep would see. When the server answers, `rollback_unverified()` (or
simply `accept()`, which crops to the verified state itself) and then
`accept(Verified(tokens=[old root] + accepted provisional tokens, bonus=correction, ...))`.
EAGLE-2 cannot do this: every step needs fresh target features.

The offline chain stops at `offline_horizon` tokens past the last verified one
(core.client_server.client; default period_max, the farthest distance training covers), or
where the drafter's probability for the whole provisional chain falls below
`offline_min_confidence` (client.offline_confidence_for).

With `draft_vocab_size` > 0 only the final projection is restricted to the drafting
vocabulary (core.drafters.draft_vocab); TLI layers are unchanged.

The reference code is huawei-noah/HEBO, branch mixture-of-attentions, moa_spec/models/train/moa_spec.py (MS) and
cross_attention.py (CX). What new drafters take from it (MoAConfig defaults; older checkpoints load with the
values they were built with, LEGACY): LSA at the full width of each layer's K+V (MS:69-73); a CA block with one
RMSNorm on both the query stream and the memory (CX:172-173, `memory_norm`) and a residual MLP after the attention
(CX:135, 190-193, `ca_mlp`); every weight, RMSNorm gains included, drawn from N(0, 0.02) (MS:77-91,
`reference_init`); in training, a verified row reads its own memory row (MS:162, 210, `own_row_reads`) and the
staircase, a per-sequence coin whose probability falls linearly to 0 at half of training (MS:137-140), restricts
SA to the current segment (MS:177).

Our choices where we differ (why: docs/ARCHITECTURE.md, "MoA"):
  * LSA reads pre-RoPE keys, so a token's layer sequence does not depend on its position; CA adds it.
  * At inference a prediction reads target activations strictly before its own position: the root is the
    target's bonus token, which the target has not run yet. Own-row reads are a training signal only.
  * Our output head: out_norm, a linear and feature_scale after CA (the reference feeds CA's output to the LM head).
  * Options kept for the drafters shipped before the reference layout: `lsa_full_width=False` (narrow LSA),
    `init_from_target` (SA from the target's first layer, CA from its last layer's attention), `staircase="window"`,
    `ca_window` (CA reads the W most recent verified rows), `final_feature` (the target's final feature at the
    last verified position joins the stream before CA, times `final_feature_gain`), `sa_drop` (training drops SA's
    output per sequence). A continued run that changes the LSA layout rebuilds only the LSA (`rebuilt`).
  * `memory_loss` (training only): a linear readout of each memory row must recover the target's final feature.

Training (`training_loss`), T-step bounded and on-policy: per sequence a period k is drawn from [period_min,
period_max] (the reference code's 6..14); positions divisible by k and every position with loss_mask 0 (prompt /
user turns: the target prefills them) are "verified". The prediction at j sees, through CA and TLI, target
activations only at positions <= v(j) = the last verified position strictly before j, as at inference (where
v = r - 1 for a root at r). SA starts with a "staircase" mask (only the current unverified segment v(j) < q <= j):
staircase="random" draws it per sequence with probability 1 - progress / staircase_until (0.5: the first half of
training, as the reference code does), staircase="window" widens one mask linearly to the full causal one by then.
`progress` is the fraction of the drafter's whole training: a run continuing a published drafter counts the
earlier runs' steps (core.training.train), so the curriculum runs once. In each of the N frozen TLI layers,
positions <= v(j) contribute the target's true keys and values and positions in (v(j), j] the predicted path's,
under the same mask as inference. The true keys/values are read from batch.layer_kv: they are exactly the
target's k/v projections of batch.hidden[L-N+i], so training needs no extra hidden layers for them.

What the target must hand over: `needs` (inference) = per-layer keys/values (+ hidden[L] with final_feature);
`train_needs` (training) = the same plus hidden[L] (final feature, target distribution) and,
for N > 0, hidden[L-N] (the regressed state). The trainer reads `train_needs` when present.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core.drafters import moa_static
from core.drafters.base import TargetNeeds, Verified
from core.drafters.draft_vocab import DraftVocab
from core.drafters.dynamic_tree import Expansion, build_dynamic_tree
from core.drafters.moa_attention import CrossAttention, FusedPredict, LayerSelfAttention
from core.drafters.moa_config import MoAConfig, check_config
from core.drafters.moa_training import MoATraining
from core.drafters.trained import (
    TrainedDrafter,
    apply_tree_options,
    check_draft_vocab_size,
    check_hyper,
    layer_config,
    resolve_auto_tree,
    rope_kv,
)
from core.kv_cache import KVCache
from core.layers import FusedLayer, append_layer_kv, decoder_layer, fused_copy, run_layer
from core.target import Target
from core.trees.draft_tree import DraftTree


class MoADrafter(MoATraining, TrainedDrafter):
    name = "moa"
    config_class = MoAConfig
    # continuing a published drafter (core.training --init-from): these may change freely...
    training_only = ("period_min", "period_max", "staircase", "staircase_until", "ce_weight", "sa_drop",
                     "own_row_reads", "reference_init", "init_from_target")
    # ...and changing one of these rebuilds the LSA encoder from scratch (SA, CA and head are kept)
    rebuilt = {"ca_window": (), "memory_norm": (), "final_feature": ("lsa.feat",), "final_feature_gain": ("lsa.feat",),
               "lsa_full_width": ("lsa.",), "lsa_dim": ("lsa.",), "lsa_heads": ("lsa.",), "lsa_mlp_ratio": ("lsa.",),
               "ca_mlp": ("mlp.", "mlp_norm."), "memory_loss": ("memory_readout.",)}

    def __init__(self, config: MoAConfig, target: Target) -> None:
        super().__init__(config, target)
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm

        check_config(config)
        check_draft_vocab_size(config.draft_vocab_size, target)
        self.vocab = DraftVocab(target, config.draft_vocab_size, config.context_vocab)
        self.record_draft_top = True  # extras["draft_top"] for the app (costs well under 1 ms a cycle)
        # extras["lsa_attention"] (the app's LSA tab): the explicit softmax it needs is slower than the fused
        # attention, so it is off unless asked for; demo.runtime turns it on for the app's drafters.
        self.record_lsa_attention = False
        lcfg = layer_config(target)
        h, eps = config.hidden_size, lcfg.rms_norm_eps
        kv_width = 2 * target.kv_heads * target.head_dim
        lsa_width = kv_width if config.lsa_full_width else config.lsa_dim
        lsa_heads = config.lsa_heads or (2 * target.kv_heads if config.lsa_full_width else 4)
        self.lsa = LayerSelfAttention(config.n_target_layers, kv_width, lsa_width, lsa_heads, h,
                                      config.lsa_mlp_ratio, config.final_feature, config.final_feature_gain)
        self.sa = LlamaDecoderLayer(lcfg, layer_idx=0)
        self.ca_norm = LlamaRMSNorm(h, eps)
        self.ca = CrossAttention(h, target.n_heads, target.kv_heads, target.head_dim)
        if config.ca_mlp:
            self.mlp_norm = LlamaRMSNorm(h, eps)
            self.mlp = LlamaMLP(lcfg)
        self.out_norm = LlamaRMSNorm(h, eps)
        self.head = nn.Linear(h, h, bias=False)
        if config.memory_loss > 0:  # training only (MoAConfig.memory_loss)
            self.memory_readout = nn.Linear(h, h, bias=False)
            nn.init.zeros_(self.memory_readout.weight)  # the loss starts at 1 (no read) and falls as LSA keeps more
        big_l = config.n_target_layers
        # Inference needs the per-layer keys/values (and the final feature with final_feature); training
        # also regresses hidden states.
        self.needs = TargetNeeds(hidden_layers=(big_l,) if config.final_feature else (), layer_kv=True)
        self.train_needs = TargetNeeds(hidden_layers=tuple(sorted({big_l - config.tli, big_l})), layer_kv=True)
        self.sa_cache: KVCache | None = None
        self._provisional: list[int] = []
        self._shortcut: torch.Tensor | None = None  # final_feature: the last verified one, projected [1, 1, H]
        self._root_lp: torch.Tensor | None = None  # the root's draft log-probs, run by accept() (see _absorb)
        self._ca_fused: FusedPredict | None = None  # inference only: CA, CA MLP and head, rebuilt by begin()
        self._sa_fused: FusedLayer | None = None  # inference only: SA's weights stacked, rebuilt by begin()
        self.tree_auto = True  # depth / total_tokens sized for this machine (trained.resolve_auto_tree)
        self.tree_choice: dict | None = None

    @classmethod
    def random(cls, target: Target, seed: int = 0, **hyper: Any) -> MoADrafter:
        check_hyper(cls.config_class, cls.name, hyper)
        if hyper.get("init_from_target") and "reference_init" not in hyper:
            hyper["reference_init"] = False  # asking for the target's layers is asking for that initialisation
        model = super().random(target, seed, **hyper)
        if model.config.init_from_target:
            model.copy_target_layers()
        elif model.config.reference_init:
            model.reference_initialise(seed)
        return model

    @torch.no_grad()
    def reference_initialise(self, seed: int = 0, std: float = 0.02) -> None:
        """Every linear weight, embedding-like parameter and norm gain ~ N(0, std), biases 0 (MoAConfig.reference_init).
        LSA's input LayerNorm keeps gain 1, bias 0."""
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        gen = torch.Generator().manual_seed(seed + 1)

        def normal_(t: torch.Tensor) -> None:
            t.copy_((torch.randn(t.shape, generator=gen) * std).to(t.dtype))

        for name, module in self.named_modules():
            if name == "lsa.feat":
                continue  # final_feature's projection starts at zero (module docstring)
            if name == "lsa.in_norm":
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Linear, nn.LayerNorm, LlamaRMSNorm)):
                normal_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        normal_(self.lsa.layer_pos)

    @torch.no_grad()
    def copy_target_layers(self) -> None:
        """SA <- the target's first decoder layer; CA's q/k/v/o and norm <- its last layer's attention."""
        first, last = self.target.layers[0], self.target.layers[-1]
        for mine, theirs in ((self.sa, first), (self.ca, last.self_attn), (self.ca_norm, last.input_layernorm)):
            state = {k: v.to(self._dtype) for k, v in theirs.state_dict().items()}
            mine.load_state_dict(state, strict=True)

    def set_options(self, **opts: Any) -> None:
        """Tree settings (depth, top_k, total_tokens); `tli` may be given but must match the checkpoint."""
        if "tli" in opts:
            tli = opts.pop("tli")
            if tli != self.config.tli:
                raise ValueError(f"this MoA drafter was trained with TLI N={self.config.tli}; it cannot run with "
                                 f"tli={tli} (load the checkpoint trained with that TLI N, or train one)")
        apply_tree_options(self, opts)

    # ----- building blocks ---------------------------------------------------------------------
    @property
    def _dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.target.rope(positions)
        return cos.to(self._dtype), sin.to(self._dtype)

    def memory(self, vec: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LSA vectors [B, S, H] -> CA's roped keys and values (through CA's input norm with memory_norm)."""
        return self.ca.memory(self.ca_norm(vec) if self.config.memory_norm else vec, cos, sin)

    def _predict(self, sa_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mem_k: torch.Tensor,
                 mem_v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """CA over the LSA memory, MLP, head: the predicted state (final feature, or entering layer L - N)."""
        h = sa_out + self.ca(self.ca_norm(sa_out), cos, sin, mem_k, mem_v, mask)
        if self.config.ca_mlp:
            h = h + self.mlp(self.mlp_norm(h))
        return self.to_target_units(self.head(self.out_norm(h)))

    def _predict_inference(self, sa_out: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mem_k: torch.Tensor,
                           mem_v: torch.Tensor) -> torch.Tensor:
        """`_predict` over the whole (verified) memory on begin()'s fused copies (FusedPredict.predict)."""
        return self._ca_fused.predict(sa_out, cos, sin, mem_k, mem_v)

    def _tli(self, state: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Run the target's last N layers on predicted states [1, m, H] over the TLI cache (the target's own
        fused layers; the target-dtype cos, sin that `_advance` computed for these same positions are reused)."""
        n, big_l = self.config.tli, self.config.n_target_layers
        if n == 0:
            return state
        tgt = self.target
        known = getattr(self, "_tli_rope", None)
        cos, sin = known[1] if known is not None and known[0] is positions else tgt.rope(positions)
        x = state.to(tgt.dtype)
        layers = tgt.fused_layers()
        for i in range(n):
            x, _ = run_layer(layers[big_l - n + i], x, cos, sin, mask, self.tli_cache, i, tgt.n_heads, tgt.kv_heads,
                             tgt.head_dim)
        self.tli_cache.commit(state.shape[1])
        return x

    def _sa(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
            rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        cos, sin = rope if rope is not None else self._rope(positions)
        x = self.target.embed_tokens(tokens)
        if x.dtype != self._dtype:
            x = x.to(self._dtype)
        tgt = self.target
        if self._sa_fused is not None:
            out, _ = run_layer(self._sa_fused, x, cos, sin, mask, self.sa_cache, 0, tgt.n_heads, tgt.kv_heads,
                               tgt.head_dim)
        else:
            out, _ = decoder_layer(self.sa, x, cos, sin, mask, self.sa_cache, 0, tgt.head_dim)
        self.sa_cache.commit(tokens.shape[1])
        return out

    def _sa_context(self, tokens: torch.Tensor, positions: torch.Tensor,
                    rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Put tokens into the SA cache as context only: their keys and values, not SA's output, which nothing
        reads for verified (or offline-accepted) tokens. The cache holds the same numbers `_sa` would leave."""
        if self._sa_fused is None:
            self._sa(tokens, positions, None, rope)
            return
        cos, sin = rope if rope is not None else self._rope(positions)
        x = self.target.embed_tokens(tokens)
        tgt = self.target
        append_layer_kv(self._sa_fused, x.to(self._dtype), cos, sin, self.sa_cache, 0, tgt.n_heads, tgt.kv_heads,
                        tgt.head_dim)
        self.sa_cache.commit(tokens.shape[1])

    def _ca_memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """CA's keys and values: every verified position, or the last `ca_window` of them."""
        k, v = self.ca_cache.layer_view(0)
        w = self.config.ca_window
        return (k[:, :, -w:], v[:, :, -w:]) if w else (k, v)

    def _advance(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None, last_only: bool = False) -> torch.Tensor:
        """Run tokens [1, m] at positions [1, m] under `mask` into the SA/TLI caches -> final features [1, m, H].

        RoPE is computed once for the call, or given (the target's dtype; SA, CA and TLI share it).
        last_only: all m tokens enter SA, only the last goes on through CA and TLI (-> [1, 1, H]); `accept()`
        runs the verified tokens and the next root this way, since nothing reads SA at a verified row."""
        tcos, tsin = rope if rope is not None else self.target.rope(positions)
        cos, sin = (tcos, tsin) if tcos.dtype == self._dtype else (tcos.to(self._dtype), tsin.to(self._dtype))
        sa_out = self._sa(tokens, positions, mask, (cos, sin))
        if self._shortcut is not None:
            sa_out = sa_out + self._shortcut
        if last_only:
            sa_out, cos, sin, tcos, tsin, positions = (t[:, -1:] for t in (sa_out, cos, sin, tcos, tsin, positions))
        mem_k, mem_v = self._ca_memory()
        state = self._predict_inference(sa_out, cos, sin, mem_k, mem_v)  # the whole memory is verified
        self._tli_rope = (positions, (tcos, tsin))
        try:
            return self._tli(state, positions, mask)
        finally:
            self._tli_rope = None

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Draft tokens [1, m] at positions [1, m] under `mask` -> log-probs [m, V'] over the drafting vocabulary."""
        return self._logprobs(self._advance(tokens, positions, mask))

    def _logprobs(self, final: torch.Tensor) -> torch.Tensor:
        """Final features [1, m, H] -> log-probs [m, V'] over the drafting vocabulary."""
        if final.dtype != self.target.dtype:
            final = final.to(self.target.dtype)
        return torch.log_softmax(self.vocab.logits(final)[0], dim=-1)

    # ----- the drafting cycle ------------------------------------------------------------------
    @torch.no_grad()
    def begin(self, target: Target, prefill: Verified) -> None:
        super().begin(target, prefill)
        cap = len(prefill.tokens) + 256
        kvh, hd, dev = target.kv_heads, target.head_dim, target.device
        resolve_auto_tree(self, target)
        self._sa_fused = fused_copy(self.sa)  # SA's weights may have changed (training) since the last conversation
        self._ca_fused = FusedPredict.cached(self)
        self.static = moa_static.attach(self, target, len(prefill.tokens))  # None: eager levels, caches below
        if self.static is None:
            self.sa_cache = KVCache(1, kvh, hd, cap, dtype=self._dtype, device=dev)
            self.ca_cache = KVCache(1, kvh, hd, cap, dtype=self._dtype, device=dev)
            self.tli_cache = KVCache(max(1, self.config.tli), kvh, hd, cap, dtype=target.dtype, device=dev)
        self._absorb(prefill)

    @torch.no_grad()
    def accept(self, step: Verified) -> None:
        super().accept(step)
        self._absorb(step)

    def _absorb(self, step: Verified) -> None:
        """Bring SA, CA memory and TLI caches up to date with newly verified tokens, and draft the next root.

        The root (step.bonus) is run in the same SA call as the verified tokens: one decoder-layer call a
        cycle instead of two. Its keys/values stay in the SA (and TLI) buffers one slot past the verified
        ones, written but not counted (the caches' `length` stays = verified tokens), and its log-probs wait
        in `_root_lp` for `draft(step.bonus)`, which counts the slot back in."""
        if step.layer_kv is None:
            raise ValueError("MoA needs the target's per-layer keys/values (needs.layer_kv)")
        start, dev = step.start_position, self.target.device
        n_new = len(step.tokens)
        positions = start + torch.arange(n_new + 1, device=dev)[None]  # the verified tokens, then the root
        tokens = torch.tensor(list(step.tokens) + [step.bonus], dtype=torch.long, device=dev)[None]
        tcos, tsin = self.target.rope(positions)  # once for SA, CA memory, TLI and the root's prediction
        cos, sin = (tcos, tsin) if tcos.dtype == self._dtype else (tcos.to(self._dtype), tsin.to(self._dtype))
        layer_kv = step.layer_kv.to(dev)
        final = step.hidden.get(self.config.n_target_layers)  # absent on a client-server client (LSA is the server's)
        final = None if final is None else final.to(dev)
        # LSA is per token and CA reads only the last ca_window verified positions: earlier rows (a prompt's) get
        # zero memory, never read; the app's LSA tab (record_lsa_attention) still gets every row
        w = self.config.ca_window
        skip = max(0, n_new - w) if w and not self.record_lsa_attention else 0
        vec, att = self.lsa(layer_kv[skip:], self.record_lsa_attention, None if final is None else final[skip:])
        if self.config.final_feature:  # [memory vector | projected final feature]: the last one feeds the stream
            h = self.config.hidden_size
            vec, self._shortcut = vec[:, :h], vec[-1:, h:][None]
        k, v = self._ca_fused.memory(vec[None], cos[:, skip:n_new], sin[:, skip:n_new])
        if skip:
            k, v = (torch.cat([t.new_zeros(*t.shape[:2], skip, t.shape[3]), t], dim=2) for t in (k, v))
        self.ca_cache.crop(start)
        self.ca_cache.append(0, k, v)
        self.ca_cache.commit(n_new)
        n, big_l = self.config.tli, self.config.n_target_layers
        if n:
            self.tli_cache.crop(start)
            for i in range(n):
                k, v = rope_kv(layer_kv[None, :, big_l - n + i], tcos[:, :n_new], tsin[:, :n_new],
                               self.target.kv_heads, self.target.head_dim)
                self.tli_cache.append(i, k, v)
            self.tli_cache.commit(n_new)
        self.sa_cache.crop(start)
        self._root_lp = self._logprobs(self._advance(tokens, positions, None, (tcos, tsin), last_only=True))[0]
        root_at = start + n_new
        self.sa_cache.crop(root_at)  # the root's slot stays written; draft() counts it back in
        if n:
            self.tli_cache.crop(root_at)
        self._lsa_attention = None if att is None else att.float().cpu()
        self._lsa_tokens = torch.tensor(step.tokens, dtype=torch.long)
        self._root_token = step.bonus
        self._verified_root = step.bonus
        self._provisional = []

    # ----- offline drafting (client-server) ----------------------------------------------------
    @property
    def n_unverified(self) -> int:
        """Tokens accepted provisionally since the last verified state (the current root among them if > 0)."""
        return len(self._provisional)

    @torch.no_grad()
    def extend_unverified(self, tokens: list[int]) -> None:
        """Accept `tokens` (the continuation of the current root) without the target.

        The current root and tokens[:-1] are run as a chain into the SA and TLI caches, as drafted
        nodes are; CA memory is untouched. tokens[-1] becomes the root for the next `draft()`.
        """
        if not tokens:
            return
        self._root_lp = None  # the root's pre-run slot is overwritten by the chain below (same token first)
        dev = self.target.device
        r = self.sa_cache.length  # the current root's position
        chain = torch.tensor([self._root_token] + list(tokens[:-1]), dtype=torch.long, device=dev)[None]
        positions = r + torch.arange(chain.shape[1], device=dev)[None]
        if self.config.tli:
            self._advance(chain, positions, None)  # TLI needs the predicted states
        else:
            self._sa_context(chain, positions)
        self._provisional += [int(t) for t in tokens]
        self._root_token = int(tokens[-1])

    @torch.no_grad()
    def rollback_unverified(self) -> None:
        """Drop every provisional token: back to the state after the last accept()."""
        verified = self.ca_cache.length  # CA memory only ever holds verified tokens
        self.sa_cache.crop(verified)
        if self.config.tli:
            self.tli_cache.crop(verified)
        self._root_token = self._verified_root
        self._provisional = []
        self._root_lp = None  # the root's pre-run slot may have been overwritten by the provisional chain

    @torch.no_grad()
    def draft(self, root: int) -> DraftTree:
        if root != self._root_token:
            raise RuntimeError(f"draft() got root {root} but the drafter's root (the last verified bonus token, or "
                               f"the last provisional token) is {self._root_token}")
        cfg = self.config
        r = self.sa_cache.length  # the root's position = number of verified (+ provisional) tokens
        dev = self.target.device
        if self._root_lp is not None:  # run by accept() with the verified tokens: count its cache slot in
            root_lp, self._root_lp = self._root_lp, None
            self.sa_cache.commit(1)
            if cfg.tli:
                self.tli_cache.commit(1)
        else:  # after offline drafting (extend_unverified / rollback_unverified) the root is run here
            root_lp = self._step(torch.tensor([[root]], device=dev), torch.tensor([[r]], device=dev), None)[0]

        static = moa_static.before_levels(self)

        def expand(batch: Expansion) -> torch.Tensor:
            if static is not None:  # the same level on fixed buffers (replayed as a CUDA graph on a GPU)
                out = static.level(batch.tokens, batch.parent_slots, batch.depths, batch.mask, batch.first_slot)
                return self._logprobs(out[None]).cpu()
            m = batch.tokens.numel()
            prefix = torch.ones(m, r + 1, dtype=torch.bool)  # verified tokens and the root
            mask = torch.cat([prefix, batch.mask], dim=1).to(dev)[None, None]
            positions = (r + batch.depths).to(dev)[None]
            return self._step(batch.tokens.to(dev)[None], positions, mask).cpu()

        ids = self.vocab.table()
        tree = build_dynamic_tree(root_lp.cpu(), expand, cfg.depth, cfg.top_k, cfg.total_tokens, ids,
                                  self.record_draft_top)
        self.sa_cache.crop(r)
        if cfg.tli:
            self.tli_cache.crop(r)
        if self._lsa_attention is not None:
            tree.extras.update({"lsa_attention": self._lsa_attention, "lsa_tokens": self._lsa_tokens})
        return tree
