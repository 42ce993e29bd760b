"""Web shopping (envs/host/webshop.py) with RAGEN's turn limits (`config/_6_webshop.yaml`): up to 9 turns of one
action each (search[keywords] or click[button]), 15000-token episodes, 16 groups x 8 episodes.

  python -m ragen_jax.train --config=configs/webshop.py --config.model.path=/path/to/Qwen2.5-3B-Instruct

Without env.params it shops the generated store. A user's catalog: --config.env.params.catalog=catalog.jsonl with
--config.env.params.instructions=instructions.jsonl (formats, and WebShop's own data converted, in
envs/host/webshop_data.py); or WebShop's simulator itself with --config.env.params.backend=simulator.
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/webshop"
  c.env.name = "webshop"
  c.rollout.max_turns = 9
  c.rollout.max_actions_per_turn = 1
  c.rollout.max_actions_per_traj = 9
  c.rollout.max_model_len = 15000
  c.rollout.max_episode_len = 15000
  c.train.env_groups = 16
  c.train.group_size = 8
  c.evaluate.envs = "webshop"
  return c
