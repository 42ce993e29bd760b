"""Throughput of the on-device environments against their Python peers, in one run.

  python bench/envs.py                     # about a minute on 2 CPU cores
  python bench/envs.py --batch 16384 --steps 200

Ours: `batch` envs stepped `steps` times inside one jitted `lax.scan` (random
actions drawn beforehand, as a policy would supply them; a finished episode
restarts from its first state, so every step is live); resets are one jitted
`vmap(reset)`. Peers, each a Python loop over one env: gym-sokoban's
`SokobanEnv.step` (with its cheapest observation, and with its default one)
and `room_utils.generate_room` (what its `reset` runs, minus the rendering),
and gymnasium's `FrozenLake-v1`. Every rate is the best of `repeats`.

Also the device parser (`envs.text.parse_replies`) on a batch of replies in 128-token slots, with SmolLM2's
tokenizer and the demo's: on its usual buffer of `NARROW_TOKEN_BYTES` a token against the worst case's buffer
(the vocabulary's longest token, every token).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, before bench/

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import envs  # noqa: E402
from bench.common import report, timed  # noqa: E402


def loop_rate(step, seconds: float) -> float:
  """Calls per second of a Python callable, over about `seconds`."""
  calls, start = 0, time.perf_counter()
  while (elapsed := time.perf_counter() - start) < seconds:
    for _ in range(50):
      step()
    calls += 50
  return calls / elapsed


@functools.partial(jax.jit, static_argnums=0)
def rollout(env, params, first, actions_TB, key):
  """Steps a batch of envs through actions_TB; a finished episode restarts from `first`."""
  batch = actions_TB.shape[1]
  step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

  def body(carry, inputs):
    state, total = carry
    key, actions = inputs
    _, state, reward, done, _ = step(jax.random.split(key, batch), state, actions, params)
    state = jax.tree.map(lambda a, b: jnp.where(done.reshape(-1, *[1] * (a.ndim - 1)), a, b), first, state)
    return (state, total + reward.sum()), None

  keys = jax.random.split(key, actions_TB.shape[0])
  return jax.lax.scan(body, (first, jnp.float32(0)), (keys, actions_TB))[0][1]


def ours_steps_per_second(name: str, batch: int, steps: int, repeats: int, **overrides) -> float:
  """Env steps per second; actions (the policy's job) are drawn before the clock starts."""
  env, params = envs.make(name, **overrides)
  _, first = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), batch), params)
  actions = jax.random.randint(jax.random.key(1), (steps, batch), 0, env.num_actions(params))
  jax.block_until_ready(rollout(env, params, first, actions, jax.random.key(2)))
  seconds, _ = timed(rollout, env, params, first, actions, jax.random.key(2), repeats=repeats)
  return batch * steps / seconds


def ours_resets_per_second(name: str, batch: int, repeats: int, **overrides) -> float:
  env, params = envs.make(name, **overrides)
  reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
  keys = jax.random.split(jax.random.key(1), batch)
  jax.block_until_ready(reset(keys, params))
  seconds, _ = timed(reset, keys, params, repeats=repeats)
  return batch / seconds


def gym_sokoban_rates(seconds: float) -> dict[str, float]:
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from gym_sokoban.envs.room_utils import generate_room
    from gym_sokoban.envs.sokoban_env import SokobanEnv
  env = SokobanEnv(dim_room=(6, 6), num_boxes=1, max_steps=10**9)
  actions = iter(np.random.default_rng(0).integers(1, 5, size=10**7))

  def step(mode):
    def run():
      if env.step(int(next(actions)), observation_mode=mode)[2]:
        env.reset()
    return run

  def generate():
    while True:
      try:
        return generate_room(dim=(6, 6), num_steps=int(1.7 * 12), num_boxes=1)
      except (RuntimeError, RuntimeWarning):
        continue

  return {"tiny": loop_rate(step("tiny_rgb_array"), seconds), "rgb": loop_rate(step("rgb_array"), seconds),
          "generate": loop_rate(generate, seconds)}


