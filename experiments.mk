# SpecLens experiments, included by the Makefile: the recipes behind the committed data sets, drafters and
# results. They use the Makefile's `setup`, `train` and $(PY); docs/TRAINING.md tells what each run changed and
# what it did.

.PHONY: data-v2 data-v3 data-v4 data-v5 data-s6 data-novel7 drafters

# ---- data sets ---------------------------------------------------------------------------------
# More data: one more generation run on new prompts (answers up to 128 tokens), pooled with the earlier data.
# $(call pooled_data,SEED,EARLIER,VERSION,RUN,EXTRA): prompt seed SEED -> data/distill-RUN (datagen EXTRA args),
# pooled with EARLIER (may be empty: the run alone) into assets/distill_VERSION (resumable; a run stopped early
# contributes its finished shards, as its recipe says). distill_v2, distill_s6 and distill_novel7 are not in the
# tree (nothing reads them; their recipes are in the git history, distill_v2's also inside distill_v3's recipe.json):
# these targets make them again.
define pooled_data
	$(PY) -m core.training.datagen --out data/distill-$(4) --seed $(1) --max-new-tokens 128 --batch-size 48 \
		--shard-size 96 --workers 2 --recipe none $(5)
	mkdir -p assets/distill_$(3)
	$(PY) -m core.training.datagen --combine $(2) data/distill-$(4) --out data/distill-$(3) \
		--recipe assets/distill_$(3)/recipe.json
	cp data/distill-$(3)/distill.npz assets/distill_$(3)/distill.npz
endef

# assets/distill_v2: prompt seed 1 pooled with assets/distill; assets/distill_v3: prompt seed 2 pooled with that;
# assets/distill_v4: copy-task prompts (core.training.passage_prompts, seed 3) around distill_v3's own training
# answers, pooled with distill_v3.
data-v2: setup
	$(call pooled_data,1,assets/distill/distill.npz,v2,s1)

data-v3: setup
	$(call pooled_data,2,assets/distill_v2/distill.npz,v3,s2)

data-v4: setup
	$(call pooled_data,3,assets/distill_v3/distill.npz,v4,ans3,--passages assets/distill_v3/distill.npz)

# assets/distill_v5: novel-passage copy tasks (distill_v4's training answers with 30% of their content words
# swapped, passage_prompts.perturb_passages, seed 5) pooled with distill_v4. Generated in float32: the machine
# that made it (a 2-core AVX2-only AMD EPYC) runs bfloat16 about 5x slower than float32.
data-v5: setup
	$(call pooled_data,5,assets/distill_v4/distill.npz,v5,novel5,--passages assets/distill_v4/distill.npz --perturb 0.3 --dtype float32)

# assets/distill_s6: fresh answers on their own (prompt seed 6, leaving out the prompts that distill_v5 already
# answered), because by phase 9 the drafters fit their training answers far better than held-out ones. Phase 10
# (tried, not published: its held-out accuracy fell; docs/TRAINING.md) trained on distill_v5 + this x2 + distill_novel7 x3.
data-s6: setup
	$(call pooled_data,6,,s6,gen-s6,--skip-answered assets/distill_v5/distill.npz)

# assets/distill_novel7: a stronger novel-passage lesson than distill_v5's: 60% of each passage's distinct content
# words swapped (seed 7; 1,600 of the copy-task prompts), so that memory of the training answers no longer helps
# and only reading the context does.
data-novel7: setup
	$(call pooled_data,7,,novel7,gen-novel7,--passages assets/distill_v4/distill.npz --perturb 0.6 --limit 1600)

# ---- the shipped drafters: the whole recipe --------------------------------------------------
# The shipped drafters: all six trained jointly (same batches, same optimiser steps) in nine phases, each
# published to assets/drafters/<name>, then benchmarked and their model cards given the measured tau. What each
# phase changed and why: docs/TRAINING.md. Rerun the same line to resume any phase after a stop. Every published
# card gives all phases (config.json: training.init_from nests the earlier phases' records). SHIPPED, the six
# drafters, is set in the Makefile beside bench-shipped.
SHIPPED_HYPER := --hyper draft_vocab_size=8192 --hyper feature_scale=24 --hyper eagle2.ce_weight=1.0 \
	--hyper moa.ce_weight=1.0 --hyper moa-tli1.ce_weight=1.0 --hyper moa-tli3.ce_weight=1.0
