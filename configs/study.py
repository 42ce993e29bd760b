"""`python -m ragen_jax.study`: the filter, correlation and collapse studies at demo scale (docs/results.md).

The demo's warm start, once per environment, then RL runs of `train.iterations` each from it. Choose sub-studies
with `--config.study.names=filter,correlation`; the `study` section is `ragen_jax.study.studies.StudyConfig`.
`--config.study.names=pretrained` fine-tunes a real checkpoint instead (the bundled SmolLM2-135M-Instruct, or
`--config.study.pretrained_model=DIR`) on Bandit (`--config.study.pretrained_env=frozenlake`: FrozenLake) with
its own settings (`studies.PRETRAINED`, `studies.PRETRAINED_ENVS`). The collapse sub-study also trains warm
starts whose demonstrations reason with input-agnostic templates. By default it runs its fifth arm only
(`studies.COLLAPSE_ARMS`; all five: `--config.study.collapse_arms=lr,templates,reference,fluent,fluent_bonus`):
templates in 30% of the policy's demonstrations and in all of its KL reference's (`studies.REFERENCE_COLLAPSE`,
`studies.REFERENCE_DEMO`), in the words of real reading (`studies.FLUENT_COLLAPSE`), with an entropy bonus
(`studies.FLUENT_BONUS`).
"""

from configs import demo
from configs.base import section
from ragen_jax.study.studies import StudyConfig


def get_config():
  c = demo.get_config()
  c.workdir = "runs/study"
  c.study = section(StudyConfig)
  c.train.iterations = 15         # validation at 0, 5, 10 and 15 (20 would make the studies 4 h, not 3)
  c.train.val_every = 5
  c.train.checkpoint_every = 0
  return c
