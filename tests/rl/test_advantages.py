"""Advantages vs hand-computed cases and float64 numpy loop references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.rl.advantages import bi_level_gae, gae, grpo


def reference_gae(rewards, values, mask, gamma, lam):
  """verl/RAGEN multi-turn GAE: a per-row loop over the masked positions only."""
  adv = np.zeros_like(rewards, np.float64)
  for b in range(rewards.shape[0]):
    positions = np.flatnonzero(mask[b])
    running = 0.0
    for i in reversed(range(len(positions))):
      t = positions[i]
      next_value = values[b, positions[i + 1]] if i + 1 < len(positions) else 0.0
      running = rewards[b, t] + gamma * next_value - values[b, t] + gamma * lam * running
      adv[b, t] = running
  return adv, (adv + values) * mask


def reference_bi_level(rewards, values, mask, turn_end, gamma, lam, turn_gamma, turn_lam):
  """RAGEN's `compute_bi_level_gae_advantage_return` loops, with explicit turn ends."""
  adv = np.zeros_like(rewards, np.float64)
  for b in range(rewards.shape[0]):
    ends = np.flatnonzero(turn_end[b] & mask[b])
    token_rewards = rewards[b].astype(np.float64).copy()
    running = 0.0
    for i in reversed(range(len(ends))):
      next_value = values[b, ends[i + 1]] if i + 1 < len(ends) else 0.0
      running = rewards[b, ends[i]] + turn_gamma * next_value - values[b, ends[i]] + turn_gamma * turn_lam * running
      token_rewards[ends[i]] = running + values[b, ends[i]]
    positions = np.flatnonzero(mask[b])
    running = 0.0
    for i in reversed(range(len(positions))):
      t = positions[i]
      if t in ends or i + 1 == len(positions):
        next_value, running = 0.0, 0.0
      else:
        next_value = values[b, positions[i + 1]]
      running = token_rewards[t] + gamma * next_value - values[b, t] + gamma * lam * running
      adv[b, t] = running
  return adv, (adv + values) * mask


def reference_whiten(x, mask):
  sel = x[mask.astype(bool)]
  return np.where(mask, (x - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8), 0.0)


def random_episodes(rng, batch=6, length=24):
  """Assistant spans separated by env tokens; the score sits on the last assistant token."""
  mask = np.zeros((batch, length), bool)
  turn_end = np.zeros((batch, length), bool)
  for b in range(batch):
    t = int(rng.integers(0, 3))
    while t < length - 1:
      span = int(rng.integers(1, 5))
      mask[b, t:t + span] = True
      turn_end[b, min(t + span, length) - 1] = True
      t += span + int(rng.integers(1, 4))
  rewards = np.where(turn_end, rng.normal(size=(batch, length)), 0.0)
  rewards += np.where(~mask, rng.normal(size=(batch, length)), 0.0)  # junk on env tokens must be ignored
  values = rng.normal(size=(batch, length))
  return rewards, values, mask, turn_end


def test_gae_hand_case():
  # Response tokens at t = 1, 2, 4 (t = 3 is an env token), score 1 on t = 4; γ = 0.9, λ = 0.8.
  rewards = np.array([[0.0, 0.0, 0.0, 5.0, 1.0]])
  values = np.array([[9.0, 0.5, 0.4, 9.0, 0.2]])
  mask = np.array([[0, 1, 1, 0, 1]], bool)
  # t=4: δ = 1 − 0.2 = 0.8, A = 0.8
  # t=2: δ = 0.9·0.2 − 0.4 = −0.22, A = −0.22 + 0.72·0.8 = 0.356
  # t=1: δ = 0.9·0.4 − 0.5 = −0.14, A = −0.14 + 0.72·0.356 = 0.11632
  adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma=0.9, lam=0.8, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), [[0.0, 0.11632, 0.356, 0.0, 0.8]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), [[0.0, 0.61632, 0.756, 0.0, 1.0]], atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.99, 0.0)])
def test_gae_matches_numpy_loop_with_random_masks(gamma, lam):
  rng = np.random.default_rng(0)
  rewards, values, mask, _ = random_episodes(rng)
  want_adv, want_ret = reference_gae(rewards, values, mask, gamma, lam)
  adv, ret = gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma=gamma, lam=lam, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-5, atol=1e-5)
  white, _ = jax.jit(lambda *a: gae(*a, gamma=gamma, lam=lam))(jnp.asarray(rewards), jnp.asarray(values),
                                                               jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(white), reference_whiten(want_adv, mask), rtol=1e-4, atol=1e-5)