SHIPPED_ARGS := --warmup 40 --dtype float32 --autocast off --eval-every 250 $(SHIPPED_HYPER)
SHIPPED_CONTINUE := --dtype bfloat16 --autocast on --eval-every 200 --init-from assets/drafters $(SHIPPED_HYPER)
SHIPPED_ARGS2 := --warmup 30 $(SHIPPED_CONTINUE)
SHIPPED_ARGS3 := --warmup 20 $(SHIPPED_CONTINUE)
SHIPPED_ARGS4 := --warmup 150 $(SHIPPED_CONTINUE)
DEEPER_HEADS := --hyper medusa.num_layers_per_head=3 --hyper amphista.num_layers_per_head=3
drafters: setup
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill STEPS=1500 BATCH_TOKENS=1024 LR=2e-3 \
		RUN=runs/shipped-phase1 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS)"
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill STEPS=1200 BATCH_TOKENS=1024 LR=1e-3 SEED=1 \
		RUN=runs/shipped-phase2 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS2)"
	$(MAKE) data-v2
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v2 STEPS=1092 BATCH_TOKENS=1024 LR=1e-3 SEED=2 \
		RUN=runs/shipped-phase3 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS2)"
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v2 STEPS=1800 BATCH_TOKENS=1024 LR=6e-4 SEED=3 \
		RUN=runs/shipped-phase4 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS3)"
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v2 STEPS=570 BATCH_TOKENS=1024 LR=6e-4 SEED=4 \
		RUN=runs/shipped-phase5 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS3)"
	$(MAKE) data-v3
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v3 STEPS=636 BATCH_TOKENS=1024 LR=6e-4 SEED=5 \
		RUN=runs/shipped-phase6 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS3)"
	$(MAKE) data-v4
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v4 STEPS=1308 BATCH_TOKENS=1024 LR=6e-4 SEED=6 \
		RUN=runs/shipped-phase7 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS3)"
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v4 STEPS=2183 BATCH_TOKENS=1024 LR=2.5e-4,medusa=5e-4 \
		SEED=7 RUN=runs/shipped-phase8 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS4) $(DEEPER_HEADS)"
	$(MAKE) data-v5
	$(MAKE) train DRAFTERS=$(SHIPPED) DATA=assets/distill_v5 STEPS=1362 BATCH_TOKENS=1024 LR=2.5e-4,medusa=5e-4 \
		SEED=8 RUN=runs/shipped-phase9 PUBLISH=assets/drafters TRAIN_ARGS="$(SHIPPED_ARGS4) $(DEEPER_HEADS)"
	$(MAKE) bench-shipped
	$(MAKE) client-server-example

# ---- MoA: the reference-width LSA without the post-CA MLP, trained on its own (docs/TRAINING.md, phase 11) ----
# Two MoA N=0 variants continue the shipped moa jointly (one target pass per batch): `moa` with the full-width LSA
# rebuilt from scratch (SA/CA/head kept), `moa@narrow` with the shipped LSA kept; both drop the MLP after CA.
# Then `make moa-ablation` compares them with the shipped MoA drafters and EAGLE-2 (fixed trees, one interleaved
# run) and in the client-server split with a dropped link -> runs/moa-ablation/ablation.md (docs/RESULTS.md).
MOA_PHASE11_HYPER := --hyper staircase=random --hyper draft_vocab_size=8192 --hyper feature_scale=24 \
	--hyper ce_weight=1.0 --hyper ca_mlp=false --hyper moa.lsa_full_width=true --hyper moa.lsa_heads=6 \
	--hyper moa.lsa_mlp_ratio=2 --hyper moa@narrow.lsa_full_width=false
