"""Host-path RL on a host text environment (Countdown) with a tiny model."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np

from envs.host import extract_answer, make_text_env
from ragen_jax.config import load_config_file
from ragen_jax.models.scratch import save_scratch_model
from ragen_jax.models.tokenizer import train_tokenizer
from ragen_jax.report.writer import read_metrics
from ragen_jax.rollout import prompt
from ragen_jax.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_countdown_host_path_training(tmp_path):
  data_dir = str(tmp_path / "tfds")
  env_params = {"data_dir": data_dir, "train_size": 32, "validation_size": 8}
  env = make_text_env("countdown", **env_params)
  texts = [env.reset(seed) for seed in range(32)] + [prompt.system_text(env.instruction), prompt.FORMAT_REMINDER] * 10
  tokenizer = train_tokenizer(texts + ["<think>add</think><answer>1 + 2 * 3</answer>"] * 10, vocab_size=600)
  save_scratch_model(tokenizer, tmp_path / "model", hidden_size=32)

  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = str(tmp_path / "model")
  config.workdir = str(tmp_path / "run")
  config.env.name = "countdown"
  config.env.params = env_params
  config.rollout.max_episode_len = 512
  config.algorithm.preset = "grpo"
  config.filter.enabled = False
  trainer = Trainer.create(config)
  trainer.run(2)
  rows = read_metrics(config.workdir)
  assert [r["step"] for r in rows] == [1, 2]
  assert all(math.isfinite(v) for r in rows for v in r.values())
  assert all(r["update/num_updates"] > 0 for r in rows)
  assert "val/success" in rows[-1]
  # the validation transcripts are the Countdown episodes, their actions the answers the environment scored
  transcripts = [json.loads(line) for line in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()]
  assert [(r["step"], r["seed"]) for r in transcripts] == [(2, 123 + i) for i in range(4)]
  for record in transcripts:
    assert make_text_env("countdown", **env_params).reset(record["seed"], "validation") in record["turns"][0]["prompt"]
    for turn in record["turns"]:
      assert turn["actions"] == ([extract_answer("<think>" + turn["reply"])] if turn["format_ok"] else [])
  # The episodes really are Countdown prompts followed by sampled replies.
  traj = trainer.exp.source.run(trainer.state.policy, np.arange(4), np.repeat(np.arange(2), 2),
                                jnp.zeros(2, jnp.uint32))
  text = tokenizer.decode(np.asarray(traj.tokens[0])[np.asarray(traj.valid[0])].tolist())
  assert env.reset(0) in text and text.index(env.reset(0)) < text.rindex("<think>")
  assert np.asarray(traj.loss_mask).sum() > 0
