"""Collapse diagnostics end to end: synthetic collapse on trained/constructed tiny policies,
compute_freq and EMA state, entropies, the update-step hook and per-bucket gradient norms."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from ragen_jax.diagnostics import ZscoreEMA, update_zscore_ema
from ragen_jax.diagnostics.collapse import (CollapseConfig, init_diagnostics_state, make_diagnostics_fn,
                                            make_grad_analysis_fn, without_skipped)
from ragen_jax.models import ModelConfig, init_params
from ragen_jax.rl.losses import PolicyLossConfig, actor_loss
from ragen_jax.rl.presets import preset
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.rl.update import UpdateConfig, init_train_state, update
from ragen_jax.scoring import token_logp_and_entropy
from tests.diagnostics.batch_fixtures import CLOSE, THINK, Episode, Turn, make_batch, random_episodes

CONFIG = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=4, head_dim=16)
GROUPS, GROUP_SIZE, CONTENT = 4, 4, 3
SEQ_LEN, TURNS = 64, 3  # one batch shape for every diagnostics call: one compile
forward = jax.jit(lambda params, tokens, valid: token_logp_and_entropy(CONFIG, params, tokens, valid))
DIAG = CollapseConfig(compute_freq=2, num_samples=16, max_reasoning_tokens=8, block_tokens=2, columns_per_step=2,
                      rows_per_step=4)


def copy_task(key, n):
  """Two-turn episodes whose reasoning repeats the content just before `<think>`."""
  a_key, b_key = jax.random.split(key)
  a, b = jax.random.randint(a_key, (n, CONTENT), 4, 32), jax.random.randint(b_key, (n, CONTENT), 4, 32)
  col = lambda t: jnp.full((n, 1), t)  # noqa: E731
  tokens = jnp.concatenate([col(1), a, col(THINK), a, col(CLOSE), b, col(THINK), b, col(CLOSE)], axis=1)
  reply = np.zeros(tokens.shape[1], bool)
  reply[CONTENT + 2:2 * CONTENT + 3] = reply[3 * CONTENT + 4:] = True
  return tokens, jnp.broadcast_to(jnp.asarray(reply), tokens.shape)


@pytest.fixture(scope="module")
def copying_params():
  """A tiny policy trained to copy (loss ≈ 0.01 nats/token after 100 Adam steps)."""
  tx = optax.adam(3e-3)

  def step(carry, key):
    params, opt_state = carry
    tokens, reply = copy_task(key, 64)

    def loss(p):
      logp, _ = token_logp_and_entropy(CONFIG, p, tokens, jnp.ones(tokens.shape, bool))
      return -jnp.sum(jnp.where(reply, logp, 0.0)) / jnp.sum(reply)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), value

  @jax.jit
  def train(params):
    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), jax.random.split(jax.random.key(0), 100))
    return params, losses[-1]

  params, final_loss = train(init_params(CONFIG, jax.random.key(0)))
  assert float(final_loss) < 0.05
  return params


def copying_episodes(rng):
  """What the copying policy writes: groups share the first content, the second is per episode."""
  episodes = []
  for g in range(GROUPS):
    first = rng.integers(4, 32, CONTENT).tolist()
    for _ in range(GROUP_SIZE):
      second = rng.integers(4, 32, CONTENT).tolist()
      episodes.append(Episode(g, [1] + first, [Turn(first, []), Turn(second, [])], [second], score=float(rng.random())))
  return episodes


@pytest.fixture(scope="module")
def diagnostics():
  return jax.jit(functools.partial(make_diagnostics_fn(DIAG, GROUPS, GROUP_SIZE), CONFIG))


def initial_state(params):
  """`init_diagnostics_state` placed as the jitted step returns it (so the step compiles once)."""
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  return jax.device_put(init_diagnostics_state(DIAG), NamedSharding(mesh, PartitionSpec()))


def run(diagnostics, params, batch, state=None, key=0):
  logp, entropy = forward(params, batch.tokens, batch.valid)
  return diagnostics(params, state or initial_state(params), batch, logp, entropy, jax.random.key(key))


def ideal_mi(episodes, draws):
  """mean_r log(N / #columns with r's prompt): the MI of a policy that tells prompts apart perfectly."""
  prompts = [tuple(episodes[b].turn_texts()[k][0]) for b, k in draws]
  return float(np.mean([math.log(len(prompts) / prompts.count(p)) for p in prompts]))


def test_copying_policy_has_mi_near_log_n_and_retrieves_its_prompt(diagnostics, copying_params):
  episodes = copying_episodes(np.random.default_rng(0))
  batch = make_batch(episodes, SEQ_LEN, TURNS)
  _, metrics = run(diagnostics, copying_params, batch)
  m = {k: float(v) for k, v in metrics.items()}
  assert m["collapse/computed"] == 1.0 and m["collapse/valid_thinking_rate"] == 1.0
  for variant in ("first_turn", "trajectory"):
    assert m[f"collapse/{variant}/num_rows"] == 16 and m[f"collapse/{variant}/retrieval_accuracy"] == 1.0
    assert m[f"collapse/{variant}/matched_logp_gap"] < 1e-4
  # Summed log-probs: MI near log N; per token (paper marginal) the same spread over the 3 tokens.
  assert math.log(GROUPS) - 0.1 < m["collapse/first_turn/mi_estimate_seq"] <= math.log(GROUPS) + 1e-6
  assert m["collapse/first_turn/mi_estimate"] == pytest.approx(m["collapse/first_turn/mi_estimate_seq"] / CONTENT)
  # Trajectory columns repeat when two draws share a prompt; the ideal accounts for that.
  ideal = ideal_mi(episodes, trajectory_draws(batch, key=0))
  assert ideal > 2.0 and m["collapse/trajectory/mi_estimate_seq"] == pytest.approx(ideal, abs=0.1)


def trajectory_draws(batch, key):
  """The trajectory variant's draws for `run(..., key=key)` (same key split as the diagnostics)."""
  from ragen_jax.diagnostics.cross_scoring import trajectory_pairs
  variant_key = jax.random.split(jax.random.key(key), len(DIAG.variants))[DIAG.variants.index("trajectory")]
  pairs = trajectory_pairs(batch, DIAG.num_samples, variant_key, batch.seq_len)
  return list(zip(np.asarray(pairs.row_episode).tolist(), np.asarray(pairs.row_turn).tolist()))


def test_policy_that_ignores_the_prompt_has_zero_mi_and_chance_retrieval(diagnostics, copying_params):
  # No attention or MLP output: each token's logits depend on that token alone.
  silenced = {**copying_params["layers"], "o_proj": jax.tree.map(jnp.zeros_like, copying_params["layers"]["o_proj"]),
              "down_proj": jax.tree.map(jnp.zeros_like, copying_params["layers"]["down_proj"])}
  blind = {**copying_params, "layers": silenced}
  batch = make_batch(copying_episodes(np.random.default_rng(1)), SEQ_LEN, TURNS)
  _, metrics = run(diagnostics, blind, batch)
  m = {k: float(v) for k, v in metrics.items()}
  for variant in ("first_turn", "trajectory"):
    for suffix in ("", "_seq"):
      assert abs(m[f"collapse/{variant}/mi_estimate{suffix}"]) < 1e-5
  # All columns tie; ties go to column 0, which holds a quarter of the rows: chance exactly.
  assert m["collapse/first_turn/retrieval_accuracy"] == pytest.approx(m["collapse/first_turn/retrieval_chance_level"])
  assert m["collapse/first_turn/retrieval_chance_level"] == pytest.approx(1 / GROUPS)


def test_compute_freq_skips_with_zeros_the_trainer_drops_and_keeps_the_ema(diagnostics, copying_params):
  params = copying_params  # any policy; this one is already placed like the other tests' (no recompile)
  batch = make_batch(random_episodes(np.random.default_rng(2), GROUPS, GROUP_SIZE, TURNS, vocab=32), SEQ_LEN, TURNS)
  state = initial_state(params)
  computed, ema = [], {k: ZscoreEMA.init() for k in state["zscore_ema"]}
  for step in range(3):
    state, metrics = run(diagnostics, params, batch, state, key=step)
    assert int(state["step"]) == step + 1
    computed.append(float(metrics["collapse/computed"]))
    if step == 1:
      mi = {k: float(v) for k, v in metrics.items() if k.startswith("collapse/first_turn") or
            k.startswith("collapse/trajectory")}
      assert set(mi.values()) == {0.0}
      # what the trainer logs: the entropies, not the MI placeholders
      logged = without_skipped({k: float(v) for k, v in metrics.items()}, DIAG)
      assert set(logged) == set(metrics) - set(mi) and "collapse/reasoning_token_entropy" in logged
    else:
      assert without_skipped(metrics, DIAG) == metrics
      for key in ema:  # "<variant>" or "<variant>_seq"
        variant, family = key.removesuffix("_seq"), key[len(key.removesuffix("_seq")):]
        name = lambda metric: f"collapse/{variant}/{metric}{family}"  # noqa: E731
        ema[key], want = update_zscore_ema(ema[key], metrics[name("mi_estimate")], metrics[name("marginal_std")],
                                           DIAG.ema_decay)
        np.testing.assert_allclose(float(metrics[name("mi_zscore_ema")]), float(want), rtol=1e-6)
    for key in ema:
      np.testing.assert_allclose(float(state["zscore_ema"][key].marginal_std), float(ema[key].marginal_std), rtol=1e-6)
      assert int(state["zscore_ema"][key].steps) == int(ema[key].steps)
  assert computed == [1.0, 0.0, 1.0]
  assert int(state["zscore_ema"]["trajectory"].steps) == 2


def test_entropies_and_valid_thinking_rate(diagnostics, copying_params):
  params = copying_params
  episodes = random_episodes(np.random.default_rng(3), GROUPS, GROUP_SIZE, TURNS, vocab=32, open_share=0.3)
  batch = make_batch(episodes, SEQ_LEN, TURNS)
  _, metrics = run(diagnostics, params, batch)
  _, entropy = forward(params, batch.tokens, batch.valid)
  entropy = np.asarray(entropy)
  reasoning, response = [], []
  for b, episode in enumerate(episodes):  # positions from the episode lists, not from the packed fields
    for prompt, thought in episode.turn_texts():
      reasoning += [entropy[b, len(prompt) + i] for i in range(len(thought))]
  response = entropy[np.asarray(batch.loss_mask)]
  turns = [t for e in episodes for t in e.turn_texts()]
  np.testing.assert_allclose(float(metrics["collapse/reasoning_token_entropy"]), np.mean(reasoning), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["collapse/response_token_entropy"]), np.mean(response), rtol=1e-5)
  assert float(metrics["collapse/valid_thinking_rate"]) == pytest.approx(np.mean([bool(z) for _, z in turns]))


