"""RAGEN-2's main-table settings (SPEC §2, §4, §6) for a local Qwen2.5 checkpoint.

  python -m ragen_jax.train --config=configs/paper/main_table.py:sokoban,ppo \\
      --config.model.path=/path/to/Qwen2.5-3B-Instruct --config.mesh.fsdp=-1

The argument is "ENV,PRESET": ENV in sokoban, frozenlake, countdown, math; PRESET in
ppo, grpo, dapo, drgrpo. 8 groups x 16 episodes, 5 turns x 400 new tokens (1 turn for
countdown and math), clip 0.2/0.28, dual clip 3, entropy 0.001, no KL, SNR-Aware
Filtering top_p rho 0.9, 400 iterations. Hardware, as `python -m ragen_jax.plan` plans
Qwen2.5-3B in bfloat16 compute with every chip on fsdp (docs/scale_out.md has the table):
PPO (with its critic) fits a TPU v5e-16 (15.4 of 16 GiB per chip, little room), a v6e-8,
a v5p-8 or 8 H100s, and a v4-8 or v5e-8 with LoRA (--config.model.lora.rank=64
--config.model.param_dtype=bfloat16: 24.9 and 14.9 GiB); GRPO fits all of those but a
v5e-8 without LoRA. Set --config.filter.enabled=False for the no-filter baseline of the table.
"""

from configs import base

ENVS = ("sokoban", "frozenlake", "countdown", "math")
SINGLE_TURN = ("countdown", "math")


def get_config(arg: str = "sokoban,ppo"):
  env_name, preset = arg.split(",")
  if env_name not in ENVS:
    raise ValueError(f"paper environment {env_name!r}; choose one of {ENVS}")
  c = base.get_config()
  c.workdir = f"runs/paper/{env_name}_{preset}"
  c.model.path = "/path/to/Qwen2.5-3B-Instruct"
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.remat = "full"  # the learner keeps each layer's input only (a 5-turn episode is ~2,600 tokens)
  c.model.logits_chunk = 512  # the 152k-vocab LM head scored 512 tokens at a time
  c.env.name = env_name
  c.algorithm.preset = preset
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  c.train.micro_batch_size = 4
  c.diagnostics.compute_freq = 5  # the reference computes the MI proxies every 5 steps
  if env_name in SINGLE_TURN:
    c.rollout.max_turns = 1
    c.rollout.max_actions_per_turn = 1
    c.rollout.max_actions_per_traj = 1
  return c
