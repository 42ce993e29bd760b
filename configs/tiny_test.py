"""A quick run on Sokoban that needs nothing prepared: the built-in tiny random model (`scratch:tiny`, with
the bundled tokenizer). Tests point model.path at their own tiny models."""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/tiny_test"
  c.model.path = "scratch:tiny"
  c.rollout.max_turns = 2
  c.rollout.max_new_tokens = 12
  c.train.iterations = 2
  c.train.env_groups = 2
  c.train.group_size = 4
  c.train.mini_batch_size = 4
  c.train.micro_batch_size = 2
  c.train.actor_lr = 1e-3
  c.train.critic_lr = 1e-3
  c.train.val_every = 2
  # validation plays the training batch at its temperature: nothing new to compile
  c.train.val_episodes = c.train.env_groups * c.train.group_size
  c.rollout.val_temperature = c.rollout.temperature
  c.train.checkpoint_every = 1
  c.diagnostics.num_samples = 8
  c.logging.progress_bar = False
  return c
