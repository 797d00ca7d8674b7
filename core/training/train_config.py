"""The settings of a training run (`TrainConfig`, filled by core.training.train's command line): which drafters, the
data, the schedule, evaluation, checkpoint and publishing choices, and which of them a resumed run must agree on.
core.training.trainer runs it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

AUTO_PLACEHOLDER_STEPS = 10**9  # the total before it is fitted (only warm-up happens by then)


@dataclass
class TrainConfig:
    drafters: list[str]
    out: str
    data: str = "data/distill/dataset"
    target: str = "smollm2"
    steps: int = 1000
    batch_tokens: int = 4096
    max_len: int = 512
    lr: float = 3e-4
    lr_overrides: dict[str, float] = field(default_factory=dict)  # drafter name -> lr
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    seed: int = 0
    hyper: dict[str, dict[str, Any]] = field(default_factory=dict)  # drafter name -> hyper-parameters
    dtype: str = "bfloat16"
    autocast: str = "auto"  # auto | on | off
    eval_every: int = 200
    eval_tokens: int = 8192
    final_eval_tokens: int = 32768
    log_every: int = 10
    ckpt_every_min: float = 4.0
    time_budget_min: float | None = None
    stop_at_step: int | None = None  # stop (saving) after this step, as if interrupted: for tests
    publish: str | None = None
    restart: bool = False
    progress_bar: bool = True
    init_from: str | None = None  # continue from published drafters: <folder>/<name> (or <folder> for one)
    # parts a continued run builds afresh (a drafter's `rebuilt` prefixes, e.g. MoA's final_feature projection)
    # train at lr x this: the published rest of the network is already fitted, the new part starts from zero
    new_param_lr_mult: float = 1.0
    # parameters whose name starts with a key train at lr x its value (the longest matching key wins): a part
    # whose output is small next to the stream it joins can move faster without moving the rest
    param_lr_mult: dict[str, float] = field(default_factory=dict)
    # a continued run (--init-from) runs curricula such as MoA's staircase over its own steps, as a fresh run would,
    # instead of counting the earlier runs' steps (then a long-trained drafter's curriculum is long over)
    curriculum_restart: bool = False
    fit_steps: bool = False  # --steps auto: fix `steps` after FIT_AFTER_STEPS timed steps to fill the time budget

    # Arguments that change the training result: a resumed run must agree on them.
    RESULT_FIELDS = ("drafters", "target", "steps", "batch_tokens", "max_len", "lr", "lr_overrides", "warmup",
                     "min_lr_ratio", "weight_decay", "betas", "clip", "seed", "hyper", "dtype", "autocast",
                     "init_from")

    def result_args(self) -> dict:
        d = dataclasses.asdict(self)
        out = {k: d[k] for k in self.RESULT_FIELDS}
        if self.curriculum_restart:  # recorded only when used, so that earlier runs still resume
            out["curriculum_restart"] = True
        if self.new_param_lr_mult != 1.0:  # recorded only when used, so that earlier runs still resume
            out["new_param_lr_mult"] = self.new_param_lr_mult
        if self.param_lr_mult:
            out["param_lr_mult"] = dict(self.param_lr_mult)
        return json.loads(json.dumps(out))

    def lr_for(self, name: str) -> float:
        return self.lr_overrides.get(name, self.lr)
