"""Pieces shared by the device and host rollout paths: settings, assets, acting on parsed answers."""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from envs import text as env_text
from ragen_jax.config import check, check_one_of
from ragen_jax.rollout import prompt
from ragen_jax.sampling import SamplingRule, stop_sequence_array


CONTEXT_MODES = ("full", "limited_multi_turn", "single_turn")
SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """The `rollout` config section (SPEC §2); static under jit."""

  max_turns: int = 5
  max_new_tokens: int = 400
  max_actions_per_turn: int = 2
  max_actions_per_traj: int = 10
  format_penalty: float = -0.1
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  val_temperature: float = 0.5  # validation samples at this temperature, without top-k / top-p
  context_window_mode: str = "full"  # full | limited_multi_turn | single_turn
  max_context_window: int = 2  # turns kept by limited_multi_turn, the current one included
  max_model_len: int = 4096  # prompt + reply budget of a turn; older turns are dropped past it; 0: no limit
  max_episode_len: int = 4096  # training sequence length of host text-environment episodes
  enable_think: bool = True  # answer grammar (envs.text): think block then answer; False: first answer block

  def __post_init__(self):
    for name in ("max_turns", "max_new_tokens", "max_actions_per_turn", "max_actions_per_traj", "max_episode_len"):
      check(f"rollout.{name}", getattr(self, name) >= 1, "must be >= 1", getattr(self, name))
    check_one_of("rollout.context_window_mode", self.context_window_mode, CONTEXT_MODES)
    limited = self.context_window_mode == "limited_multi_turn"
    check("rollout.max_context_window", not limited or self.max_context_window >= 1,
          "limited_multi_turn needs a window of >= 1 turn", self.max_context_window)
    check("rollout.max_model_len", self.max_model_len >= 0, "must be >= 0 (0: no limit)", self.max_model_len)
    for name in ("temperature", "val_temperature"):
      check(f"rollout.{name}", getattr(self, name) >= 0, "must be >= 0 (0: greedy)", getattr(self, name))
    check("rollout.top_k", self.top_k >= 0, "must be >= 0 (0: off)", self.top_k)
    check("rollout.top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]", self.top_p)

  @property
  def rule(self) -> SamplingRule:
    return SamplingRule(self.temperature, self.top_k, self.top_p)

  @property
  def context_turns(self) -> int:
    """Turns a prompt keeps (the current one included); 0: all."""
    return {"full": 0, "single_turn": 1, "limited_multi_turn": self.max_context_window}[self.context_window_mode]

  def for_split(self, split: str) -> RolloutConfig:
    """The settings a `split` rollout samples with: validation at `val_temperature`, no top-k / top-p."""
    check_one_of("split", split, SPLITS)
    if split == "train":
      return self
    return dataclasses.replace(self, temperature=self.val_temperature, top_k=0, top_p=1.0)


def visible_from(config: RolloutConfig, turn, turn_tokens_K, chunk_tokens, system_tokens) -> jax.Array:
  """Jittable, one episode: the oldest turn segment (turn k is segment k + 1) that turn
  `turn`'s prompt and reply still see (the system prompt is always kept).

  turn_tokens_K: tokens of each earlier turn (prompt chunk without the system prompt, plus
  reply); entries from `turn` on are ignored. chunk_tokens: the new turn's prompt chunk.
  Turns are dropped oldest first to keep the last `context_turns` turns and to fit the
  system prompt, the kept turns and a full reply budget into `max_model_len` (when
  even the current turn alone does not fit, only it is kept).
  """
  first_kept = jnp.zeros((), jnp.int32)
  if config.context_turns:
    first_kept = jnp.maximum(turn + 1 - config.context_turns, 0)
  if config.max_model_len:
    k = jnp.arange(turn_tokens_K.shape[0])
    kept_K = jnp.sum(jnp.where((k[None, :] >= k[:, None]) & (k[None, :] < turn), turn_tokens_K[None, :], 0), axis=1)
    fits_K = (system_tokens + kept_K + chunk_tokens + config.max_new_tokens <= config.max_model_len) & (k <= turn)
    first_kept = jnp.maximum(first_kept, jnp.where(jnp.any(fits_K), jnp.argmax(fits_K), turn))
  return (first_kept + 1).astype(jnp.int32)


@flax.struct.dataclass
class RolloutAssets:
  """Device tables for one (tokenizer, environment) pair, built once on the host."""

  turns: prompt.TurnTables
  observation: env_text.TextTable
  vocab: env_text.VocabTable
  stop_sequences: jax.Array  # int32[M, L], see sampling.stop_sequence_array


