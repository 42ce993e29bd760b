"""The SFT learning-rate schedule: warm-up, constant, then cosine decay over the last steps."""

import numpy as np
import optax
import pytest

from ragen_jax.sft import lr_schedule


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
