"""SFT: the learning-rate schedule (warm-up, constant, then cosine decay over the last steps), staged fitting
and length-bucketed batches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ragen_jax import sft
from ragen_jax.models import init_params
from ragen_jax.models.scratch import scratch_config
from ragen_jax.sft import fit, length_classes, lr_schedule, pack_examples, sft_loss


def test_warmup_constant_then_decay():
  schedule = lr_schedule(1e-3, steps=100, warmup_steps=10, decay_steps=20)
  lrs = np.array([float(schedule(step)) for step in range(101)])
  np.testing.assert_allclose(lrs[:11], np.linspace(0.0, 1e-3, 11), rtol=1e-5, atol=1e-12)
  np.testing.assert_allclose(lrs[10:81], 1e-3)
  assert np.all(np.diff(lrs[80:]) < 0)  # decays over the last 20 steps
  assert lrs[90] == pytest.approx(0.55e-3) and lrs[100] == pytest.approx(1e-4)


def test_default_is_cosine_decay_over_every_step():
  schedule, cosine = lr_schedule(3e-3, steps=50), optax.cosine_decay_schedule(3e-3, 50, 0.1)
  for step in (0, 1, 25, 49, 50):
    assert float(schedule(step)) == pytest.approx(float(cosine(step)))


@pytest.mark.parametrize("warmup_steps, decay_steps", [(90, 20), (-1, 10), (0, -5)])
def test_phases_that_do_not_fit_fail_early(warmup_steps, decay_steps):
  with pytest.raises(ValueError, match="do not fit"):
    lr_schedule(1e-3, steps=100, warmup_steps=warmup_steps, decay_steps=decay_steps)


def test_fit_runs_one_optimizer_through_the_stages(tokenizer):
  config = scratch_config(tokenizer, hidden_size=32, num_layers=1)
  params = jax.tree.map(np.array, init_params(config, jax.random.key(0)))  # host copies: fit donates its params
  ids = tokenizer.encode("<think>Up</think><answer>Up</answer>")
  short, long = [(ids, [True] * len(ids))] * 2, [(ids * 3, [True] * (3 * len(ids)))] * 2
  # no learning for the first stage's 3 steps: the schedule is counted over both stages
  schedule = optax.join_schedules([optax.constant_schedule(0.0), optax.constant_schedule(1e-2)], [3])
  steps = []
  first, _ = fit(config, jax.tree.map(jnp.array, params), [(short, 32, 3)], batch_size=2, schedule=schedule)
  both, loss = fit(config, jax.tree.map(jnp.array, params), [(short, 32, 3), (long, 64, 2)], batch_size=2,
                   schedule=schedule, on_step=lambda step, _: steps.append(step))
  assert steps == [0, 1, 2, 3, 4] and np.isfinite(loss)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(params)))
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(both), jax.tree.leaves(params)))


def test_a_stage_traces_and_compiles_its_step_once(tokenizer):
  """The fresh optimizer state starts where the step returns it (the params' mesh): step 2 runs step 1's program."""
  config = scratch_config(tokenizer, hidden_size=32, num_layers=1)
  ids = tokenizer.encode("<think>Up</think><answer>Up</answer>")
  traces = []

  def count_step_traces(event, duration, fun_name=None, **kwargs):
    if event == "/jax/core/compile/jaxpr_trace_duration" and fun_name == "step":
      traces.append(duration)

  jax.monitoring.register_event_duration_secs_listener(count_step_traces)
  try:
    fit(config, init_params(config, jax.random.key(0)), [([(ids, [True] * len(ids))] * 2, 32, 3)], batch_size=2,
        schedule=optax.constant_schedule(1e-3))
  finally:
    jax.monitoring.unregister_event_duration_listener(count_step_traces)
  assert len(traces) == 1


def test_length_buckets_pad_each_batch_to_one_class(tokenizer, monkeypatch):
  examples = [([5] * n, [True] * n) for n in (10, 20, 64, 65, 100, 128)]
  _, valid, _ = pack_examples(examples, 128)
  np.testing.assert_array_equal(length_classes(valid, 64), [64, 64, 64, 128, 128, 128])
  np.testing.assert_array_equal(length_classes(valid, None), [128] * 6)
  batches = []

  def recording_step(params, opt_state, tokens_BT, valid_BT, loss_mask_BT):
    batches.append((tokens_BT.shape[1], valid_BT.sum(axis=1)))
    return params, opt_state, jnp.zeros(())

  monkeypatch.setattr(sft, "make_sft_step", lambda config, tx: recording_step)
  config = scratch_config(tokenizer, hidden_size=32, num_layers=1)
  fit(config, init_params(config, jax.random.key(0)), [(examples, 128, 40)], batch_size=2,
      schedule=optax.constant_schedule(1e-3), length_bucket=64)
  assert {width for width, _ in batches} == {64, 128}  # both classes drawn
  for width, lengths in batches:  # every example of a batch belongs to its width's class
    assert all(width - 64 < n <= width for n in lengths), (width, lengths)


def test_trailing_padding_does_not_change_the_loss(tokenizer):
  """What length buckets rely on: a batch padded to 64 or to 128 tokens has the same loss."""
  config = scratch_config(tokenizer, hidden_size=32, num_layers=1)
  params = init_params(config, jax.random.key(1))
  ids = tokenizer.encode("<think>Up</think><answer>Up || Left</answer>")
  tokens, valid, mask = pack_examples([(ids, [False, True] * (len(ids) // 2) + [True] * (len(ids) % 2))] * 2, 128)
  loss = jax.jit(sft_loss, static_argnums=0)
  short, full = loss(config, params, tokens[:, :64], valid[:, :64], mask[:, :64]), loss(config, params, tokens, valid,
                                                                                         mask)
  assert float(full) > 0.0 and float(short) == pytest.approx(float(full), rel=1e-5)
