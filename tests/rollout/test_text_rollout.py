"""Host text-environment rollouts (`rollout.text.text_rollout`) past the episode token budget."""

import jax
import numpy as np
import pytest

from envs import text as env_text
from envs.host.base import TextStep, extract_answer, format_failure
from ragen_jax import mesh as mesh_lib
from ragen_jax.models import Model, init_params
from ragen_jax.models.scratch import scratch_config
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.rollout.text import text_rollout


class EchoEnv:
  """Two turns of "say something": reward 1 per answered turn."""

  name, instruction, max_turns = "echo", "Answer anything.", 2

  def reset(self, seed: int, split: str = "train") -> str:
    self._turns = 0
    return f"Say something, {seed}."

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    answer = extract_answer(response, enable_think)
    if answer is None:
      return format_failure("Say something.")
    self._turns += 1
    return TextStep("Again.", 1.0, self._turns == self.max_turns, False, True, {"answer": answer})


@pytest.fixture(scope="module")
def random_model(tokenizer):
  config = scratch_config(tokenizer, hidden_size=32, num_layers=1)
  return Model(config=config, params=init_params(config, jax.random.key(0)), mesh=mesh_lib.single_device_mesh())


@pytest.fixture(scope="module")
def vocab_table(tokenizer):
  return env_text.Vocab(tokenizer).table


def rollout(model, tokenizer, vocab_table, seq_len):
  config = RolloutConfig(max_turns=2, max_new_tokens=6, temperature=1.0, max_episode_len=seq_len)
  return text_rollout(model, tokenizer, vocab_table, EchoEnv, config, np.arange(2), np.arange(2),
                      jax.random.key(0), seq_len)


def test_episodes_past_max_episode_len_are_truncated_with_the_format_penalty(random_model, tokenizer, vocab_table):
  full = rollout(random_model, tokenizer, vocab_table, 4096)
  lengths = np.asarray(full.valid).sum(1)
  assert (np.asarray(full.num_turns) == 2).all()
  first_turn = int(np.asarray(full.response_start)[:, 0].max()) + 2  # the first prompts and two reply tokens
  # a turn-0 reply cut (the next prompt has no room), then the shortest episode's last reply cut
  for seq_len, turns in ((first_turn, [1, 1]), (int(lengths.min()) - 1, [2, 2])):
    traj = rollout(random_model, tokenizer, vocab_table, seq_len)
    assert np.asarray(traj.valid).sum(1).max() <= seq_len
    assert np.asarray(traj.num_turns).tolist() == turns
    rewards, last = np.asarray(traj.turn_rewards), (np.arange(2), np.asarray(turns) - 1)
    assert np.allclose(rewards[last], -0.1) and not np.asarray(traj.format_ok)[last].any()
    assert np.allclose(np.asarray(traj.score), rewards.sum(1))