# Phase 12: the shipped moa continued unchanged in architecture, but trained where inference needs it most.
# Periods from 1 (every position one token past a verified state, as the children of a tree's root are) to
# 14 instead of 6-14, so that distance 1 gets about twice the share of the loss; SA fully causal from the
# first step (staircase_until=0: the shipped drafter is past its curriculum). Resumable: rerun the same line.
MOA_PHASE12_HYPER := --hyper draft_vocab_size=8192 --hyper feature_scale=24 --hyper ce_weight=1.0 \
	--hyper moa.period_min=1 --hyper moa.staircase_until=0
moa-phase12: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=62 BATCH_TOKENS=1024 LR=3e-4 \
		SEED=12 RUN=runs/moa-near TRAIN_ARGS="--warmup 30 --dtype bfloat16 --autocast on --eval-every 400 \
		--eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters $(MOA_PHASE12_HYPER)"

# Phase 13: the shipped moa continued with cross-attention limited to the 16 most recent verified positions
# (ca_window, an architecture change: phases 11 and 12 changed the LSA width and the objective and tied the
# shipped drafter; the channel probe showed CA reading an attention sink on early prompt positions).
MOA_PHASE13_HYPER := --hyper draft_vocab_size=8192 --hyper feature_scale=24 --hyper ce_weight=1.0 \
	--hyper moa.ca_window=16 --hyper moa.staircase_until=0
moa-phase13: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE13_MIN),55) \
		BATCH_TOKENS=1024 LR=3e-4 SEED=13 RUN=runs/moa-window TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 400 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		$(MOA_PHASE13_HYPER)"

# Phase 14: the phase-13 moa continued with the target's final feature added to each verified position's LSA
# vector (final_feature, an input change: phases 11-13 changed the LSA width, the objective and CA's reach, and
# each moved online tau by about 0.01; depth-1 top-8 accuracy stayed at 0.59 against EAGLE-2's 0.71).
MOA_PHASE14_HYPER := $(MOA_PHASE13_HYPER) --hyper moa.final_feature=true
moa-phase14: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE14_MIN),60) \
		BATCH_TOKENS=1024 LR=3e-4 SEED=14 RUN=runs/moa-final TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 400 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		$(MOA_PHASE14_HYPER)"

# Phase 14b: as phase 14, but the new projection trains at 20x the rate of the published weights (1e-4), so that
# the input is taken up before the rest of the network settles around it (phase 14's network ignored it).
moa-phase14b: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE14B_MIN),25) \
		BATCH_TOKENS=1024 LR=1e-4 SEED=15 RUN=runs/moa-final-lr TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 300 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		--new-param-lr-mult 20 $(MOA_PHASE14_HYPER)"

# Phase 15: the published moa (phase 14b) continued with its final-feature projection rebuilt at 32x gain. The stream
# that vector joins varies by about 47 per channel from token to token (SA starts as the target's first layer);
# phase 14b's feature varied by 1.5, so switching it off changed 4% of top-1 predictions.
MOA_PHASE15_HYPER := $(MOA_PHASE14_HYPER) --hyper moa.final_feature_gain=32
moa-phase15: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE15_MIN),45) \
		BATCH_TOKENS=1024 LR=1e-4 SEED=16 RUN=runs/moa-gain TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 300 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		--new-param-lr-mult 4 $(MOA_PHASE15_HYPER)"

# Phase 16: the published moa (phase 15) continued with cross-attention's output projection at 10x the rate of the
# rest: CA, MoA's channel from the target, adds about 5 per channel to a stream that varies by about 47.
moa-phase16: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE16_MIN),32) \
		BATCH_TOKENS=1024 LR=1e-4 SEED=17 RUN=runs/moa-ca-rate TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 300 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		--param-lr-mult ca.o_proj=10 $(MOA_PHASE15_HYPER)"

# Phase 17 (docs/TRAINING.md): the published moa continued with SA's outputs dropped for half the sequences
# (sa_drop 0.5, training only), so that the target's channels (CA, the final feature) must carry the prediction.
moa-phase17: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE17_MIN),38) \
		BATCH_TOKENS=1024 LR=1e-4 SEED=18 RUN=runs/moa-sa-drop TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 300 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		$(MOA_PHASE15_HYPER) --hyper moa.sa_drop=0.5"

