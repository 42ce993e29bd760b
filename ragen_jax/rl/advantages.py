"""Advantages and returns: GAE with a critic, bi-level GAE, GRPO / Dr.GRPO.

A batch is one sequence per episode: `rewards_BT`, `values_BT` and `mask_BT`
(the loss mask: assistant tokens only) share the token axis. The scalar score
sits on the last assistant token. GAE walks only the masked tokens, so
environment/user tokens between turns are skipped (verl's multi-turn GAE).
All outputs are 0 outside the mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.rl.groups import group_stats
from ragen_jax.scoring import masked_whiten


def _reverse_masked_gae(rewards_BT, values_BT, mask_BT, restart_BT, gamma, lam):
  """Token-level GAE over masked tokens, right to left.

  The next value/advantage come from the next masked token; at a `restart`
  token both are taken as 0 (the token is treated as terminal).
  """
  def step(carry, xs):
    next_value_B, next_adv_B = carry
    reward_B, value_B, mask_B, restart_B = xs
    next_value_B = jnp.where(restart_B, 0.0, next_value_B)
    next_adv_B = jnp.where(restart_B, 0.0, next_adv_B)
    delta_B = reward_B + gamma * next_value_B - value_B
    adv_B = delta_B + gamma * lam * next_adv_B
    carry = (jnp.where(mask_B, value_B, carry[0]), jnp.where(mask_B, adv_B, carry[1]))
    return carry, adv_B

  zeros_B = jnp.zeros(rewards_BT.shape[0], jnp.float32)
  xs = (rewards_BT.T, values_BT.T, mask_BT.T, restart_BT.T)
  _, adv_TB = jax.lax.scan(step, (zeros_B, zeros_B), xs, reverse=True)
  return jnp.where(mask_BT, adv_TB.T, 0.0)


def _finish(adv_BT, values_BT, mask_BT, whiten):
  returns_BT = jnp.where(mask_BT, adv_BT + values_BT, 0.0)
  return (masked_whiten(adv_BT, mask_BT) if whiten else adv_BT), returns_BT


def _check_same_shape(**arrays):
  shapes = {name: a.shape for name, a in arrays.items()}
  if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
    raise ValueError(f"expected equal [B, T] shapes, got {shapes}")


def gae(rewards_BT: jax.Array, values_BT: jax.Array, mask_BT: jax.Array, *, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True) -> tuple[jax.Array, jax.Array]:
  """GAE(γ, λ) over the masked tokens of each sequence.

  δ_t = r_t + γ·V(next masked token) − V_t (next value 0 after the last one),
  A_t = δ_t + γλ·A_next. Returns (advantages, returns = A + V), float32[B, T];
  advantages are whitened over the mask when `whiten` (PPO default).
  """
  _check_same_shape(rewards=rewards_BT, values=values_BT, mask=mask_BT)
  rewards_BT, values_BT = rewards_BT.astype(jnp.float32), values_BT.astype(jnp.float32)
  mask_BT = mask_BT.astype(bool)
  adv_BT = _reverse_masked_gae(rewards_BT, values_BT, mask_BT, jnp.zeros_like(mask_BT), gamma, lam)
  return _finish(adv_BT, values_BT, mask_BT, whiten)


def bi_level_gae(rewards_BT: jax.Array, values_BT: jax.Array, mask_BT: jax.Array, turn_end_BT: jax.Array,
                 *, gamma: float = 1.0, lam: float = 1.0, turn_gamma: float = 0.95,
                 turn_lam: float | None = None, whiten: bool = True) -> tuple[jax.Array, jax.Array]:
  """RAGEN's bi-level GAE: turn-level GAE over turn ends, then token-level GAE within turns.

  `turn_end_BT` marks the last assistant token of each turn, where that
  turn's reward sits in `rewards_BT`. With e_1 < … < e_K the turn ends:
    1. turn level (γ_turn, λ_turn, default λ_turn = λ as in RAGEN):
       δ_k = r(e_k) + γ_turn·V(e_{k+1}) − V(e_k)   (V(e_{K+1}) = 0),
       A_k = δ_k + γ_turn·λ_turn·A_{k+1};  turn return G_k = A_k + V(e_k).
    2. token level (γ, λ) inside each turn, walking masked tokens backwards:
       the turn end is terminal with reward G_k (so its advantage is A_k);
       earlier tokens of the turn use δ_t = r_t + γ·V(next masked) − V_t.
  RAGEN marks turn ends by nonzero rewards; here they are explicit, so a turn
  with zero reward is still its own turn. Returns (advantages, returns).
  """
  _check_same_shape(rewards=rewards_BT, values=values_BT, mask=mask_BT, turn_end=turn_end_BT)
  turn_lam = lam if turn_lam is None else turn_lam
  rewards_BT, values_BT = rewards_BT.astype(jnp.float32), values_BT.astype(jnp.float32)
  mask_BT = mask_BT.astype(bool)
  turn_end_BT = turn_end_BT.astype(bool) & mask_BT
  turn_adv_BT = _reverse_masked_gae(rewards_BT, values_BT, turn_end_BT, jnp.zeros_like(turn_end_BT),
                                    turn_gamma, turn_lam)
  token_rewards_BT = jnp.where(turn_end_BT, turn_adv_BT + values_BT, rewards_BT)
  adv_BT = _reverse_masked_gae(token_rewards_BT, values_BT, mask_BT, turn_end_BT, gamma, lam)
  return _finish(adv_BT, values_BT, mask_BT, whiten)


def grpo(scores_B: jax.Array, group_ids_B: jax.Array, num_groups: int, mask_BT: jax.Array, *,
         norm_by_std: bool = True, eps: float = 1e-6,
         valid_B: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Group-normalised episode score broadcast over the masked tokens.

  A = (R − mean_group) / (std_group + eps) with unbiased std (GRPO), or
  R − mean_group when `norm_by_std=False` (Dr.GRPO). A group with one
  episode keeps its raw score (verl's mean 0 / std 1 rule). Returns
  (advantages, returns), both the same float32[B, T].
  """
  if scores_B.shape != (mask_BT.shape[0],) or group_ids_B.shape != scores_B.shape:
    raise ValueError(f"scores {scores_B.shape} and group_ids {group_ids_B.shape} must be [B] "
                     f"with B = mask rows ({mask_BT.shape[0]})")
  stats = group_stats(scores_B, group_ids_B, num_groups, valid_B, ddof=1)
  several_B = stats.count[group_ids_B] > 1
  adv_B = scores_B - jnp.where(several_B, stats.mean[group_ids_B], 0.0)
  if norm_by_std:
    adv_B = adv_B / (jnp.where(several_B, stats.std[group_ids_B], 1.0) + eps)
  adv_BT = jnp.where(mask_BT, adv_B[:, None], 0.0)
  return adv_BT, adv_BT
