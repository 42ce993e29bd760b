"""A few RL iterations of the bundled SmolLM2-135M-Instruct on FrozenLake (CPU, small batch):
the real-checkpoint path end to end.

  .venv/bin/python -m ragen_jax.train --config=configs/smollm2_rl.py
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/smollm2_rl"
  c.model.path = ""
  c.env.name = "frozenlake"
  c.algorithm.preset = "grpo"
  c.rollout.max_turns = 2
  c.rollout.max_new_tokens = 64
  c.train.iterations = 3
  c.train.env_groups = 2
  c.train.group_size = 4
  c.train.mini_batch_size = 8
  c.train.micro_batch_size = 2
  c.train.actor_lr = 1e-6
  c.train.val_every = 3
  c.train.val_episodes = 8
  c.train.checkpoint_every = 0
  c.diagnostics.num_samples = 8
  # The zero-shot model scores every episode alike (format penalties), so SNR-Aware Filtering
  # would keep no group and nothing would update; off here so the update path runs.
  c.filter.enabled = False
  return c
