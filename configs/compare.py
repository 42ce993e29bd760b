"""`make compare`: the demo's RL with and without SNR-Aware Filtering over several seeds.

One tokenizer and SFT warm start (the demo's settings) are shared by every run; each
(environment, setting, seed) then runs RL from it: 26.5 min measured on the 2-core machine
(docs/results.md).
"""

import ml_collections

from configs import demo


def get_config():
  c = demo.get_config()
  c.workdir = "runs/compare"
  c.demo.envs = "sokoban"
  c.compare = ml_collections.ConfigDict()
  c.compare.seeds = 3             # RL seeds per setting (sampling keys; same training levels)
  c.train.iterations = 20
  c.train.val_every = 5
  c.train.checkpoint_every = 0
  return c
