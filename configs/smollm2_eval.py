"""Zero-shot evaluation of the bundled SmolLM2-135M-Instruct on every environment (CPU).

  .venv/bin/python -m ragen_jax.evaluate --config=configs/smollm2_eval.py
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/smollm2_eval"
  c.model.path = ""  # the bundled SmolLM2-135M-Instruct
  c.rollout.max_new_tokens = 96
  c.rollout.max_turns = 3
  c.train.val_episodes = 16
  c.evaluate.envs = "sokoban,frozenlake,bandit,lightsout"
  c.evaluate.k = 1
  c.train.env_groups = 2
  c.train.group_size = 4
  c.train.mini_batch_size = 8  # must divide the 2 x 4 batch (evaluation builds the trainer, never updates)
  return c