def test_diagnostics_plug_into_the_update_step(copying_params):
  params = copying_params
  batch = make_batch(random_episodes(np.random.default_rng(4), GROUPS, GROUP_SIZE, TURNS, vocab=32), SEQ_LEN, TURNS)
  cfg = UpdateConfig(algorithm=preset("grpo"), filter=FilterConfig(), num_groups=GROUPS, group_size=GROUP_SIZE,
                     mini_batch_size=8, micro_batch_size=4,
                     diagnostics_fn=make_diagnostics_fn(DIAG, GROUPS, GROUP_SIZE))
  state = init_train_state(cfg, params, jax.random.key(0), diagnostics=init_diagnostics_state(DIAG))
  # traces the whole step, compiles nothing
  new_state, metrics = jax.eval_shape(functools.partial(update, CONFIG, cfg), state, params, batch)
  assert jax.tree.structure(new_state.diagnostics) == jax.tree.structure(state.diagnostics)
  assert {"collapse/computed", "collapse/first_turn/mi_zscore_ema_seq", "collapse/trajectory/retrieval_accuracy",
          "collapse/reasoning_token_entropy", "policy_entropy"} <= set(metrics)
  assert make_diagnostics_fn(dataclasses.replace(DIAG, enabled=False), GROUPS, GROUP_SIZE) is None


