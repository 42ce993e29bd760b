"""Supervised fine-tuning on demonstration conversations (the demo's warm start)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ragen_jax import mesh as mesh_lib
from ragen_jax.models.config import ModelConfig
from ragen_jax.scoring import masked_mean, token_logp_and_entropy


def sft_loss(config: ModelConfig, params, tokens_BT, valid_BT, loss_mask_BT):
  """Mean negative log-likelihood of the masked (assistant) tokens."""
  logp, _ = token_logp_and_entropy(config, params, tokens_BT, valid_BT)
  return -masked_mean(logp, loss_mask_BT)


def make_sft_step(config: ModelConfig, tx: optax.GradientTransformation):
  """Jitted `step(params, opt_state, tokens, valid, loss_mask) -> (params, opt_state, loss)`."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens_BT, valid_BT, loss_mask_BT):
    loss, grads = jax.value_and_grad(sft_loss, argnums=1)(config, params, tokens_BT, valid_BT, loss_mask_BT)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def pack_examples(examples, seq_len: int):
  """(tokens, valid, loss_mask) arrays [N, seq_len] from (token list, loss-mask list) pairs."""
  tokens = np.zeros((len(examples), seq_len), np.int32)
  valid = np.zeros((len(examples), seq_len), bool)
  mask = np.zeros((len(examples), seq_len), bool)
  for i, (ids, loss) in enumerate(examples):
    if len(ids) > seq_len:
      raise ValueError(f"example {i} has {len(ids)} tokens, more than seq_len={seq_len}")
    tokens[i, :len(ids)], valid[i, :len(ids)], mask[i, :len(ids)] = ids, True, loss
  return tokens, valid, mask


def lr_schedule(lr: float, steps: int, warmup_steps: int = 0, decay_steps: int | None = None) -> optax.Schedule:
  """Linear warm-up over `warmup_steps`, constant `lr`, then cosine decay to lr / 10 over the last
  `decay_steps` (None: every step after the warm-up decays)."""
  decay_steps = steps - warmup_steps if decay_steps is None else decay_steps
  if not 0 <= warmup_steps <= steps - decay_steps or decay_steps < 0:
    raise ValueError(f"warmup_steps={warmup_steps} and decay_steps={decay_steps} do not fit in {steps} steps")
  constant_until = steps - decay_steps
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps), optax.constant_schedule(lr),
                               optax.cosine_decay_schedule(lr, max(decay_steps, 1), 0.1)],
                              [warmup_steps, constant_until])


def length_classes(valid_NT, length_bucket: int | None) -> np.ndarray:
  """int[N]: each example's padded length, its token count rounded up to a multiple of `length_bucket`
  (at most the row width T); None: every example is padded to T."""
  width = valid_NT.shape[1]
  if length_bucket is None:
    return np.full(len(valid_NT), width)
  return np.minimum(-(-valid_NT.sum(axis=1) // length_bucket) * length_bucket, width)


def fit(config: ModelConfig, params, stages, *, batch_size: int, schedule: optax.Schedule, seed: int = 0,
        length_bucket: int | None = None, on_step=None, progress: bool = False):
  """Trains `params` with AdamW at the learning rates of `schedule` (e.g. `lr_schedule`, counted over all
  steps) on each stage in turn; `stages` lists (examples, seq_len, steps) and one optimizer state runs
  through them. Returns (params, last loss).

  With `length_bucket`, each batch holds examples of one `length_classes` class, padded to that length
  only: a step on short examples costs what they cost (one compilation per class). Each step picks the
  class of a uniformly drawn example, so every example is still drawn equally often on average.
  """
  from tqdm.auto import tqdm
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
  opt_state = tx.init(params)
  mesh = getattr(jax.tree.leaves(params)[0].sharding, "mesh", None)
  if mesh is not None:  # fresh counters onto the params' mesh, where the step returns them: the step compiles once
    opt_state = mesh_lib.put_replicated_if_elsewhere(opt_state, mesh)
  step_fn = make_sft_step(config, tx)
  rng = np.random.default_rng(seed)
  loss, step = jnp.nan, 0
  bar = tqdm(total=sum(steps for *_, steps in stages), desc="sft", disable=not progress, dynamic_ncols=True)
  for examples, seq_len, steps in stages:
    tokens, valid, mask = pack_examples(examples, seq_len)
    classes = length_classes(valid, length_bucket)
    members_of = {width: np.flatnonzero(classes == width) for width in np.unique(classes)}
    for _ in range(steps):
      width = seq_len if length_bucket is None else classes[rng.integers(len(examples))]
      members = members_of[width]
      idx = rng.choice(members, size=batch_size, replace=len(members) < batch_size)
      params, opt_state, loss = step_fn(params, opt_state, tokens[idx, :width], valid[idx, :width],
                                        mask[idx, :width])
      if on_step is not None:
        on_step(step, loss)
      step += 1
      bar.update()
      if progress and step % 10 == 0:
        bar.set_postfix(loss=f"{float(loss):.3f}", refresh=False)
  bar.close()
  return params, float(loss)
