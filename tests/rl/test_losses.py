"""Actor/critic losses on hand-computed cases; presets."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.rl import presets
from ragen_jax.rl.losses import PolicyLossConfig, actor_loss, aggregate, kl_penalty, policy_loss, value_loss

# One row, six tokens, one per branch (clip_low 0.2, clip_high 0.28, dual clip 3):
#   A     ratio  per-token loss                         branch          d loss / d logp
#   +1    1.5    −1·1.28 = −1.28                        clip-high       0
#   +1    0.5    max(−0.5, −0.8) = −0.5                 unclipped       −A·r = −0.5
#   −1    0.5    max(0.5, 0.8) = 0.8                    clip-low        0
#   −1    1.2    max(1.2, 1.2) = 1.2                    inside          −A·r = 1.2
#   −1    4.0    min(max(4, 1.28), 3) = 3               dual clip       0
#   −1    2.0    min(max(2, 1.28), 3) = 2               unclipped       2.0
ADV = np.array([[1.0, 1.0, -1.0, -1.0, -1.0, -1.0]])
RATIO = np.array([[1.5, 0.5, 0.5, 1.2, 4.0, 2.0]])
OLD_LOGP = np.array([[-1.0, -2.0, -0.5, -3.0, -1.5, -2.5]])
LOGP = OLD_LOGP + np.log(RATIO)
PER_TOKEN = np.array([-1.28, -0.5, 0.8, 1.2, 3.0, 2.0])
GRAD_PER_TOKEN = np.array([0.0, -0.5, 0.0, 1.2, 0.0, 2.0])
MASK = np.ones((1, 6), bool)


def test_policy_loss_branches_and_metrics():
  loss, m = policy_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK))
  np.testing.assert_allclose(float(loss), PER_TOKEN.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["pg_clipfrac"]), 2 / 6, rtol=1e-6)
  np.testing.assert_allclose(float(m["pg_clipfrac_low"]), 1 / 6, rtol=1e-6)
  np.testing.assert_allclose(float(m["pg_clipfrac_high"]), 1 / 6, rtol=1e-6)
  np.testing.assert_allclose(float(m["pg_clipfrac_dual"]), 1 / 6, rtol=1e-6)
  np.testing.assert_allclose(float(m["ppo_kl"]), -np.log(RATIO).mean(), rtol=1e-5)
  no_dual, _ = policy_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK),
                           dual_clip=None)
  np.testing.assert_allclose(float(no_dual), (PER_TOKEN.sum() - 3.0 + 4.0) / 6, rtol=1e-5)


def test_gradient_is_zero_exactly_where_clipped():
  grad = jax.grad(lambda lp: policy_loss(lp, jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK))[0])(
      jnp.asarray(LOGP))
  np.testing.assert_allclose(np.asarray(grad)[0], GRAD_PER_TOKEN / 6, rtol=1e-5, atol=1e-7)


def test_wider_clip_high_unclips_the_first_token():
  loss, m = policy_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK),
                        clip_high=0.6)
  # ratio 1.5 now sits inside [0.8, 1.6]: the first token is unclipped (−1.5); the others are unchanged.
  np.testing.assert_allclose(float(loss), (PER_TOKEN.sum() + 1.28 - 1.5) / 6, rtol=1e-5)
  assert float(m["pg_clipfrac_high"]) == 0.0


LOSS_BT = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
LOSS_MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)  # last row: a filtered-out episode


@pytest.mark.parametrize("mode,want", [("token-mean", 7 / 3), ("seq-mean-token-mean", (1.5 + 4.0) / 2),
                                       ("seq-mean-token-sum", (3.0 + 4.0) / 2)])
def test_aggregation_modes_skip_empty_sequences(mode, want):
  np.testing.assert_allclose(float(aggregate(jnp.asarray(LOSS_BT), jnp.asarray(LOSS_MASK), mode)), want, rtol=1e-6)
  assert float(aggregate(jnp.asarray(LOSS_BT), jnp.zeros((3, 3), bool), mode)) == 0.0


@pytest.mark.parametrize("estimator,fn", [
    ("kl", lambda d: d),
    ("mse", lambda d: 0.5 * d * d),
    ("low_var_kl", lambda d: min(max(math.exp(-min(max(d, -20), 20)) + d - 1, -10), 10)),
])
def test_kl_estimators(estimator, fn):
  # d = logp − ref; k3 = exp(ref − logp) − (ref − logp) − 1, clipped to ±10 (d = −30 saturates it).
  deltas = np.array([0.5, -0.3, 0.0, 2.0, -30.0])
  ref = np.full(5, -1.0)
  got = np.asarray(kl_penalty(jnp.asarray(ref + deltas), jnp.asarray(ref), estimator))
  np.testing.assert_allclose(got, [fn(d) for d in deltas], rtol=1e-5, atol=1e-6)
  if estimator == "low_var_kl":
    np.testing.assert_allclose(got[:3], [math.exp(-0.5) + 0.5 - 1, math.exp(0.3) - 0.3 - 1, 0.0], atol=1e-6)
    assert got[4] == 10.0


def test_actor_loss_combines_terms():
  rng = np.random.default_rng(0)
  entropy = jnp.asarray(rng.random((1, 6)))
  ref = jnp.asarray(LOGP - 0.1)
  cfg = PolicyLossConfig(use_kl_loss=True, kl_coef=0.5, kl_estimator="kl", agg="seq-mean-token-mean")
  loss, aux = actor_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK), entropy,
                         ref, cfg)
  np.testing.assert_allclose(float(aux["kl_loss"]), 0.1, rtol=1e-5)
  np.testing.assert_allclose(float(aux["entropy"]), float(entropy.mean()), rtol=1e-6)
  np.testing.assert_allclose(float(loss), PER_TOKEN.mean() - 0.001 * float(entropy.mean()) + 0.05, rtol=1e-5)
  off, aux_off = actor_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK), entropy)
  np.testing.assert_allclose(float(off), PER_TOKEN.mean() - 0.001 * float(entropy.mean()), rtol=1e-5)
  assert float(aux_off["kl_loss"]) == 0.0
  with pytest.raises(ValueError, match="ref_logp"):
    actor_loss(jnp.asarray(LOGP), jnp.asarray(OLD_LOGP), jnp.asarray(ADV), jnp.asarray(MASK), entropy, None, cfg)


def test_value_loss_clipping():
  # token 1: V 1.0 (old 0.5, clipped 1.0), G 2 → both errors 1
  # token 2: V 2.0 (old 0.5, clipped 1.0), G 0 → max(4, 1) = 4 (unclipped larger)
  # token 3: V 0.0 (old 1.0, clipped 0.5), G 0 → max(0, 0.25) = 0.25 (clipped larger)
  values, old, returns = (jnp.asarray([[1.0, 2.0, 0.0]]), jnp.asarray([[0.5, 0.5, 1.0]]),
                          jnp.asarray([[2.0, 0.0, 0.0]]))
  loss, m = value_loss(values, old, returns, jnp.ones((1, 3), bool), clip=0.5)
  np.testing.assert_allclose(float(loss), 0.5 * (1 + 4 + 0.25) / 3, rtol=1e-6)
  np.testing.assert_allclose(float(m["vf_clipfrac"]), 1 / 3, rtol=1e-6)
  grad = jax.grad(lambda v: value_loss(v, old, returns, jnp.ones((1, 3), bool), clip=0.5)[0])(values)
  assert float(grad[0, 2]) == 0.0  # the clipped branch won: no gradient


def test_value_inside_the_clip_range_is_not_clipped():
  # V 0.1, old −0.2, clip 0.5: V lies inside [−0.7, 0.3], so V_clip = V (old + (V − old) is 0.10000001 in float32)
  values, old, returns = jnp.asarray([[0.1]]), jnp.asarray([[-0.2]]), jnp.asarray([[0.0]])
  loss, m = value_loss(values, old, returns, jnp.ones((1, 1), bool), clip=0.5)
  assert float(m["vf_clipfrac"]) == 0.0
  np.testing.assert_allclose(float(loss), 0.5 * 0.01, rtol=1e-6)


def test_presets_follow_spec():
  ppo, grpo, dapo, drgrpo = (presets.preset(n) for n in ("ppo", "grpo", "dapo", "drgrpo"))
  assert (ppo.advantage, ppo.loss.agg, ppo.use_critic) == ("gae", "token-mean", True)
  assert (grpo.advantage, grpo.loss.agg, grpo.use_critic) == ("grpo", "seq-mean-token-mean", False)
  assert (dapo.advantage, dapo.loss.agg) == ("grpo", "token-mean")
  assert (drgrpo.advantage, drgrpo.loss.agg) == ("drgrpo", "seq-mean-token-sum")
  for p in (ppo, grpo, dapo, drgrpo):
    assert (p.loss.clip_low, p.loss.clip_high, p.loss.dual_clip, p.loss.entropy_coef, p.loss.use_kl_loss) == \
        (0.2, 0.28, 3.0, 0.001, False)
    assert (p.gamma, p.lam) == (1.0, 1.0)
  assert dataclasses.replace(ppo, bi_level_gae=True).turn_gamma == 0.95


@pytest.mark.parametrize("make", [lambda: presets.preset("ppo2"), lambda: PolicyLossConfig(agg="mean"),
                                  lambda: PolicyLossConfig(kl_estimator="k9"), lambda: PolicyLossConfig(dual_clip=1.0),
                                  lambda: dataclasses.replace(presets.preset("grpo"), bi_level_gae=True)])
def test_bad_settings_raise(make):
  with pytest.raises(ValueError):
    make()
