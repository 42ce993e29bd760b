"""Rollouts: device path vs host re-prefill path, prompt layout, loss mask, rewards."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text as env_text
from ragen_jax.rollout import prompt
from ragen_jax.rollout.device import device_rollout, slot_layout
from ragen_jax.rollout.episodes import act, train_seeds
from ragen_jax.rollout.host import host_rollout, reprefill_policy
from tests.conftest import REPLY


@pytest.fixture(scope="module")
def both_paths(replying_model, sokoban, assets, greedy_config):
  env, env_params = sokoban
  seeds = jnp.asarray(train_seeds(0, num_groups=3, group_size=2))
  groups = jnp.repeat(jnp.arange(3), 2)
  model = replying_model
  device = device_rollout(model.config, model.params, env, env_params, assets, greedy_config, seeds, groups,
                          jax.random.key(7))
  host = host_rollout(reprefill_policy(model, greedy_config, assets), env, env_params, assets, greedy_config, seeds,
                      groups, jax.random.key(7), seq_len=slot_layout(assets, greedy_config)[2])
  return jax.device_get(device), jax.device_get(host)


def test_device_and_host_paths_give_identical_greedy_trajectories(both_paths):
  device, host = both_paths
  for field in dataclasses.fields(device):
    a, b = np.asarray(getattr(device, field.name)), np.asarray(getattr(host, field.name))
    if a.dtype == np.float32 and field.name == "sample_logp":
      np.testing.assert_allclose(a, b, atol=1e-4, err_msg=field.name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=field.name)
  # The episodes really played: valid answers, actions executed, rewards from the env.
  assert device.format_ok[:, 0].all() and (device.num_actions > 0).all()
  assert (device.num_turns == 3).all() and (device.reasoning_len[:, 0] > 0).all()


def test_conversation_matches_the_reference_layout(both_paths, tokenizer, sokoban, greedy_config):
  device, _ = both_paths
  env, env_params = sokoban
  pieces = prompt.ChatPieces.from_tokenizer(tokenizer)
  system = prompt.system_text(env.instruction_text(env_params, greedy_config.max_actions_per_traj))
  for row in range(device.tokens.shape[0]):
    # Replay the same actions on the host to get each turn's observation text.
    _, state = env.reset(jax.random.key(int(train_seeds(0, 3, 2)[row])), env_params)
    turns, actions_left, prev_reward = [], greedy_config.max_actions_per_traj, None
    for turn in range(int(device.num_turns[row])):
      start, length = int(device.response_start[row, turn]), int(device.response_len[row, turn])
      reply_ids = device.tokens[row, start:start + length].tolist()
      ended_by_eos = reply_ids[-1] == tokenizer.eos_token_id
      reply = tokenizer.decode(reply_ids)
      turns.append((prev_reward, prompt.user_text(turn, env.render_text(state, env_params), actions_left,
                                                  greedy_config.max_new_tokens), reply, ended_by_eos))
      actions, _ = env_text.parse_actions_text(env_text.THINK_OPEN + reply, env.action_names(env_params), 2)
      for a in actions:  # the recognised actions, also of a penalised turn
        _, state, _, _, _ = env.step(jax.random.key(0), state, a, env_params)
        actions_left -= 1
      prev_reward = float(device.turn_rewards[row, turn])
    text = tokenizer.decode(device.tokens[row][device.valid[row]].tolist())
    assert text == prompt.conversation_text(pieces, system, turns)


def test_loss_mask_covers_exactly_the_replies(both_paths, tokenizer):
  device, _ = both_paths
  reply_ids = tokenizer.encode(REPLY)
  for row in range(device.tokens.shape[0]):
    generated = np.flatnonzero(device.loss_mask[row])
    spans = [(int(s), int(s + n)) for s, n in zip(device.response_start[row], device.response_len[row]) if s >= 0]
    assert generated.tolist() == [i for s, e in spans for i in range(s, e)]
    for s, e in spans:
      assert device.tokens[row, s:e].tolist()[:len(reply_ids)] == reply_ids
    # Prompt tokens (system, user turns, observations) are never in the loss mask.
    assert not np.any(device.loss_mask[row] & ~device.valid[row])
    assert device.turn_end[row].sum() == len(spans)


def test_rewards_and_scores_are_consistent(both_paths):
  device, _ = both_paths
  np.testing.assert_allclose(device.score, device.turn_rewards.sum(1), rtol=1e-6)
  np.testing.assert_allclose(device.token_rewards.sum(1), device.score, rtol=1e-5)
  np.testing.assert_allclose(device.score_rewards.sum(1), device.score, rtol=1e-6)
  # Sokoban: each executed action costs -0.1 plus box rewards; with no format errors the
  # score is at most -0.1 per action unless a box moved onto a target.
  assert np.all(device.score <= -0.1 * device.num_actions + 11.0)
  # Group members share the env seed, so greedy episodes in a group are identical.
  np.testing.assert_array_equal(device.tokens[0], device.tokens[1])


@pytest.mark.parametrize("enable_think", [True, False])
def test_act_steps_the_recognised_actions_also_of_penalised_turns(tokenizer, sokoban, sokoban_states, assets,
                                                                  greedy_config, enable_think):
  env, env_params = sokoban
  up, down, left = 0, 1, 2
  cases = [  # (reply, actions the reference steps, well-formed) under its think grammar and without it
    ("push</think><answer>Up || Left</answer>", [up, left], True, [up, left], True),
    ("push</think><answer>Up || Jump</answer>", [up], False, [up], False),
    ("push</think><answer>Jump || LEFT || Up</answer>", [left], False, [left], False),  # 2 per turn
    ("go</think> So: <answer>Up</answer>", [], False, [up], True),
    ("go <answer>Up</answer>", [], False, [up], True),
    ("I could write <answer>Up</answer> but no</think><answer>Down</answer>", [down], True, [up], True),
    ("push</think>\u00a0<answer><answer>DOWN\u3000</answer>", [down], True, [down], True),
  ]
  config = dataclasses.replace(greedy_config, enable_think=enable_think)
  ids = [tokenizer.encode(case[0]) for case in cases]
  assert [tokenizer.decode(i) for i in ids] == [case[0] for case in cases]
  replies_BN = np.zeros((len(cases), max(map(len, ids))), np.int32)
  for row, row_ids in enumerate(ids):
    replies_BN[row, :len(row_ids)] = row_ids
  states = jax.tree.map(lambda x: x[:len(cases)], sokoban_states)
  batch = len(cases)
  outcome = act(env, env_params, assets, config, jax.random.key(0), states, jnp.asarray(replies_BN),
                jnp.array([len(i) for i in ids]), jnp.ones(batch, bool), jnp.full(batch, 10))
  for row, case in enumerate(cases):
    actions, well_formed = case[1:3] if enable_think else case[3:5]
    state, reward = jax.tree.map(lambda x: x[row], states), 0.0 if well_formed else config.format_penalty
    for a in actions:
      _, state, r, _, _ = env.step(jax.random.key(0), state, a, env_params)
      reward += float(r)
    assert (bool(outcome.format_ok[row]), int(outcome.num_actions[row])) == (well_formed, len(actions)), case[0]
    assert float(outcome.reward[row]) == pytest.approx(reward), case[0]
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[row], b), outcome.env_state, state)


def test_reward_text_rendering_matches_host():
  from ragen_jax.rollout.prompt import format_reward, head_choices
  for reward in [-0.1, 0.0, 1.0, 10.9, -1.1, 0.25, 123.45, -0.05, 9.99, 0.3]:
    choices = np.asarray(head_choices(1, jnp.float32(reward), False))
    digits = "".join(
        ["-" if choices[1] == 0 else ""] + [str(c) for c in choices[2:5] if c >= 0] +
        ["." if choices[5] == 0 else ""] + [str(c) for c in choices[6:8] if c >= 0])
    assert digits == format_reward(reward), reward
