"""The `envs` registry and the interface every environment shares."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs


@pytest.mark.parametrize("name", sorted(envs.REGISTRY))
def test_reset_and_step_are_pure_and_deterministic(name):
  env, params = envs.make(name)
  reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
  step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, None, None)))
  keys = jax.random.split(jax.random.key(0), 16)
  first, again = reset(keys, params), reset(keys, params)
  jax.tree.map(np.testing.assert_array_equal, first, again)
  _, states = first
  assert any(not np.array_equal(x[0], x[k]) for x in jax.tree.leaves(states) for k in range(1, 16))
  out_a, out_b = step(keys, states, jnp.int32(0), params), step(keys, states, jnp.int32(0), params)
  jax.tree.map(np.testing.assert_array_equal, out_a, out_b)
  obs, after, reward, done, info = out_a
  assert reward.dtype == jnp.float32 and done.dtype == jnp.bool_ and reward.shape == done.shape == (16,)
  assert set(info) == {"success", "action_is_effective"}
  assert jax.tree.structure(after) == jax.tree.structure(states)


def test_make_rejects_bad_names_and_values():
  with pytest.raises(ValueError, match="unknown environment"):
    envs.make("pong")
  with pytest.raises(ValueError, match="unknown parameter"):
    envs.make("sokoban", room_size=6)
  for name, overrides in [
    ("sokoban", {"dim_room": (2, 5)}),
    ("sokoban", {"num_boxes": 0}),
    ("sokoban", {"num_layouts": 1, "num_searched_layouts": 2}),
    ("frozenlake", {"success_rate": 1.5}),
    ("frozenlake", {"size": 1}),
    ("bandit", {"name_pool": "validation"}),
    ("lightsout", {"max_steps": 0}),
  ]:
    with pytest.raises(ValueError):
      envs.make(name, **overrides)


def test_instruction_text_follows_ragen_layout():
  env, params = envs.make("sokoban")
  instruction = env.instruction_text(params, 10)
  assert instruction.startswith("You are solving the Sokoban puzzle.")
  assert instruction.endswith(
    "\nThe meaning of each symbol in the state is:\n#: wall, _: empty, O: target, √: box on target, X: box, "
    'P: player, S: player on target\nYour available actions are:\nUp, Down, Left, Right\nYou can make up to '
    '10 actions, separated by the action separator " || "\n'
  )
  env, params = envs.make("frozenlake")
  assert "Left, Down, Right, Up" in env.instruction_text(params, 10)
  env, params = envs.make("lightsout")
  assert "Your available actions" not in env.instruction_text(params, 10)


def test_envs_does_not_import_ragen_jax():
  code = "import sys, envs; assert not [m for m in sys.modules if m.startswith('ragen_jax')]"
  subprocess.run([sys.executable, "-c", code], check=True)
