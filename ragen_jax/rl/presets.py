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

from ragen_jax.rl.losses import PolicyLossConfig

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "drgrpo")


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """Advantage estimator plus actor-loss settings of one algorithm."""
  advantage: str
  loss: PolicyLossConfig
  gamma: float = 1.0
  lam: float = 1.0
  bi_level_gae: bool = False
  turn_gamma: float = 0.95

  def __post_init__(self):
    if self.advantage not in ADVANTAGE_ESTIMATORS:
      raise ValueError(f"advantage must be one of {ADVANTAGE_ESTIMATORS}, got {self.advantage!r}")
    if self.bi_level_gae and self.advantage != "gae":
      raise ValueError("bi_level_gae needs the gae advantage estimator")

  @property
  def use_critic(self) -> bool:
    return self.advantage == "gae"


PRESETS: dict[str, AlgorithmConfig] = {
    "ppo": AlgorithmConfig("gae", PolicyLossConfig(agg="token-mean")),
    "grpo": AlgorithmConfig("grpo", PolicyLossConfig(agg="seq-mean-token-mean")),
    "dapo": AlgorithmConfig("grpo", PolicyLossConfig(agg="token-mean")),
    "drgrpo": AlgorithmConfig("drgrpo", PolicyLossConfig(agg="seq-mean-token-sum")),
}


def preset(name: str) -> AlgorithmConfig:
  """The named preset; change fields with `dataclasses.replace`."""
  if name not in PRESETS:
    raise ValueError(f"unknown algorithm preset {name!r}; choose one of {sorted(PRESETS)}")
  return PRESETS[name]