def build_assets(tokenizer, env, env_params, config: RolloutConfig, table_size: int | None = None) -> RolloutAssets:
  """Tokenises prompts, observations and stop sequences for `env` (host, once)."""
  vocab = env_text.Vocab(tokenizer, table_size=table_size)
  pieces = prompt.ChatPieces.from_tokenizer(tokenizer)
  system = prompt.system_text(env.instruction_text(env_params, config.max_actions_per_traj))
  turns = prompt.build_turn_tables(vocab, pieces, system, config.max_turns, config.max_actions_per_traj,
                                   config.max_new_tokens)
  stops = stop_sequence_array([vocab.encode(env_text.ANSWER_CLOSE)])
  return RolloutAssets(turns=turns, observation=env.token_table(vocab, env_params), vocab=vocab.table,
                       stop_sequences=jnp.asarray(stops))


@functools.partial(jax.jit, static_argnames=("enable_think",))
def reasoning_lengths(vocab: env_text.VocabTable, ids_BN, lengths_B, enable_think: bool) -> jax.Array:
  """int32[B]: reasoning tokens of each reply (ids_BN[:lengths_B]) under the answer grammar
  (`envs.text.reasoning_length`); the reasoning length of every rollout path."""
  return env_text.reasoning_lengths(vocab, ids_BN, lengths_B, enable_think)


@flax.struct.dataclass
class TurnOutcome:
  """Per-row results of acting on one turn's replies."""

  env_state: object
  reward: jax.Array          # float32[B] env rewards + format penalty
  format_ok: jax.Array       # bool[B]
  num_actions: jax.Array     # int32[B] executed this turn
  done: jax.Array            # bool[B]
  actions_left: jax.Array    # int32[B]


def act(env, env_params, assets: RolloutAssets, config: RolloutConfig, key, env_state, replies_BN, lengths_B,
        active_B, actions_left_B) -> TurnOutcome:
  """Jittable: parses each active row's reply and steps its env with its recognised actions (at most
  `max_actions_per_turn`, within the trajectory's action budget), also in a turn that gets the format penalty."""
  names_BAL, names_len_BA = jax.vmap(lambda s: env.action_name_table(s, env_params))(env_state)
  parsed = env_text.parse_replies(assets.vocab, replies_BN, lengths_B, names_BAL, names_len_BA,
                                  config.max_actions_per_turn, env.keep_unknown_actions, config.enable_think)
  format_ok = parsed.valid & active_B
  reward = jnp.where(active_B & ~parsed.valid, config.format_penalty, 0.0).astype(jnp.float32)
  done = ~active_B
  executed = jnp.zeros_like(actions_left_B)
  step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
  for a in range(config.max_actions_per_turn):
    apply = (a < parsed.n_actions) & ~done & (actions_left_B - executed > 0)
    keys = jax.random.split(jax.random.fold_in(key, a), active_B.shape[0])
    _, stepped, r, step_done, _ = step(keys, env_state, parsed.actions_K[:, a], env_params)
    env_state = jax.tree.map(lambda new, old: jnp.where(_expand(apply, new), new, old), stepped, env_state)
    reward += jnp.where(apply, r, 0.0)
    done |= apply & step_done
    executed += apply
  actions_left = actions_left_B - executed
  return TurnOutcome(env_state=env_state, reward=reward, format_ok=format_ok, num_actions=executed,
                     done=done | (actions_left <= 0),
                     actions_left=actions_left)


def _expand(mask_B, like):
  return mask_B.reshape(mask_B.shape + (1,) * (like.ndim - 1))


def train_seeds(iteration: int, num_groups: int, group_size: int, base: int = 10000) -> np.ndarray:
  """Env seeds [G*S] of a training iteration: group g gets base + G*t + g (SPEC §2), shared in the group."""
  return np.repeat(base + num_groups * iteration + np.arange(num_groups), group_size).astype(np.int32)


def seed_keys(seeds_B) -> jax.Array:
  """Jittable: env reset keys from integer seeds."""
  return jax.vmap(jax.random.key)(seeds_B.astype(jnp.uint32))


@functools.partial(jax.jit, static_argnames=("env",))
def reset_batch(env, env_params, seeds_B):
  """Env states [B] of new episodes with the given seeds."""
  return jax.vmap(env.reset, in_axes=(0, None))(seed_keys(seeds_B), env_params)[1]


@functools.partial(jax.jit, static_argnames=("env",))
def render_batch(env, env_params, observation_table, state_B):
  """Observations of a batch of states as (ids int32[B, O], lengths int32[B])."""
  return jax.vmap(lambda s: env.render_tokens(s, env_params, observation_table))(state_B)


def unbatch(state_B, index: int):
  """The index-th state of a batched env state (host)."""
  return jax.tree.map(lambda x: x[index], state_B)
