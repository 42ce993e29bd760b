"""Search QA (envs/host/search.py) with RAGEN's turn limits (`config/_10_search.yaml`): up to 5 turns of one
action each (search[query] or finish[answer]), 5000-token episodes, 16 groups x 8 episodes.

  python -m ragen_jax.train --config=configs/search.py --config.model.path=/path/to/Qwen2.5-3B-Instruct

Without env.params it plays the generated two-hop set over its generated corpus (BM25). A user's data:
--config.env.params.questions=q.jsonl with --config.env.params.corpus=corpus.jsonl (a local BM25 index, saved
beside the corpus) or --config.env.params.server_url=http://127.0.0.1:8000 (a Search-R1 retrieval server).
Passages are cut to 300 words per search; with --config.env.params.tokenizer=/path/to/Qwen2.5-3B-Instruct to
400 of the policy's tokens (observation_tokens).
"""

from configs import base


def get_config():
  c = base.get_config()
  c.workdir = "runs/search"
  c.env.name = "search"
  c.rollout.max_turns = 5
  c.rollout.max_actions_per_turn = 1
  c.rollout.max_actions_per_traj = 5
  c.rollout.max_model_len = 5000
  c.rollout.max_episode_len = 5000
  c.train.env_groups = 16
  c.train.group_size = 8
  c.evaluate.envs = "search"
  return c
