"""Context window modes: older turns dropped by count (limited_multi_turn, single_turn) or past a
token budget; both rollout paths agree, single-turn logits equal transformers' model on the kept
text, and the learner scores with the windows the tokens were sampled with."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from ragen_jax.rollout.device import device_rollout, slot_layout
from ragen_jax.rollout.episodes import RolloutConfig, train_seeds, visible_from
from ragen_jax.rollout.host import host_rollout, reprefill_policy
from ragen_jax.sampling import SamplingRule
from ragen_jax.scoring import token_logp_and_entropy

SEEDS = train_seeds(0, num_groups=2, group_size=2)


def _rollouts(model, sokoban, assets, config):
  env, env_params = sokoban
  seeds, groups = jnp.asarray(SEEDS), jnp.repeat(jnp.arange(2), 2)
  device = device_rollout(model.config, model.params, env, env_params, assets, config, seeds, groups,
                          jax.random.key(3))
  host = host_rollout(reprefill_policy(model, config, assets), env, env_params, assets, config, seeds, groups,
                      jax.random.key(3), seq_len=slot_layout(assets, config)[2])
  return jax.device_get(device), jax.device_get(host)


def _turn_counts(traj, row, max_turns):
  """(system tokens, tokens per turn, prompt-chunk tokens per turn) of one episode."""
  valid, segment, generated = traj.valid[row], traj.segment_ids[row], traj.loss_mask[row]
  system = int(np.sum(valid & (segment == 0)))
  total = [int(np.sum(valid & (segment == k + 1))) for k in range(max_turns)]
  chunk = [int(np.sum(valid & (segment == k + 1) & ~generated)) for k in range(max_turns)]
  return system, total, chunk


def _reference_window(turn, system, total, chunk, context_turns, budget, max_new):
  """The rule written out: keep the last `context_turns` turns, then drop oldest until it fits."""
  first = max(0, turn + 1 - context_turns) if context_turns else 0
  if budget:
    fit = next((u for u in range(turn + 1) if system + sum(total[u:turn]) + chunk[turn] + max_new <= budget), turn)
    first = max(first, fit)
  return first + 1


@pytest.fixture(scope="module")
def single_turn(replying_model, sokoban, assets, greedy_config):
  """(config, device trajectories, host trajectories) of single-turn rollouts, shared by the tests."""
  config = dataclasses.replace(greedy_config, context_window_mode="single_turn")
  return (config, *_rollouts(replying_model, sokoban, assets, config))


@pytest.fixture(scope="module")
def budget(replying_model, sokoban, assets, greedy_config):
  """A token budget under which turn 1 still sees turn 0 but turn 2 must drop it."""
  full, _ = _rollouts(replying_model, sokoban, assets, greedy_config)
  system, total, chunk = _turn_counts(full, 0, greedy_config.max_turns)
  n = greedy_config.max_new_tokens
  low, high = system + total[0] + chunk[1] + n, system + total[0] + total[1] + chunk[2] + n
  assert low < high
  return (low + high) // 2


@pytest.mark.parametrize("mode", ["limited_multi_turn", "single_turn", "token_budget"])
def test_windows_follow_the_rule_and_both_paths_agree(mode, request, replying_model, sokoban, assets, greedy_config):
  if mode == "single_turn":
    config, device, host = request.getfixturevalue("single_turn")
  else:
    overrides = {"limited_multi_turn": dict(context_window_mode="limited_multi_turn", max_context_window=2),
                 "token_budget": dict(max_model_len=request.getfixturevalue("budget"))}[mode]
    config = dataclasses.replace(greedy_config, **overrides)
    device, host = _rollouts(replying_model, sokoban, assets, config)
  for field in dataclasses.fields(device):
    a, b = np.asarray(getattr(device, field.name)), np.asarray(getattr(host, field.name))
    if field.name == "sample_logp":
      np.testing.assert_allclose(a, b, atol=1e-4, err_msg=field.name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=field.name)
  assert (device.num_turns == 3).all()
  dropped = 0
  for row in range(device.tokens.shape[0]):
    system, total, chunk = _turn_counts(device, row, config.max_turns)
    for turn in range(3):
      in_turn = device.valid[row] & (device.segment_ids[row] == turn + 1)
      expected = _reference_window(turn, system, total, chunk, config.context_turns, config.max_model_len,
                                   config.max_new_tokens)
      assert set(device.visible_from[row][in_turn].tolist()) == {expected}
      dropped += expected > 1
  assert dropped > 0, "no turn was dropped: the test would not see a window"


def test_single_turn_logits_equal_transformers_on_the_kept_text(single_turn, replying_model_dir):
  _, device, _ = single_turn
  hf = transformers.AutoModelForCausalLM.from_pretrained(replying_model_dir, dtype=torch.float32).eval()
  for row in range(device.tokens.shape[0]):
    for turn in (1, 2):
      # Kept: the system prompt and this turn; positions stay those of the whole episode.
      positions = np.flatnonzero(device.valid[row] & ((device.segment_ids[row] == 0)
                                                      | (device.segment_ids[row] == turn + 1)))
      with torch.no_grad():
        logits = hf(input_ids=torch.tensor(device.tokens[row][positions][None].astype(np.int64)),
                    position_ids=torch.tensor(positions[None])).logits[0].numpy()
      logp = jax.nn.log_softmax(jnp.asarray(logits[:-1]), axis=-1)
      reply = np.flatnonzero(device.loss_mask[row][positions][1:]) + 1  # indices into `positions`
      expected = np.asarray(logp)[reply - 1, device.tokens[row][positions][reply]]
      np.testing.assert_allclose(device.sample_logp[row][positions][reply], expected, atol=2e-4)


def test_learner_scores_with_the_sampling_windows(single_turn, replying_model):
  _, device, _ = single_turn
  score = jax.jit(lambda *x: token_logp_and_entropy(replying_model.config, replying_model.params, *x)[0])
  windowed = np.asarray(score(device.tokens, device.valid, device.segment_ids, device.visible_from))
  full = np.asarray(score(device.tokens, device.valid, None, None))
  mask = device.loss_mask
  np.testing.assert_allclose(windowed[mask], device.sample_logp[mask], atol=1e-4)
  later = mask & (device.turn_of_token > 0)
  assert np.max(np.abs(full[later] - device.sample_logp[later])) > 1e-3, "windows made no difference"


def test_window_rule_cases():
  config = RolloutConfig(max_turns=4, max_new_tokens=10, context_window_mode="limited_multi_turn", max_context_window=2,
                         max_model_len=100)
  turn_tokens = jnp.asarray([30, 30, 30, 0], jnp.int32)
  rule = jax.jit(lambda turn, chunk: visible_from(config, turn, turn_tokens, chunk, 20))
  assert int(rule(0, 10)) == 1  # nothing to drop
  assert int(rule(1, 10)) == 1  # 20 + 30 + 10 + 10 = 70 fits, 2 turns kept
  assert int(rule(2, 10)) == 2  # last two turns only
  assert int(rule(2, 45)) == 3  # 20 + 30 + 45 + 10 > 100: only the current turn
  assert int(rule(3, 90)) == 4  # does not fit even alone: only the current turn
  unlimited = RolloutConfig(max_turns=4, max_new_tokens=10, max_model_len=0)
  assert int(visible_from(unlimited, 3, turn_tokens, 1000, 20)) == 1
  with pytest.raises(ValueError, match="rollout.max_context_window"):
    RolloutConfig(context_window_mode="limited_multi_turn", max_context_window=0)


def test_validation_samples_at_its_own_temperature_without_truncation():
  config = RolloutConfig(temperature=0.9, top_k=5, top_p=0.8, val_temperature=0.3)
  assert config.for_split("train") is config
  assert config.for_split("validation").rule == SamplingRule(temperature=0.3, top_k=0, top_p=1.0)
  with pytest.raises(ValueError, match="split='test' is not one of 'train', 'validation'"):
    config.for_split("test")


def test_mi_scorer_reads_prompts_through_the_sampling_windows(single_turn, replying_model):
  from ragen_jax.diagnostics import cross_scoring as xs
  _, device, _ = single_turn
  episodes, turns = np.repeat(np.arange(4), 3), np.tile(np.arange(3), 4)
  assert (device.reasoning_len[episodes, turns] > 0).all()
  pairs = xs.CrossPairs(row_episode=jnp.asarray(episodes), row_turn=jnp.asarray(turns),
                        row_mask=jnp.ones(12, bool), col_episode=jnp.asarray(episodes), col_turn=jnp.asarray(turns),
                        own_col=jnp.arange(12))
  batch = jax.tree.map(jnp.asarray, device)
  scores, lengths = xs.score_pairs(replying_model.config, replying_model.params, batch, pairs,
                                   max_reasoning_tokens=16, prompt_window=batch.seq_len, block_tokens=4)
  # A reasoning scored against its own prompt reproduces its sampling log-probs.
  sampled = xs.gather_reasoning(batch.sample_logp, batch, pairs.row_episode, pairs.row_turn, 16)[0].sum(1)
  np.testing.assert_allclose(np.diag(np.asarray(scores)), np.asarray(sampled), atol=1e-4)
  assert (np.asarray(lengths) > 0).all()
