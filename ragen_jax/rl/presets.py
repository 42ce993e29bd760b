"""Named algorithm presets of the StarPO family (SPEC §4).

| preset | advantages | aggregation |
|---|---|---|
| ppo | GAE with critic, whitened | token-mean |
| grpo | (R − mean)/(std + 1e-6) per group | seq-mean-token-mean |
| dapo | as grpo | token-mean |
| drgrpo | R − mean per group | seq-mean-token-sum |

All share clip-higher (0.2 / 0.28), dual clip 3.0, entropy coefficient 0.001
and no KL loss. DAPO here means its loss shape only (clip-higher +
token-mean); its dynamic sampling is what the SNR filter generalises.
"""

from __future__ import annotations

import dataclasses

from ragen_jax.config import check, check_one_of
from ragen_jax.rl.losses import KL_ESTIMATORS, PolicyLossConfig

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "drgrpo")
LOSS_AGG_SCOPES = ("mini_batch", "micro_batch")
PRESETS: dict[str, tuple[str, str]] = {  # name -> (advantage estimator, loss aggregation)
    "ppo": ("gae", "token-mean"),
    "grpo": ("grpo", "seq-mean-token-mean"),
    "dapo": ("grpo", "token-mean"),
    "drgrpo": ("drgrpo", "seq-mean-token-sum"),
}


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """The `algorithm` config section: a preset (advantage estimator and loss aggregation) with its loss,
  GAE and value-clip settings (SPEC §4).

  `loss_agg_scope`: what the aggregation runs over. `mini_batch` (default, the paper's formulas): the whole
  mini-batch, each token (token-mean) or sequence (sequence means) weighted once, however it is cut into
  micro-batches. `micro_batch` (the reference, verl): each micro-batch alone, and the mini-batch's loss is the
  mean of those over the micro-batches holding kept episodes; for comparing runs with the reference like for
  like (with its default micro-batch of one episode, its token-mean is a mean over sequences). See
  `update.micro_batch_weights`.
  """

  preset: str = "ppo"
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip: float = 3.0  # c > 1, for negative advantages; 0 disables
  entropy_coef: float = 0.001
  use_kl_loss: bool = False
  kl_coef: float = 0.001
  kl_estimator: str = "low_var_kl"
  gamma: float = 1.0
  lam: float = 1.0
  bi_level_gae: bool = False
  turn_gamma: float = 0.95
  value_clip: float = 0.5
  loss_agg_scope: str = "mini_batch"

  def __post_init__(self):
    check_one_of("algorithm.preset", self.preset, PRESETS)
    check_one_of("algorithm.loss_agg_scope", self.loss_agg_scope, LOSS_AGG_SCOPES)
    check_one_of("algorithm.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
    check("algorithm.dual_clip", self.dual_clip == 0 or self.dual_clip > 1.0, "must be > 1 (or 0: off)",
          self.dual_clip)
    check("algorithm.bi_level_gae", not self.bi_level_gae or self.advantage == "gae",
          f"needs the gae advantage estimator (preset ppo), not preset {self.preset!r}", self.bi_level_gae)
    check("algorithm.clip_low", 0.0 <= self.clip_low < 1.0, "must be in [0, 1)", self.clip_low)
    check("algorithm.clip_high", self.clip_high >= 0.0, "must be >= 0", self.clip_high)

  @property
  def advantage(self) -> str:
    return PRESETS[self.preset][0]

  @property
  def loss(self) -> PolicyLossConfig:
    return PolicyLossConfig(clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip or None,
                            entropy_coef=self.entropy_coef, use_kl_loss=self.use_kl_loss, kl_coef=self.kl_coef,
                            kl_estimator=self.kl_estimator, agg=PRESETS[self.preset][1])

  @property
  def use_critic(self) -> bool:
    return self.advantage == "gae"


def preset(name: str) -> AlgorithmConfig:
  """The named preset with default settings; change fields with `dataclasses.replace`."""
  return AlgorithmConfig(preset=name)