# Phase 18 (docs/TRAINING.md): MoA N=0 from random weights, on its own. Phases 11-17 continued a drafter whose SA
# started as the target's first layer; its outputs vary by about 47 per channel and drown cross-attention (about 4)
# whatever the training did. Here SA, CA and the head start random (init_from_target=false, the reference code's
# start), with the reference's full-width LSA and staircase curriculum, plus the additions that paid before (the
# final feature, at gain 1: the gain of 32 matched a stream a random SA does not write; a 16-position CA window),
# and without the MLP after CA (a third of a drafting level's weights; the reference has none). Resumable: rerun
# the same line.
MOA_PHASE18_HYPER := --hyper draft_vocab_size=8192 --hyper feature_scale=24 --hyper ce_weight=1.0 \
	--hyper moa.init_from_target=false --hyper moa.lsa_full_width=true --hyper moa.lsa_heads=6 \
	--hyper moa.lsa_mlp_ratio=2 --hyper moa.staircase=random --hyper moa.staircase_until=0.5 \
	--hyper moa.ca_window=16 --hyper moa.ca_mlp=false --hyper moa.final_feature=true \
	--hyper moa.final_feature_gain=1
moa-phase18: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE18_MIN),100) \
		BATCH_TOKENS=1024 LR=1e-3 SEED=19 RUN=runs/moa-scratch TRAIN_ARGS="--warmup 100 --dtype bfloat16 \
		--autocast on --eval-every 500 --eval-tokens 4096 --final-eval-tokens 16384 $(MOA_PHASE18_HYPER)"

# Phase 18b: phase 18 continued (its held-out loss was still falling fast), the staircase over (progress counts
# phase 18's steps), the learning rate re-warmed to 6e-4.
runs/moa-scratch-init/moa:
	mkdir -p runs/moa-scratch-init && ln -sfn ../moa-scratch/final runs/moa-scratch-init/moa
moa-phase18b: setup runs/moa-scratch-init/moa
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE18B_MIN),95) \
		BATCH_TOKENS=1024 LR=6e-4 SEED=20 RUN=runs/moa-scratch2 TRAIN_ARGS="--warmup 50 --dtype bfloat16 \
		--autocast on --eval-every 500 --eval-tokens 4096 --final-eval-tokens 16384 \
		--init-from runs/moa-scratch-init $(MOA_PHASE18_HYPER)"

# Phase 19 (docs/TRAINING.md): the published moa (phase 15) continued with verification periods 6-24 instead of
# 6-14, so that an offline chain of ~20 tokens (the client writing while the link is down) is in distribution
# (issue 22, item 3). Its offline horizon follows (client.offline_horizon_for: the trained maximum).
moa-phase19: setup
	$(MAKE) train DRAFTER=moa DATA=assets/distill_v5/distill.npz STEPS=auto TIME=$(or $(PHASE19_MIN),45) \
		BATCH_TOKENS=1024 LR=1e-4 SEED=21 RUN=runs/moa-h24 TRAIN_ARGS="--warmup 30 --dtype bfloat16 \
		--autocast on --eval-every 300 --eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters \
		$(MOA_PHASE15_HYPER) --hyper moa.period_max=24"

.PHONY: moa-phase11 moa-phase12 moa-phase13 moa-phase14 moa-phase14b moa-phase15 moa-phase16 moa-phase17 moa-phase18 moa-phase18b \
	moa-phase19 moa-ablation
moa-phase11: setup
	$(MAKE) train DRAFTERS=moa,moa@narrow DATA=assets/distill_v5/distill.npz STEPS=1050 BATCH_TOKENS=1024 LR=5e-4 \
		SEED=11 RUN=runs/moa-wide TRAIN_ARGS="--warmup 50 --dtype bfloat16 --autocast on --eval-every 350 \
		--eval-tokens 4096 --final-eval-tokens 16384 --init-from assets/drafters $(MOA_PHASE11_HYPER)"

moa-ablation: setup
	mkdir -p runs/moa-candidates
	ln -sfn ../moa-wide/moa/final runs/moa-candidates/moa@wide
	ln -sfn ../moa-wide/moa@narrow/final runs/moa-candidates/moa@narrow
	$(PY) -m analysis.moa_ablation --candidates runs/moa-candidates --out runs/moa-ablation
