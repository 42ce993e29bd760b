"""FrozenLake against gymnasium's FrozenLakeEnv (moves, slips, rewards, termination)."""
import functools
from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

import envs

LETTERS = np.array(list("SFHG"))


def has_path(desc) -> bool:
  """Independent BFS from the start to the goal over non-hole cells."""
  rows, cols = desc.shape
  start = tuple(np.argwhere(desc == 0)[0])
  seen, queue = {start}, deque([start])
  while queue:
    r, c = queue.popleft()
    if desc[r, c] == 3:
      return True
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
      n = (r + dr, c + dc)
      if 0 <= n[0] < rows and 0 <= n[1] < cols and n not in seen and desc[n] != 2:
        seen.add(n)
        queue.append(n)
  return False


@functools.partial(jax.jit, static_argnums=0)
def batch_reset(env, params, keys):
  return jax.vmap(env.reset, in_axes=(0, None))(keys, params)[1]


@functools.partial(jax.jit, static_argnums=0)
def batch_rollout(env, params, keys_B, states, actions_BT):
  def one(key, state, actions):
    def step(state, inputs):
      key, action = inputs
      _, state, reward, done, info = env.step(key, state, action, params)
      return state, (state, reward, done, info["success"])

    return jax.lax.scan(step, state, (jax.random.split(key, actions.shape[0]), actions))[1]

  return jax.vmap(one)(keys_B, states, actions_BT)


def item(tree, *index):
  return jax.tree.map(lambda x: x[index], tree)


@pytest.mark.parametrize("size, p_frozen", [(4, 0.9), (4, 0.3), (6, 0.7)])
def test_maps_have_one_start_one_goal_and_a_path(size, p_frozen):
  env, params = envs.make("frozenlake", size=size, p_frozen=p_frozen)
  states = jax.device_get(batch_reset(env, params, jax.random.split(jax.random.key(0), 400)))
  holes = 0
  for i in range(400):
    s = item(states, i)
    assert (s.desc == 0).sum() == 1 and (s.desc == 3).sum() == 1
    assert tuple(s.player_pos) == tuple(np.argwhere(s.desc == 0)[0])
    assert has_path(s.desc), s.desc
    holes += (s.desc == 2).sum()
  expected = 400 * (size * size - 2) * (1 - p_frozen)
  assert holes > 0.5 * expected  # maps are random, not emptied to make a path


def test_success_rate_one_matches_gymnasium_not_slippery():
  env, params = envs.make("frozenlake", size=5, p_frozen=0.75, max_steps=1000)
  count, horizon = 60, 40
  keys = jax.random.split(jax.random.key(1), count)
  states = batch_reset(env, params, keys)
  actions = np.random.default_rng(0).integers(0, 4, size=(count, horizon))
  trace, rewards, dones, successes = jax.device_get(batch_rollout(env, params, keys, states, jnp.asarray(actions)))
  states = jax.device_get(states)
  outcomes = set()
  for i in range(count):
    gym = FrozenLakeEnv(desc=["".join(row) for row in LETTERS[states.desc[i]]], is_slippery=False)
    position, _ = gym.reset(seed=0)
    assert position == states.player_pos[i][0] * 5 + states.player_pos[i][1]
    for t in range(horizon):
      position, reward, terminated, truncated, _ = gym.step(int(actions[i, t]))
      assert position == trace.player_pos[i, t][0] * 5 + trace.player_pos[i, t][1], (i, t)
      assert (rewards[i, t], dones[i, t], successes[i, t]) == (reward, terminated, reward == 1.0)
      if terminated:
        outcomes.add(reward)
        break
  assert outcomes == {0.0, 1.0}  # episodes end in holes and in goals


