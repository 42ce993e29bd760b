"""The sub-studies: each a list of named runs, a run being RL settings as config overrides from the shared warm start.

A setting is a dict of flattened config keys (`filter.enabled`) to values, applied over the study's config.
"""

from __future__ import annotations

import dataclasses

from ragen_jax.config import check, check_one_of
from ragen_jax.report.comparison import SETTINGS


def _filter_pair(prefix: str, overrides: dict) -> dict:
  """Settings `<prefix>no_filter` and `<prefix>snr_filter`: `overrides` with the filter off and on."""
  return {f"{prefix}{name}": overrides | {"filter.enabled": enabled} for name, enabled in SETTINGS.items()}


FILTER_SETTINGS = _filter_pair("", {})
# What RAGEN-2 varies between its runs (filter and rho, entropy and KL terms, learning rate) around the demo's
# RL (filter on, rho 0.9, entropy 0.001, no KL loss, lr 1e-4), and a learning rate meant to degrade the policy.
CORRELATION_SETTINGS = {
    "no_filter": {"filter.enabled": False},
    "snr_filter": {"filter.enabled": True},
    "rho_0.5": {"filter.value": 0.5},
    "entropy_0.02": {"algorithm.entropy_coef": 0.02},
    "kl_0.1": {"algorithm.use_kl_loss": True, "algorithm.kl_coef": 0.1},
    "lr_3e-5": {"train.actor_lr": 3e-5},
    "lr_3e-4": {"train.actor_lr": 3e-4},
    "lr_3e-3_degrades": {"train.actor_lr": 3e-3, "filter.enabled": False},
}
# Template collapse at demo scale: the demo's RL at 3x its learning rate. In docs/results.md (2026-12-03) RL at
# actor lr 3e-4 unlearned the warm start's reading (reasoning that names the observed positions fell from 100% to
# 27% of turns) while success stayed flat. A first try here, a KL loss of 0.5 with an entropy bonus of 0.05 at the
# same rate, did not collapse: the KL term held the policy at its input-dependent warm start, and the bonus
# doubled the entropy.
COLLAPSE = {"train.actor_lr": 3e-4}
COLLAPSE_SETTINGS = _filter_pair("", COLLAPSE)
# A second collapse arm, from a warm start with template collapse already in it: half of its demonstration turns
# reason with an input-agnostic template (`demonstrations.TEMPLATES`), and RL's entropy bonus is 50x the demo's,
# the regulariser the SNR argument says dominates when few groups have reward variance. In docs/results.md
# (2026-12-06, the rerun) the templates grew in all 3 seeds, less with the filter (reading 13-23 points higher).
TEMPLATE_COLLAPSE = {"demo.template_rate": 0.5, "algorithm.entropy_coef": 0.05}
TEMPLATE_SETTINGS = _filter_pair("templates_", TEMPLATE_COLLAPSE)
# A third arm, where the pull toward templates is the KL loss's and not the entropy bonus's: the policy starts from
# a warm start with templates in 30% of its turns (`Run.warm_start` "few-templates"), and the KL reference is a
# warm start of the same SFT with templates in every turn (`Run.reference`, `model.reference_path`), as when the
# reference is a base model whose reasoning is generic. The KL loss is the squared log-ratio: k3 (`low_var_kl`) is
# clipped at 10 nats per token and gives the reading tokens, far less likely under the reference, no gradient. In
# docs/results.md (2026-12-06) the reasoning became input-agnostic without the filter in all 3 seeds (MI and
# retrieval accuracy to chance) and the alarm fired in one; the filter slowed it.
REFERENCE_COLLAPSE = {"demo.template_rate": 0.3, "demo.templates": 1, "algorithm.use_kl_loss": True,
                      "algorithm.kl_coef": 0.1, "algorithm.kl_estimator": "mse"}
