"""The learn phase: loss aggregation across micro-batches and filter loss scaling on hand cases, and the guard
that never applies a non-finite update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.mesh import batch_sharding, make_mesh, replicated, rows_per_step
from ragen_jax.models import ModelConfig, init_params
from ragen_jax.rl.losses import aggregate
from ragen_jax.rl.presets import preset
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.rl import update as update_lib
from ragen_jax.rl.update import UpdateConfig, init_train_state, learn, micro_batch_weights, score
from tests.diagnostics.batch_fixtures import make_batch, random_episodes

# Three micro-batches of two episodes: per-token losses of the masked tokens (the third micro-batch was filtered).
#   micro 0: [1, 2, 3] and [4]   token-mean 10/4 = 2.5   sequence means (2 + 4)/2 = 3   sequence sums (6 + 4)/2 = 5
#   micro 1: [10] and nothing    token-mean 10           sequence means 10              sequence sums 10
# Over the mini-batch: token-mean 20/5 = 4, seq-mean-token-mean (2 + 4 + 10)/3, seq-mean-token-sum (6 + 4 + 10)/3;
# the reference's mean of the two micro-batches' aggregates: (2.5 + 10)/2, (3 + 10)/2, (5 + 10)/2.
LOSS_MBT = np.zeros((3, 2, 4))
LOSS_MBT[0, 0, :3], LOSS_MBT[0, 1, 0], LOSS_MBT[1, 0, 0] = [1.0, 2.0, 3.0], 4.0, 10.0
MASK_MBT = LOSS_MBT > 0


@pytest.mark.parametrize("agg,mini_batch,micro_batch", [("token-mean", 4.0, 6.25),
                                                        ("seq-mean-token-mean", 16 / 3, 6.5),
                                                        ("seq-mean-token-sum", 20 / 3, 7.5)])
def test_mini_batch_aggregate_and_mean_of_micro_batch_aggregates(agg, mini_batch, micro_batch):
  for scope, want in (("mini_batch", mini_batch), ("micro_batch", micro_batch)):
    actor_M, value_M = micro_batch_weights(jnp.asarray(MASK_MBT), agg, scope)
    micro_M = [float(aggregate(jnp.asarray(LOSS_MBT[m]), jnp.asarray(MASK_MBT[m]), agg)) for m in range(3)]
    np.testing.assert_allclose(float(jnp.dot(actor_M, jnp.asarray(micro_M))), want, rtol=1e-6, err_msg=scope)
    # the critic's loss is a token-mean
    np.testing.assert_allclose(value_M, [0.8, 0.2, 0.0] if scope == "mini_batch" else [0.5, 0.5, 0.0], rtol=1e-6)
  for scope in ("mini_batch", "micro_batch"):  # nothing kept: every weight 0
    assert not np.any(np.asarray(micro_batch_weights(jnp.zeros((3, 2, 4), bool), agg, scope)))


CONFIG = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=2,
                     head_dim=16)
GROUPS, GROUP_SIZE, TURNS = 4, 4, 2


@pytest.fixture(scope="module")
def setup():
  """A tiny policy, a batch of episodes of different lengths, its scores, GRPO advantages per episode, token
  counts and per-token entropies."""
  params = init_params(CONFIG, jax.random.key(0))
  batch = make_batch(random_episodes(np.random.default_rng(0), GROUPS, GROUP_SIZE, TURNS, vocab=32), 48, TURNS)
  cfg = UpdateConfig(algorithm=preset("dapo"), filter=FilterConfig(enabled=False), num_groups=GROUPS,
                     group_size=GROUP_SIZE, mini_batch_size=GROUPS * GROUP_SIZE, micro_batch_size=1)
  scores = score(CONFIG, cfg, init_train_state(cfg, params, jax.random.key(1)), None, batch)
  r_GS = np.asarray(batch.score, np.float64).reshape(GROUPS, GROUP_SIZE)
  adv_B = ((r_GS - r_GS.mean(1, keepdims=True)) / (r_GS.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
  mask = np.asarray(batch.loss_mask)
  tokens_B = mask.sum(1)
  entropy_B = np.where(mask, np.asarray(scores["entropy"], np.float64), 0.0).sum(1)  # per-episode sums
  assert len(set(tokens_B)) > 2  # episodes of different lengths
  return params, batch, cfg, scores, adv_B, tokens_B, entropy_B, r_GS.var(1, ddof=1)


def test_scoring_steps_spread_over_the_batch_shards_and_score_alike(setup):
  """Micro-batches of one episode on 8 devices: each step scores 8 of them, one per device (a one-row step would be
  computed on every device over again); the scores equal those of one device."""
  params, batch, cfg, scores = setup[:4]
  assert rows_per_step(1, 16) == 1  # no mesh in context
  mesh = make_mesh(8, 1, 1)
  state = jax.device_put(init_train_state(cfg, params, jax.random.key(1)), replicated(mesh))
  batch = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim)), batch)
  with jax.set_mesh(mesh):
    assert (rows_per_step(1, 16), rows_per_step(2, 16), rows_per_step(16, 16)) == (8, 8, 16)
    assert rows_per_step(3, 18) == 3  # 24 rows do not divide 18: micro-batches of 3
    sharded = score(CONFIG, cfg, state, None, batch)
  assert sharded.keys() == scores.keys()
  for key in scores:
    np.testing.assert_allclose(np.asarray(sharded[key]), np.asarray(scores[key]), rtol=1e-5, atol=1e-6, err_msg=key)


def run_learn(setup, **changes):
  params, batch, cfg, scores = setup[:4]
  algorithm = dataclasses.replace(cfg.algorithm, loss_agg_scope=changes.pop("scope", "mini_batch"))
  cfg = dataclasses.replace(cfg, algorithm=algorithm, **changes)
  state = init_train_state(cfg, jax.tree.map(jnp.copy, params), jax.random.key(1))
  _, metrics = learn(CONFIG, cfg, state, batch, scores)
  return {k: float(v) for k, v in metrics.items()}


def test_token_mean_over_the_mini_batch_or_mean_over_micro_batches_of_one_episode(setup):
  _, _, _, _, adv_B, tokens_B, entropy_B, _ = setup
  # ratio 1 (old log-probs are the policy's): the per-token policy loss is −A
  exact = run_learn(setup)
  np.testing.assert_allclose(exact["pg_loss"], -np.sum(tokens_B * adv_B) / tokens_B.sum(), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(exact["entropy"], entropy_B.sum() / tokens_B.sum(), rtol=1e-5)
  # micro-batches of one episode (the reference's default): the token-mean becomes a mean over sequences
  reference = run_learn(setup, scope="micro_batch")
  np.testing.assert_allclose(reference["pg_loss"], -np.mean(adv_B), atol=1e-5)  # GRPO advantages sum to 0 per group
  np.testing.assert_allclose(reference["entropy"], np.mean(entropy_B / tokens_B), rtol=1e-5)
  assert abs(exact["pg_loss"]) > 1e-2


def test_micro_batch_mean_counts_only_micro_batches_with_kept_episodes(setup):
  _, batch, _, _, adv_B, tokens_B, entropy_B, var_G = setup
  kept_B = np.isin(np.asarray(batch.group_ids), np.argsort(-var_G)[:2])  # top_k_abs 2: the two largest variances
  two_groups = FilterConfig(strategy="top_k_abs", value=2.0)
  reference = run_learn(setup, scope="micro_batch", filter=two_groups)
  assert reference["filter_kept_count"] == 2
  np.testing.assert_allclose(reference["entropy"], np.mean((entropy_B / tokens_B)[kept_B]), rtol=1e-5)
  # linear loss scaling multiplies the advantages by the kept ratio: the policy loss halves, the entropy does not
  scaled = run_learn(setup, filter=dataclasses.replace(two_groups, loss_scaling="linear"))
  kept_tokens = tokens_B[kept_B].sum()
  np.testing.assert_allclose(scaled["pg_loss"], -0.5 * np.sum((tokens_B * adv_B)[kept_B]) / kept_tokens, rtol=1e-4,
                             atol=1e-6)
  np.testing.assert_allclose(scaled["entropy"], entropy_B[kept_B].sum() / kept_tokens, rtol=1e-5)


def test_rejected_tail_counts_rejections_after_the_last_applied_step():
  cases = [([1, 0, 0, 0], [0, 1, 0, 1], 2),  # a step with nothing kept (neither) does not end the streak
           ([0, 0, 0], [1, 1, 1], 3),  # none applied: every rejection
           ([0, 1, 0], [1, 0, 0], 0),
           ([0, 0], [0, 0], 0)]
  for applied, rejected, want in cases:
    assert int(update_lib.rejected_tail(jnp.asarray(applied, jnp.float32), jnp.asarray(rejected, jnp.float32))) == want


@pytest.mark.parametrize("poison", ["score", "old_logp"])
def test_a_non_finite_loss_is_never_applied(setup, poison):
  params, batch, cfg, scores = setup[:4]
  cfg = dataclasses.replace(cfg, mini_batch_size=GROUPS * GROUP_SIZE // 2)  # two optimizer steps
  if poison == "score":  # a NaN reward in every group: NaN advantages everywhere
    batch = batch.replace(score=jnp.asarray(batch.score).at[::GROUP_SIZE].set(jnp.nan))
  else:  # one episode's old log-probs are NaN: only the step that holds it is poisoned
    scores = scores | {"old_logp": jnp.asarray(scores["old_logp"]).at[3].set(jnp.nan)}
  state = init_train_state(cfg, jax.tree.map(jnp.copy, params), jax.random.key(1))
  before = jax.device_get((state.policy, state.policy_opt))
  state, metrics = learn(CONFIG, cfg, state, batch, scores)
  metrics = {k: float(v) for k, v in metrics.items()}
  after = jax.device_get((state.policy, state.policy_opt))
  want_rejected = 2 if poison == "score" else 1
  assert metrics["rejected_updates"] == want_rejected and metrics["num_updates"] == 2 - want_rejected
  assert not np.isfinite(metrics["pg_loss"])  # the iteration's loss shows what happened
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(after))
  if poison == "score":  # nothing applied: weights and optimizer state exactly as before
    assert metrics["rejected_tail"] == 2
    for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
      np.testing.assert_array_equal(x, y)
  else:  # the finite step was applied
    assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before[0]), jax.tree.leaves(after[0])))
