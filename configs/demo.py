"""`make demo`: a tiny model learns Sokoban and FrozenLake on 2 CPU cores in minutes.

A tokenizer is trained on environment text, a ~1M-parameter model is warm-started
by SFT (two short stages on replies with random moves, then solver demonstrations whose
reasoning names the positions, where the box or goal lies and the next push, with
deliberate imperfections: hesitant one-move turns and a habitual wrong first move), then trained with
RL + SNR-Aware Filtering with the collapse diagnostics on.
"""

import ml_collections

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/demo"
  c.model.path = ""  # set by the demo to its SFT checkpoint

  c.demo = ml_collections.ConfigDict()
  c.demo.envs = "sokoban,frozenlake"
  c.demo.vocab_size = 1500
  c.demo.hidden_size = 128
  c.demo.num_layers = 4
  c.demo.num_heads = 4
  c.demo.num_kv_heads = 2
  c.demo.sft_episodes = 512       # per environment
  c.demo.copy_steps = 100         # first SFT stages, on replies with random moves (docs/results.md): the answer
  c.demo.reading_steps = 400      # repeats the reasoning's moves; the reasoning reads positions off the observation
  c.demo.sft_steps = 700          # then the demonstrations (at 200 + 350, FrozenLake read ~40% of turns)
  c.demo.sft_batch_size = 8
  c.demo.sft_length_bucket = 64   # each batch pads its examples to one multiple of 64 tokens, not to the longest
  c.demo.sft_lr = 5e-4            # at 3e-3 the lookup of positions formed in some seeds only (docs/results.md)
  c.demo.sft_warmup_steps = 30    # then a constant rate,
  c.demo.sft_decay_steps = 150    # then cosine decay over the last steps
  c.demo.mistake_rate = 0.3       # share of demonstration turns that start with the habitual move
  c.demo.habit_move = "Up"        # (a wrong move where the plan starts otherwise; RL unlearns the habit)
  c.demo.single_move_rate = 0.6   # share of demonstration turns with only the plan's first move
  c.demo.template_rate = 0.0      # share of demonstration turns with input-agnostic reasoning (study: collapse)
  c.demo.templates = 4            # how many of the env's templates those turns draw from (the first ones)
  c.demo.template_style = "sentence"  # or "reading": a made-up state's reading (`demonstrations.TEMPLATE_STYLES`)

  c.rollout.max_turns = 3
  c.rollout.max_new_tokens = 32
  c.rollout.max_actions_per_traj = 8

  c.algorithm.preset = "grpo"
  c.train.iterations = 12         # validation at 0, 6 and 12
  c.train.env_groups = 8
  c.train.group_size = 8
  c.train.mini_batch_size = 16
  c.train.micro_batch_size = 16
  c.train.actor_lr = 1e-4         # at 3e-4 RL unlearned the warm start's reading
  c.train.val_every = 6
  c.train.val_episodes = 256
  c.train.checkpoint_every = 6
  c.diagnostics.num_samples = 32
  c.diagnostics.compute_freq = 2  # the MI diagnostics every other iteration (reference: 5)
  return c