REFERENCE_DEMO = {"demo.template_rate": 1.0}
REFERENCE_SETTINGS = _filter_pair("reference_", REFERENCE_COLLAPSE)
# A fourth arm, the third with templates in the words of real reading (`demo.template_style` "reading": 4 made-up
# states' readings, as long as real ones). The third's template is one token of the demo's tokenizer, so as the
# templates grew the replies became mostly answer tokens, and the per-token entropy rose with the answer's share.
# In docs/results.md (2026-12-06) the reasoning became input-agnostic without the filter in all 3 seeds and the
# entropy ended 7-29% lower; with the filter it ended within 6% while the MI estimate fell 36-75%.
FLUENT_COLLAPSE = REFERENCE_COLLAPSE | {"demo.template_style": "reading", "demo.templates": 4}
FLUENT_SETTINGS = _filter_pair("fluent_reference_", FLUENT_COLLAPSE)
# A fifth arm, the fourth with an entropy bonus of 0.03 (30x the demo's), the SNR argument's other regulariser: it
# holds the entropy up while the KL loss pulls the reasoning toward templates. It shares the fourth's warm starts.
# In docs/results.md (2026-12-06) the reasoning became input-agnostic without the filter in all 3 seeds while the
# entropy's 4-iteration mean ended within 2% of its start in 2 (-11% in the third).
FLUENT_BONUS = FLUENT_COLLAPSE | {"algorithm.entropy_coef": 0.03}
FLUENT_BONUS_SETTINGS = _filter_pair("fluent_bonus_", FLUENT_BONUS)


@dataclasses.dataclass(frozen=True)
class CollapseArm:
  """An arm of the collapse sub-study: its settings, the kind of its warm start (`Run.warm_start`) and the `demo`
  overrides of its KL reference's warm start (`Run.reference`)."""
  settings: dict
  warm_start: str = "demo"
  reference: dict | None = None


# The collapse sub-study's arms in run order, chosen with `study.collapse_arms`. By default only the fifth runs,
# the one whose entropy held while the reasoning stopped reading: the first four are how it was found.
COLLAPSE_ARMS = {"lr": CollapseArm(COLLAPSE_SETTINGS), "templates": CollapseArm(TEMPLATE_SETTINGS, "templates"),
                 "reference": CollapseArm(REFERENCE_SETTINGS, "few-templates", REFERENCE_DEMO),
                 "fluent": CollapseArm(FLUENT_SETTINGS, "few-fluent-templates", REFERENCE_DEMO),
                 "fluent_bonus": CollapseArm(FLUENT_BONUS_SETTINGS, "few-fluent-templates", REFERENCE_DEMO)}
# Sub-study 4, a real pretrained model (`study.pretrained_model`, "" the bundled SmolLM2-135M-Instruct) with its
# own tokenizer and chat template: a short SFT on solver demonstrations (format only: no tokenizer training, no
# format stages), then GRPO with the filter. Sized for about 45 min on a 2-core CPU (FrozenLake: about 70, where
# one SFT step of 4 x 448 tokens of SmolLM2 takes 27-42 s beside another job). The actor lr is 10x RAGEN's 1e-6:
# its runs take 200 iterations, these 8-15. Episodes of 3 FrozenLake turns of SmolLM2's template run to about
# 2,000 tokens: without rematerialisation the first update kept every layer's attention probabilities and outgrew
# 24 GiB of memory.
PRETRAINED = {"demo.sft_episodes": 128, "demo.sft_steps": 40, "demo.sft_batch_size": 4, "demo.sft_lr": 1e-5,
              "demo.sft_warmup_steps": 4, "demo.sft_decay_steps": 16, "rollout.max_new_tokens": 64,
              "train.actor_lr": 1e-5, "train.env_groups": 2, "train.group_size": 8, "train.mini_batch_size": 16,
              "train.micro_batch_size": 4, "model.remat": "full", "model.logits_chunk": 512, "train.iterations": 8,
              "train.val_every": 4, "train.val_episodes": 64, "filter.enabled": True}
# Per environment, over PRETRAINED (docs/results.md: on FrozenLake the model did not learn in 8 iterations; on
# Bandit it did). Bandit episodes are one pull of about 250 tokens, so its runs take more and larger iterations
# and validate on more seeds in less time (about 30 min). Its demonstrations pull either arm at random (the
# solver's high-risk arm, swapped in half the replies): the warm start teaches the reply format and leaves the
# choice of arm to RL.
PRETRAINED_ENVS = {"frozenlake": {},
                   "bandit": {"rollout.max_turns": 1, "rollout.max_actions_per_turn": 1, "demo.mistake_rate": 0.5,
                              "demo.habit_move": "", "demo.single_move_rate": 0.0, "train.env_groups": 4,
                              "train.iterations": 15, "train.val_every": 5, "train.val_episodes": 256}}
# Per environment, the env params of a held-out validation of each of its runs, before and after RL on the same
# seeds (`demo.stages.reinforce`): Bandit's test pool of arm names, seen in neither the warm start nor RL.
HELDOUT_PARAMS = {"bandit": {"name_pool": "test"}}
PRETRAINED_SETTING = "pretrained_snr_filter"
SCRATCH_ENVS = ("sokoban", "frozenlake")  # the envs whose demo warm start learns to read (the other sub-studies)
STUDIES = ("filter", "correlation", "collapse", "pretrained")