def test_grad_analysis_matches_gradients_of_each_bucket_alone(copying_params):
  params = copying_params
  rng = np.random.default_rng(5)
  episodes = random_episodes(rng, GROUPS, GROUP_SIZE, TURNS, vocab=32)
  batch = make_batch(episodes, SEQ_LEN, TURNS)
  mask = batch.loss_mask
  logp, _ = forward(params, batch.tokens, batch.valid)
  old_logp = jnp.where(mask, logp + 0.3 * rng.normal(size=mask.shape), 0.0)
  ref_logp = jnp.where(mask, logp + 0.2 * rng.normal(size=mask.shape), 0.0)
  advantages = jnp.where(mask, jnp.asarray(rng.normal(size=mask.shape)), 0.0)
  scores = jnp.asarray([0.5, 0.1, 0.9, 0.3])
  loss_cfg = PolicyLossConfig(agg="seq-mean-token-mean", use_kl_loss=True, kl_coef=0.05, entropy_coef=0.01)
  cfg = dataclasses.replace(DIAG, grad_analysis=True, num_buckets=2, compute_freq=2)
  analyse = jax.jit(functools.partial(make_grad_analysis_fn(cfg, loss_cfg, GROUPS, micro_batch_size=4), CONFIG))
  metrics = analyse(params, batch, old_logp, advantages, mask, ref_logp, scores, jnp.int32(0))

  @jax.jit
  def reference_norms(params, members):
    """Norms of each term's gradient with the bucket's episodes as the whole batch."""
    take = lambda x: x[members]  # noqa: E731

    def terms(p):
      lp, ent = token_logp_and_entropy(CONFIG, p, take(batch.tokens), take(batch.valid))
      _, aux = actor_loss(lp, take(old_logp), take(advantages), take(mask), ent, take(ref_logp), loss_cfg)
      return {"task": aux["pg_loss"], "entropy": 0.01 * aux["entropy"], "kl": 0.05 * aux["kl_loss"]}

    return {name: optax.global_norm(jax.grad(lambda p: terms(p)[name])(params)) for name in ("task", "entropy", "kl")}

  bucket_of_group = np.asarray([1, 0, 1, 0])  # quantile: the two lowest scores, then the two highest
  reward_std = np.asarray([e.score for e in episodes]).reshape(GROUPS, GROUP_SIZE).std(axis=1, ddof=1)
  for k in range(2):
    members = np.flatnonzero(bucket_of_group[np.asarray(batch.group_ids)] == k)
    for name, want in reference_norms(params, members).items():
      np.testing.assert_allclose(float(metrics[f"grad_analysis/bucket_{k}/{name}_grad_norm"]), float(want),
                                 rtol=2e-4, err_msg=f"bucket {k} {name}")
    stds = reward_std[bucket_of_group == k]
    np.testing.assert_allclose(float(metrics[f"grad_analysis/bucket_{k}/reward_std_min"]), stds.min(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics[f"grad_analysis/bucket_{k}/reward_std_max"]), stds.max(), rtol=1e-5)
    assert float(metrics[f"grad_analysis/bucket_{k}/num_groups"]) == 2
  assert float(metrics["grad_analysis/computed"]) == 1.0
  skipped = analyse(params, batch, old_logp, advantages, mask, ref_logp, scores, jnp.int32(1))
  assert float(skipped["grad_analysis/computed"]) == 0.0
  assert set(float(v) for v in skipped.values()) == {0.0}
  assert without_skipped({k: float(v) for k, v in skipped.items()}, CollapseConfig()) == {"grad_analysis/computed": 0.0}
  assert without_skipped(metrics, CollapseConfig()) == metrics


def test_bad_settings_fail_early():
  with pytest.raises(ValueError, match="variants"):
    CollapseConfig(variants=("first_turn", "middle"))
  with pytest.raises(ValueError, match="marginal"):
    CollapseConfig(marginal="mean")
  with pytest.raises(ValueError, match="2 groups"):
    make_diagnostics_fn(CollapseConfig(), num_groups=1, group_size=8)