def test_slips_follow_gymnasium_transition_table():
  """success_rate 0.8: empirical next-cell frequencies match gymnasium's P table."""
  env, params = envs.make("frozenlake", size=4, success_rate=0.8)
  state = item(batch_reset(env, params, jax.random.split(jax.random.key(2), 1)), 0)
  desc = np.asarray(state.desc)
  gym = FrozenLakeEnv(desc=["".join(row) for row in LETTERS[desc]], is_slippery=True, success_rate=0.8)
  draws = 4000
  step = jax.jit(jax.vmap(env.step, in_axes=(0, None, None, None)))
  start = int(state.player_pos[0]) * 4 + int(state.player_pos[1])
  for action in range(4):
    _, after, _, _, _ = step(jax.random.split(jax.random.key(action), draws), state, action, params)
    cells = np.asarray(after.player_pos[:, 0] * 4 + after.player_pos[:, 1])
    expected = {}
    for probability, cell, _, _ in gym.unwrapped.P[start][action]:
      expected[cell] = expected.get(cell, 0.0) + probability
    observed = {cell: np.mean(cells == cell) for cell in np.unique(cells)}
    assert set(observed) <= set(expected)
    for cell, probability in expected.items():
      tolerance = 4 * np.sqrt(probability * (1 - probability) / draws) + 1e-9
      assert abs(observed.get(cell, 0.0) - probability) <= tolerance, (action, cell)


def test_finished_episode_and_bad_actions_are_noops():
  env, params = envs.make("frozenlake", max_steps=3)
  state = item(batch_reset(env, params, jax.random.split(jax.random.key(3), 1)), 0)
  step = jax.jit(env.step)
  for action in (-1, 4):
    _, after, reward, _, _ = step(jax.random.key(0), state, action, params)
    assert float(reward) == 0.0
    jax.tree.map(np.testing.assert_array_equal, after, state)
  for t in range(3):
    _, state, _, done, _ = step(jax.random.key(t), state, t % 4, params)
  assert bool(done)
  _, after, reward, done, _ = step(jax.random.key(9), state, 0, params)
  assert float(reward) == 0.0 and bool(done)
  jax.tree.map(np.testing.assert_array_equal, after, state)


def test_rendered_tokens_decode_to_render_text(tokenizer, vocab):
  env, params = envs.make("frozenlake", p_frozen=0.6)
  count, horizon = 24, 12
  keys = jax.random.split(jax.random.key(4), count)
  actions = jnp.asarray(np.random.default_rng(3).integers(0, 4, size=(count, horizon)))
  trace = jax.device_get(batch_rollout(env, params, keys, batch_reset(env, params, keys), actions)[0])
  flat = jax.tree.map(lambda x: x.reshape(count * horizon, *x.shape[2:]), trace)
  table = env.token_table(vocab, params)
  ids, lengths = jax.device_get(jax.jit(jax.vmap(env.render_tokens, in_axes=(0, None, None)))(flat, params, table))
  assert ids.shape[-1] == env.max_obs_tokens(table) >= lengths.max()
  texts = [env.render_text(item(flat, k), params) for k in range(count * horizon)]
  for k, expected in enumerate(texts):
    assert tokenizer.decode(ids[k, : lengths[k]].tolist()) == expected
  for label in ("Player: ", "Player in hole: ", "Player on goal: "):
    assert any(label in t for t in texts), label


def test_vmap_matches_python_loop_over_single_envs():
  env, params = envs.make("frozenlake", success_rate=0.8)
  count, horizon = 1024, 6
  keys = jax.random.split(jax.random.key(5), count)
  actions = jnp.asarray(np.random.default_rng(4).integers(0, 4, size=(count, horizon)))
  states = batch_reset(env, params, keys)
  batched = jax.device_get((states, batch_rollout(env, params, keys, states, actions)))

  @jax.jit
  def single(i):
    _, state = env.reset(keys[i], params)

    def step(state, inputs):
      key, action = inputs
      _, state, reward, done, _ = env.step(key, state, action, params)
      return state, (reward, done)

    return state, jax.lax.scan(step, state, (jax.random.split(keys[i], horizon), actions[i]))

  singles = jax.device_get([single(np.int32(i)) for i in range(count)])  # one env per call
  for i, (start, (final, (rewards, dones))) in enumerate(singles):
    jax.tree.map(np.testing.assert_array_equal, start, item(batched[0], i))
    jax.tree.map(np.testing.assert_array_equal, final, item(batched[1][0], i, -1))
    np.testing.assert_array_equal(rewards, batched[1][1][i])
    np.testing.assert_array_equal(dones, batched[1][2][i])