def test_bi_level_gae_hand_case_from_ragen():
  # RAGEN's own example: turn rewards 1 at t = 4 and t = 9, V = 0.1 … 1.0, γ = λ = 1, γ_turn = 0.95.
  # Turn level: A(9) = 1 − 1.0 = 0; A(4) = 1 + 0.95·1.0 − 0.5 = 1.45 → turn returns 1.95 and 1.0.
  # Token level telescopes inside each turn: A_t = G_turn − V_t.
  rewards = np.zeros((1, 10))
  rewards[0, [4, 9]] = 1.0
  values = np.arange(1, 11, dtype=np.float64)[None] / 10
  mask = np.ones((1, 10), bool)
  turn_end = np.zeros((1, 10), bool)
  turn_end[0, [4, 9]] = True
  adv, ret = bi_level_gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), jnp.asarray(turn_end),
                          turn_gamma=0.95, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), [[1.85, 1.75, 1.65, 1.55, 1.45, 0.4, 0.3, 0.2, 0.1, 0.0]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret)[0, [0, 4, 5, 9]], [1.95, 1.95, 1.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("gamma,lam,turn_gamma,turn_lam", [(1.0, 1.0, 0.95, None), (0.9, 0.8, 0.7, 0.5)])
def test_bi_level_gae_matches_numpy_loop(gamma, lam, turn_gamma, turn_lam):
  rng = np.random.default_rng(1)
  rewards, values, mask, turn_end = random_episodes(rng)
  rewards = np.where(mask, rewards, 0.0)
  want_adv, want_ret = reference_bi_level(rewards, values, mask, turn_end, gamma, lam, turn_gamma,
                                          lam if turn_lam is None else turn_lam)
  adv, ret = bi_level_gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), jnp.asarray(turn_end),
                          gamma=gamma, lam=lam, turn_gamma=turn_gamma, turn_lam=turn_lam, whiten=False)
  np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-5, atol=1e-5)


def test_bi_level_with_one_turn_and_turn_gamma_one_equals_gae():
  rng = np.random.default_rng(2)
  rewards, values, mask, _ = random_episodes(rng)
  rewards = np.where(mask, rewards, 0.0)
  last = np.zeros_like(mask)
  last[np.arange(mask.shape[0]), mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)] = True
  args = [jnp.asarray(a) for a in (rewards, values, mask)]
  want, _ = gae(*args, gamma=0.9, lam=0.7)
  got, _ = bi_level_gae(*args, jnp.asarray(last), gamma=0.9, lam=0.7, turn_gamma=1.0)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_grpo_and_drgrpo_hand_case():
  scores = jnp.asarray([1.0, 0.0, 0.0, 1.0, 3.0, 5.0, 7.0])
  group_ids = jnp.asarray([0, 0, 0, 0, 1, 2, 2])
  mask = jnp.asarray(np.tri(7, 3, dtype=bool))  # rows with 1..3 response tokens
  adv, ret = grpo(scores, group_ids, 3, mask)
  s = np.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
  per_episode = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6), 3.0,
                 -1 / (np.sqrt(2) + 1e-6), 1 / (np.sqrt(2) + 1e-6)]
  np.testing.assert_allclose(np.asarray(adv), np.asarray(per_episode)[:, None] * np.asarray(mask), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(adv), np.asarray(ret))
  dr, _ = grpo(scores, group_ids, 3, mask, norm_by_std=False)
  np.testing.assert_allclose(np.asarray(dr)[:, 0], [0.5, -0.5, -0.5, 0.5, 3.0, -1.0, 1.0], rtol=1e-6)


def test_grpo_matches_numpy_on_shuffled_groups():
  rng = np.random.default_rng(4)
  scores_GS = rng.normal(size=(4, 8))
  perm = rng.permutation(32)
  scores, group_ids = scores_GS.reshape(-1)[perm], np.repeat(np.arange(4), 8)[perm]
  want = (scores_GS - scores_GS.mean(1, keepdims=True)) / (scores_GS.std(1, ddof=1, keepdims=True) + 1e-6)
  adv, _ = grpo(jnp.asarray(scores, jnp.float32), jnp.asarray(group_ids), 4, jnp.ones((32, 5), bool))
  np.testing.assert_allclose(np.asarray(adv)[:, 2], want.reshape(-1)[perm], rtol=1e-5, atol=1e-6)


def test_shape_errors_are_early_and_clear():
  with pytest.raises(ValueError, match="equal"):
    gae(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3), bool))
  with pytest.raises(ValueError, match="B = mask rows"):
    grpo(jnp.zeros(3), jnp.zeros(3, jnp.int32), 1, jnp.ones((4, 2), bool))
