"""Bandit and LightsOut against independent numpy references."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from envs import bandit, text


@functools.partial(jax.jit, static_argnums=0)
def batch_reset(env, params, keys):
  return jax.vmap(env.reset, in_axes=(0, None))(keys, params)[1]


@functools.partial(jax.jit, static_argnums=0)
def batch_step(env, params, keys, states, actions):
  return jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, actions, params)


def item(tree, *index):
  return jax.tree.map(lambda x: x[index], tree)


# ---------------------------------------------------------------- bandit


@pytest.mark.parametrize("pool", ["train", "test"])
def test_bandit_arms_come_from_their_pool_in_both_orders(pool):
  env, params = envs.make("bandit", name_pool=pool)
  states = jax.device_get(batch_reset(env, params, jax.random.split(jax.random.key(0), 2000)))
  low, high = bandit.NAME_POOLS[(pool, "low")], bandit.NAME_POOLS[(pool, "high")]
  shown = [env.episode_action_names(item(states, i), params) for i in range(2000)]
  for names, high_arm in zip(shown, states.high_risk_arm):
    assert names[high_arm] in high and names[1 - high_arm] in low
  assert 0.45 < np.mean(states.high_risk_arm) < 0.55
  assert {n for names in shown for n in names} == set(low) | set(high)
  assert not set(bandit.NAME_POOLS[("train", "low")] + bandit.NAME_POOLS[("train", "high")]) & set(
    bandit.NAME_POOLS[("test", "low")] + bandit.NAME_POOLS[("test", "high")]
  )


def test_bandit_rewards_match_reference_distribution():
  env, params = envs.make("bandit")
  draws = 8000
  keys = jax.random.split(jax.random.key(1), draws)
  states = batch_reset(env, params, keys)
  high_arm = np.asarray(states.high_risk_arm)
  for pull_high in (True, False):
    actions = jnp.asarray(high_arm if pull_high else 1 - high_arm)
    _, after, rewards, dones, info = jax.device_get(batch_step(env, params, keys, states, actions))
    assert dones.all() and (info["success"] == pull_high).all()
    if pull_high:
      assert set(np.unique(rewards)) == {0.0, 1.0}
      assert abs(rewards.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / draws)
    else:
      np.testing.assert_allclose(rewards, 0.1, rtol=1e-6)
    again = jax.device_get(batch_step(env, params, keys, after, actions))
    assert (again[2] == 0).all()  # finished: no further reward


def test_bandit_text_and_parsing_use_the_episode_names(tokenizer, vocab):
  env, params = envs.make("bandit")
  keys = jax.random.split(jax.random.key(2), 6)
  states = batch_reset(env, params, keys)
  table = env.token_table(vocab, params)
  render = jax.jit(jax.vmap(env.render_tokens, in_axes=(0, None, None)))
  after = batch_step(env, params, keys, states, jnp.arange(6) % 2)[1]
  for batch in (states, after):
    ids, lengths = jax.device_get(render(batch, params, table))
    for i in range(6):
      expected = env.render_text(item(jax.device_get(batch), i), params)
      assert tokenizer.decode(ids[i, : lengths[i]].tolist()) == expected
  for i in range(6):
    state = item(states, i)
    names = env.episode_action_names(state, params)
    for arm in (0, 1):
      answer = vocab.encode(f"<think>hmm</think><answer> {names[arm].upper()} </answer>")
      names_AL, names_len_A = env.action_name_table(state, params)
      padded = jnp.zeros(64, jnp.int32).at[: len(answer)].set(jnp.array(answer))
      out = text.parse_actions(vocab.table, padded, jnp.int32(len(answer)), names_AL, names_len_A, 1)
      assert (out.actions_K.tolist(), bool(out.valid)) == ([arm], True)
      assert text.parse_actions_text(tokenizer.decode(answer), names, 1) == ([arm], True)


# ---------------------------------------------------------------- lightsout


def press(grid, cell):
  """numpy reference toggle."""
  grid = grid.copy()
  r, c = divmod(cell, grid.shape[0])
  for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
    if 0 <= r + dr < grid.shape[0] and 0 <= c + dc < grid.shape[1]:
      grid[r + dr, c + dc] ^= 1
  return grid


def solve_gf2(grid):
  """Cells to press to clear `grid`: Gaussian elimination over GF(2)."""
  n = grid.shape[0]
  matrix = np.array([press(np.zeros((n, n), np.uint8), k).ravel() for k in range(n * n)], np.uint8).T
  augmented = np.concatenate([matrix, grid.reshape(-1, 1).astype(np.uint8)], axis=1)
  row = 0
  for col in range(n * n):
    pivot = next((r for r in range(row, n * n) if augmented[r, col]), None)
    if pivot is None:
      continue
    augmented[[row, pivot]] = augmented[[pivot, row]]
    for r in range(n * n):
      if r != row and augmented[r, col]:
        augmented[r] ^= augmented[row]
    row += 1
  return [k for k in range(n * n) if augmented[k, -1]]


def test_lightsout_solutions_and_rewards_match_reference():
  env, params = envs.make("lightsout")
  count = 64
  keys = jax.random.split(jax.random.key(3), count)
  states = jax.device_get(batch_reset(env, params, keys))
  step = jax.jit(env.step)
  for i in range(count):
    state = item(states, i)
    grid = state.grid.astype(np.uint8)
    assert grid.sum() > 0
    solution = solve_gf2(grid)
    assert 1 <= len(solution) <= params.scramble_depth  # reachable by the scramble's toggles
    for k, cell in enumerate(solution):
      _, state, reward, done, info = jax.device_get(step(keys[i], state, cell, params))
      after = press(grid, cell)
      expected = (int(grid.sum()) - int(after.sum())) / 9 + (1.0 if after.sum() == 0 else 0.0)
      assert reward == pytest.approx(expected, abs=1e-6)
      np.testing.assert_array_equal(state.grid, after)
      assert bool(done) == bool(info["success"]) == (k == len(solution) - 1)
      grid = after


def test_lightsout_invalid_actions_cost_a_step_and_end_at_max_steps(tokenizer, vocab):
  env, params = envs.make("lightsout")
  state = item(batch_reset(env, params, jax.random.split(jax.random.key(4), 1)), 0)
  step = jax.jit(env.step)
  table = env.token_table(vocab, params)
  render = jax.jit(env.render_tokens)
  rewards = []
  for t in range(params.max_steps):
    _, state, reward, done, info = step(jax.random.key(t), state, -1, params)
    rewards.append(float(reward))
    ids, length = render(state, params, table)
    assert tokenizer.decode(np.asarray(ids)[: int(length)].tolist()) == env.render_text(state, params)
  assert rewards == pytest.approx([-0.2] * params.max_steps) and bool(done) and not bool(info["success"])
  assert "Invalid action" in env.render_text(state, params)
  _, after, reward, _, _ = step(jax.random.key(0), state, 0, params)
  assert float(reward) == 0.0
  jax.tree.map(np.testing.assert_array_equal, after, state)


def test_lightsout_renders_toggles_and_endings(tokenizer, vocab):
  env, params = envs.make("lightsout", max_steps=3)
  count = 16
  keys = jax.random.split(jax.random.key(5), count)
  state = batch_reset(env, params, keys)
  table = env.token_table(vocab, params)
  render = jax.jit(jax.vmap(env.render_tokens, in_axes=(0, None, None)))
  texts = []
  for t in range(3):
    cells = jnp.asarray(np.random.default_rng(t).integers(0, 9, size=count))
    state = batch_step(env, params, keys, state, cells)[1]
    ids, lengths = jax.device_get(render(state, params, table))
    for i in range(count):
      texts.append(env.render_text(item(jax.device_get(state), i), params))
      assert tokenizer.decode(ids[i, : lengths[i]].tolist()) == texts[-1]
  assert any("Max steps reached." in t for t in texts) and any("Toggled" in t for t in texts)