def gymnasium_frozenlake_rate(seconds: float) -> float:
  import gymnasium
  env = gymnasium.make("FrozenLake-v1", is_slippery=False)
  env.reset(seed=0)
  actions = iter(np.random.default_rng(0).integers(0, 4, size=10**7))

  def run():
    _, _, terminated, truncated, _ = env.step(int(next(actions)))
    if terminated or truncated:
      env.reset()

  return loop_rate(run, seconds)


def parse_rates(batch: int, repeats: int) -> dict[str, tuple[float, float, int]]:
  """Per tokenizer: (replies parsed per second on the narrow buffer, on the worst case's, its longest token's
  bytes)."""
  import tempfile

  import transformers

  from configs.demo import get_config
  from envs import text
  from ragen_jax.demo.stages import build_tokenizer
  from ragen_jax.models.gguf_convert import bundled_tokenizer_dir

  reply = ("player (1, 2), box (2, 3), target (3, 3): box goes 1 down; next push Down. So: Down || Left."
           "</think><answer>Down || Left</answer>")
  tokenizers = {"SmolLM2": transformers.AutoTokenizer.from_pretrained(bundled_tokenizer_dir()),
                "demo": build_tokenizer(get_config(), ["sokoban", "frozenlake"], tempfile.mkdtemp())}
  rates = {}
  for name, tokenizer in tokenizers.items():
    vocab = text.Vocab(tokenizer)
    ids = tokenizer.encode(reply, add_special_tokens=False)
    ids_BT = jnp.zeros((batch, 128), jnp.int32).at[:, :len(ids)].set(jnp.asarray(ids))
    lengths_B = jnp.full((batch,), len(ids), jnp.int32)
    names = [jnp.broadcast_to(x, (batch,) + x.shape) for x in map(jnp.asarray, text.action_name_table(
        ("Up", "Down", "Left", "Right")))]
    speeds = []
    for token_bytes in (text.NARROW_TOKEN_BYTES, 10**6):
      parse = jax.jit(functools.partial(text.parse_replies, max_actions=2, token_bytes=token_bytes))
      jax.block_until_ready(parse(vocab.table, ids_BT, lengths_B, *names))
      speeds.append(batch / timed(parse, vocab.table, ids_BT, lengths_B, *names, repeats=repeats)[0])
    rates[name] = (*speeds, int(vocab.table.bytes_VB.shape[1]))
  return rates


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=4096, help="envs stepped in parallel")
  parser.add_argument("--steps", type=int, default=100, help="steps per timed rollout")
  parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the best is kept")
  parser.add_argument("--seconds", type=float, default=3.0, help="seconds per Python-loop baseline")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; batch {args.batch}, {args.steps} steps", flush=True)

  gym = gym_sokoban_rates(args.seconds)
  sokoban_steps = ours_steps_per_second("sokoban", args.batch, args.steps, args.repeats, max_steps=10**9)
  report("sokoban 6x6x1 steps", sokoban_steps, "steps/s", "gym-sokoban step (tiny_rgb_array obs)", gym["tiny"])
  report("sokoban 6x6x1 steps", sokoban_steps, "steps/s", "gym-sokoban step (default rgb_array obs)", gym["rgb"])
  report("sokoban 6x6x1 resets", ours_resets_per_second("sokoban", args.batch, args.repeats), "resets/s",
         "gym-sokoban generate_room", gym["generate"])
  report("frozenlake 4x4 steps", ours_steps_per_second("frozenlake", args.batch, args.steps, args.repeats),
         "steps/s", "gymnasium FrozenLake-v1 step", gymnasium_frozenlake_rate(args.seconds))
  report("frozenlake 4x4 resets", ours_resets_per_second("frozenlake", args.batch, args.repeats), "resets/s")
  for name, (narrow, widest, longest) in parse_rates(512, args.repeats).items():
    report(f"parse 512 replies, {name} tokenizer", narrow, "replies/s",
           f"worst-case buffer ({longest} bytes a token)", widest)
  for name, rate in gym.items():
    report(f"  peer: gym-sokoban {dict(tiny='step, tiny obs', rgb='step, rgb obs', generate='generate_room')[name]}",
           rate, "/s")


if __name__ == "__main__":
  main()