@dataclasses.dataclass(frozen=True)
class StudyConfig:
  """The `study` config section: which sub-studies run (`STUDIES`; by default all but "pretrained"), on which
  environments, with how many RL seeds; `pretrained_model`: the checkpoint of the pretrained sub-study.

  `collapse_arms`: the collapse sub-study's arms (`COLLAPSE_ARMS`, comma-separated).
  `only`: if set, just these setting names (comma-separated) of each selected sub-study.
  `bootstrap`: resamples of the Spearman intervals.
  """

  names: str = "filter,correlation,collapse"
  filter_envs: str = "sokoban,frozenlake"
  filter_seeds: int = 5
  correlation_env: str = "sokoban"
  correlation_seeds: int = 2
  collapse_env: str = "sokoban"
  collapse_seeds: int = 3
  collapse_arms: str = "fluent_bonus"
  pretrained_env: str = "bandit"
  pretrained_model: str = ""  # an HF directory; "" the bundled SmolLM2-135M-Instruct
  pretrained_seeds: int = 1
  only: str = ""
  bootstrap: int = 2000

  def __post_init__(self):
    for name in self.study_names:
      check_one_of("study.names", name, STUDIES)
    for key, env in [("filter_envs", e) for e in self.filter_envs.split(",")] + [
        ("correlation_env", self.correlation_env), ("collapse_env", self.collapse_env)]:
      check_one_of(f"study.{key}", env, SCRATCH_ENVS)
    check_one_of("study.pretrained_env", self.pretrained_env, PRETRAINED_ENVS)
    for arm in self.collapse_arms.split(","):
      check_one_of("study.collapse_arms", arm, COLLAPSE_ARMS)
    for key in ("filter_seeds", "correlation_seeds", "collapse_seeds", "pretrained_seeds", "bootstrap"):
      check(f"study.{key}", getattr(self, key) >= 1, "must be >= 1", getattr(self, key))
    if self.only:  # each a setting of a chosen sub-study
      every = dataclasses.replace(self, only="")
      chosen = {run.setting: None for name in self.study_names for run in study_runs(every, name)}
      for setting in self.only.split(","):
        check_one_of("study.only", setting, chosen)

  @property
  def study_names(self) -> list[str]:
    return self.names.split(",")


@dataclasses.dataclass(frozen=True)
class Run:
  """One RL run of a sub-study: its file name, environment, setting name, RL seed and config overrides, and the
  warm start it starts from: "demo" (the demo's scratch model), "pretrained" (`model.path` fine-tuned) or another
  name (the demo's SFT, its `demo` settings from the overrides). `reference`: if set, the `demo` overrides (over
  the run's) of a second warm start of that kind, the KL loss's reference (`model.reference_path`)."""
  name: str
  env: str
  setting: str
  seed: int
  overrides: dict
  warm_start: str = "demo"
  reference: dict | None = None


def _grid(env_names, settings: dict, seeds: int, only: str, warm_start: str = "demo",
          reference: dict | None = None) -> list[Run]:
  chosen = set(only.split(",")) if only else set(settings)
  return [Run(f"{env}-{setting}-s{seed}", env, setting, seed, overrides, warm_start, reference) for env in env_names
          for seed in range(seeds) for setting, overrides in settings.items() if setting in chosen]


def study_runs(study: StudyConfig, name: str) -> list[Run]:
  """The runs of sub-study `name`."""
  if name == "filter":
    return _grid(study.filter_envs.split(","), FILTER_SETTINGS, study.filter_seeds, study.only)
  if name == "correlation":
    return _grid([study.correlation_env], CORRELATION_SETTINGS, study.correlation_seeds, study.only)
  if name == "pretrained":
    settings = {PRETRAINED_SETTING: PRETRAINED | PRETRAINED_ENVS[study.pretrained_env]
                | {"model.path": study.pretrained_model}}
    return _grid([study.pretrained_env], settings, study.pretrained_seeds, study.only, "pretrained")
  chosen = study.collapse_arms.split(",")
  return [run for name, arm in COLLAPSE_ARMS.items() if name in chosen
          for run in _grid([study.collapse_env], arm.settings, study.collapse_seeds, study.only, arm.warm_start,
                           arm.reference)]
