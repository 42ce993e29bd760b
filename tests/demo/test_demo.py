"""The demo: solver demonstrations are valid, and a shortened demo writes every report file."""

import concurrent.futures
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from PIL import Image

import envs
from ragen_jax.config import load_config_file
from ragen_jax.demo.__main__ import rl_result, run
from ragen_jax.demo.stages import paired_gain
from ragen_jax.demo.demonstrations import (TEMPLATE_STYLES, direction_text, format_rows, plan_and_reason, reading_rates,
                                           reply_checks, solver_policy)
from ragen_jax.rollout.device import slot_layout
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, reset_batch, unbatch
from ragen_jax.rollout.host import host_rollout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake"])
def test_solver_plans_solve_the_level_when_replayed(env_name):
  env, params = envs.make(env_name)
  states = reset_batch(env, params, jnp.arange(40))
  for i in range(40):
    state = unbatch(states, i)
    plan, reasoning = plan_and_reason(env_name, state, env.action_names(params))
    row, col = (int(v) for v in np.asarray(state.player_pos))
    assert reasoning.startswith(f"player ({row}, {col})")  # the reasoning names this episode's input
    assert plan, "every generated level is solvable"
    first_push = None
    for action in plan:
      before = np.asarray(state.room_state) if env_name == "sokoban" else None
      _, state, _, _, _ = env.step(jax.random.key(0), state, action, params)
      moved_box = before is not None and not np.array_equal((before == 4) | (before == 3),
                                                            (np.asarray(state.room_state) == 4) |
                                                            (np.asarray(state.room_state) == 3))
      if moved_box and first_push is None:
        first_push = env.action_names(params)[action]
    assert bool(state.success)
    if env_name == "sokoban":  # the stated next push is the first move that moves a box in the env
      assert reasoning.endswith(f"; next push {first_push}."), reasoning


def test_direction_text_reads_as_directions():
  assert direction_text(2, -1) == "2 down 1 left" and direction_text(-1, 0) == "1 up"
  assert direction_text(0, 3) == "3 right"
  assert direction_text(0, 0) == "here"


@pytest.mark.parametrize("mistake_rate,single_move_rate", [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0)])
def test_solver_replies_follow_the_plan_with_the_asked_imperfections(tokenizer, mistake_rate, single_move_rate):
  env, params = envs.make("sokoban")
  names = env.action_names(params)
  states = reset_batch(env, params, jnp.arange(12))
  policy = solver_policy(env, params, tokenizer, 64, 2, mistake_rate, single_move_rate, seed=0)
  replies = policy(None, np.ones(12, bool), states, None)
  for i in range(12):
    plan, _ = plan_and_reason("sokoban", unbatch(states, i), names)
    text = tokenizer.decode(replies.tokens_BN[i, :replies.lengths_B[i]], skip_special_tokens=True)
    moves = [names.index(m.strip()) for m in text.split("<answer>")[1].split("</answer>")[0].split("||")]
    expected = plan[:1] if single_move_rate else plan[:2]
    assert len(moves) == len(expected) and moves[1:] == expected[1:], text
    if not mistake_rate:
      assert moves == expected, text
    elif expected[0] != names.index("Up"):
      assert moves[0] == names.index("Up"), text  # the habit
    else:
      assert moves[0] != expected[0], text


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake"])
def test_template_replies_reason_without_the_observation_and_keep_the_moves(tokenizer, env_name):
  env, params = envs.make(env_name)
  names = env.action_names(params)
  states = reset_batch(env, params, jnp.arange(64))
  for templates, style in ((4, "sentence"), (1, "sentence"), (4, "reading")):
    policy = solver_policy(env, params, tokenizer, 64, 2, 0.0, 0.0, seed=0, template_rate=0.5, templates=templates,
                           template_style=style)
    replies = policy(None, np.ones(64, bool), states, None)
    chosen = TEMPLATE_STYLES[style][env_name][:templates]
    templated = []
    for i in range(64):
      state = unbatch(states, i)
      plan, reasoning = plan_and_reason(env_name, state, names)
      text = tokenizer.decode(replies.tokens_BN[i, :replies.lengths_B[i]], skip_special_tokens=True)
      said, answer = text.split("</think>")[0], text.split("<answer>")[1].split("</answer>")[0]
      assert answer == " || ".join(names[a] for a in plan[:2]), text  # the plan's moves either way
      # a template and nothing else (no moves: nothing of the input), or the solver's reasoning and its moves
      assert said in chosen or said == f"{reasoning} So: {answer}.", text
      templated.append(said if said in chosen else None)
      if style == "sentence":  # a reading template reads a made-up state, which may be this one
        assert reply_checks(env_name, env.render_text(state, params), text) == ((templated[-1] is None),) * 2, text
    said = [t for t in templated if t]  # half the turns (0.5 +- 0.19 at 3 standard deviations), templates at random
    assert 0.31 < len(said) / 64 < 0.69 and (len(set(said)) > 1) == (templates > 1)


@pytest.mark.parametrize("mistake_rate", [0.0, 0.5])
def test_bandit_solver_names_the_arms_and_pulls_the_high_risk_one_or_a_random_one(tokenizer, mistake_rate):
  env, params = envs.make("bandit")
  states = reset_batch(env, params, jnp.arange(64))
  policy = solver_policy(env, params, tokenizer, 64, 1, mistake_rate, habit_move="", seed=0)
  replies = policy(None, np.ones(64, bool), states, None)
  high_risk = []
  for i in range(64):
    state = unbatch(states, i)
    a, b = env.episode_action_names(state, params)
    text = tokenizer.decode(replies.tokens_BN[i, :replies.lengths_B[i]], skip_special_tokens=True)
    pulled = text.split("<answer>")[1].split("</answer>")[0]
    assert text.startswith(f"arms {a} and {b}. So: {pulled}.") and pulled in (a, b), text
    high_risk.append(pulled == (a, b)[int(state.high_risk_arm)])
  # mistakes swap the arm: a fair coin at 0.5 (64 draws: 0.5 +- 0.19 at 3 standard deviations)
  assert np.mean(high_risk) == 1.0 if not mistake_rate else 0.31 < np.mean(high_risk) < 0.69


def test_reply_checks_compare_the_reasoning_with_the_observation():
  observation = "Start: (3, 2)\nGoal: (2, 1)\nPlayer in hole: (1, 0)\nHoles: (1, 0)\n"
  right = "player (1, 0), goal (2, 1) is 1 down 1 right, holes near none. So: Down || Right.</think><answer>"
  assert reply_checks("frozenlake", observation, right + "Down || Right</answer>") == (True, True)
  assert reply_checks("frozenlake", observation, right + "Down</answer>") == (True, False)
  misread = right.replace("goal (2, 1)", "goal (1, 2)")
  assert reply_checks("frozenlake", observation, misread + "Down || Right</answer>") == (False, True)
  assert reply_checks("frozenlake", observation, "<answer>Down</answer>") == (False, False)  # no reasoning
  sokoban = "Targets: (3, 2)\nBoxes: (2, 3)\nPlayer on target: (2, 4)\n"
  reply = "player (2, 4), box (2, 3), target (3, 2): box goes 1 down 1 left; next push Left. So: Left.</think>"
  assert reply_checks("sokoban", sokoban, reply + "<answer>Left</answer>") == (True, True)
  assert reply_checks("sokoban", sokoban, reply.replace("player (2, 4)", "player (2, 2)") + "<answer>Left</answer>") \
      == (False, True)
  bandit = "1. There are 2 arms, named Pirate and Farmer\n2. Each arm"
  assert reply_checks("bandit", bandit, "arms Pirate and Farmer. So: Farmer.</think><answer>Farmer</answer>") \
      == (True, True)
  assert reply_checks("bandit", bandit, "arms Farmer and Pirate. So: Farmer.</think><answer>Pirate</answer>") \
      == (False, False)


@pytest.mark.parametrize("env_name", ["frozenlake", "bandit"])
@pytest.mark.parametrize("reasoning_of", ["own", "other"])
def test_reading_rates_of_solver_rollouts(tokenizer, env_name, reasoning_of):
  """Every solver turn names its own observation's positions (Bandit: arms); reasoning about other episodes
  mostly does not."""
  env, params = envs.make(env_name)
  config = RolloutConfig(max_turns=3, max_new_tokens=64)
  assets = build_assets(tokenizer, env, params, config)
  solver = solver_policy(env, params, tokenizer, 64, 2, mistake_rate=0.5, single_move_rate=0.5,
                         habit_move="Up" if env_name == "frozenlake" else "", seed=0)
  shift = 0 if reasoning_of == "own" else 1

  def policy(records, active, state, key):  # replies about the state of episode i - shift
    return solver(records, active, jax.tree.map(lambda x: jnp.roll(x, shift, axis=0), state), key)

  traj = host_rollout(policy, env, params, assets, config, np.arange(16), np.arange(16), jax.random.key(0),
                      seq_len=slot_layout(assets, config)[2])
  rates = reading_rates(env_name, jax.tree.map(np.asarray, traj), tokenizer)
  assert rates["answer_follows_reasoning"] == 1.0
  if reasoning_of == "own":
    assert rates["positions_read"] == 1.0
  else:
    assert rates["positions_read"] < 0.3


@pytest.mark.parametrize("observed", [False, True])
def test_format_rows_teach_answers_that_repeat_the_reasoning_moves(tokenizer, observed):
  env, params = envs.make("sokoban")
  names = env.action_names(params)
  states = reset_batch(env, params, jnp.arange(4))
  texts = [(env.render_text(unbatch(states, i), params), plan_and_reason("sokoban", unbatch(states, i), names)[1],
            names) for i in range(4)]
  rows = format_rows(texts, tokenizer, observed=observed, rows=8, row_len=200, max_moves=2, seed=0)
  move_counts, moves_seen = set(), set()
  for ids, mask in rows:
    assert 0 < len(ids) <= 200 and len(mask) == len(ids)
    observation, *replies = tokenizer.decode(ids).split("<think>")
    if observed:  # one observation and its reply
      assert observation.removesuffix("\n") in {t[0] for t in texts} and len(replies) == 1
    else:  # packed replies
      assert observation == "" and len(replies) >= 2
    answers = []
    for reply in replies:
      think, answer = reply.split("</think><answer>")
      reasoning, chosen = think.rsplit(" So: ", 1)
      moves = answer.removesuffix(f"</answer>{tokenizer.eos_token}")
      assert reasoning in {t[1] for t in texts} and chosen == f"{moves}."
      if observed:  # the reasoning is that of the observed state
        assert texts[[t[0] for t in texts].index(observation.removesuffix("\n"))][1] == reasoning
      move_counts.add(len(moves.split(" || ")))
      moves_seen.update(moves.split(" || "))
      answers.append(answer)
    # the loss: the whole reply after an observation, the answers of packed replies
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == (replies[0] if observed else "".join(answers))
  assert move_counts == {1, 2} and moves_seen == set(names)  # random moves, not the plan's
  with pytest.raises(ValueError, match="more than row_len=8"):
    format_rows(texts, tokenizer, observed=observed, rows=1, row_len=8, max_moves=2)


def shortened(config_name: str, workdir) -> ml_collections.ConfigDict:
  """`configs/<config_name>.py` shrunk to seconds: a 1-layer model, few demonstrations, 2 iterations of 2 x 4."""
  config = load_config_file(os.path.join(ROOT, "configs", f"{config_name}.py"))
  config.workdir = str(workdir)
  config.demo.envs = "frozenlake"
  config.demo.hidden_size, config.demo.num_layers = 32, 1
  config.demo.sft_episodes, config.demo.sft_steps, config.demo.sft_batch_size = 8, 4, 4
  config.demo.copy_steps, config.demo.reading_steps = 1, 1
  config.demo.sft_warmup_steps, config.demo.sft_decay_steps = 1, 2
  config.rollout.max_turns = 2
  config.train.iterations, config.train.env_groups, config.train.group_size = 2, 2, 4
  config.train.mini_batch_size, config.train.micro_batch_size = 8, 4
  config.train.val_every, config.train.val_episodes, config.train.checkpoint_every = 2, 4, 2
  config.diagnostics.num_samples = 4
  config.logging.progress_bar = False
  return config


def test_shortened_demo_writes_every_report_file(tmp_path):
  results = run(shortened("demo", tmp_path))
  assert set(results) == {"frozenlake"} and 0.0 <= results["frozenlake"]["final_val_success"] <= 1.0
  run_dir = tmp_path / "frozenlake"
  for path in ("sft_model/model.safetensors", "sft_model/tokenizer.json", "tokenizer/tokenizer.json",
               "frozenlake/final_model/model.safetensors", "frozenlake/metrics.jsonl", "results.json", "report.md"):
    assert (tmp_path / path).is_file(), path
  assert os.listdir(run_dir / "tensorboard") and os.listdir(run_dir / "checkpoints")
  report = (tmp_path / "report.md").read_text()
  assert "| frozenlake |" in report and "frozenlake/report.png" in report
  image = np.asarray(Image.open(run_dir / "report.png").convert("L"), np.float32)
  assert image.shape[0] > 300 and image.std() > 10  # a real picture, not a blank canvas
  saved = json.loads((tmp_path / "results.json").read_text())["frozenlake"]
  # same seeds before and after: the mean of the per-seed changes is the change of the means
  assert saved["gain"] == pytest.approx(saved["final_val_success"] - saved["sft_val_success"], abs=1e-9)
  assert saved["gain_se"] >= 0.0 and "± " in report
  for stage in ("sft", "rl"):
    assert set(saved["reading"][stage]) == {"positions_read", "answer_follows_reasoning"}
    assert all(0.0 <= v <= 1.0 for v in saved["reading"][stage].values())
  assert "positions read (SFT → RL)" in report
  # two RL runs side by side, as the demo runs its environments, compute what the run alone did
  twins = [shortened("demo", tmp_path / f"twin{i}") for i in range(2)]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    futures = [pool.submit(rl_result, twin, "frozenlake", str(tmp_path / "sft_model"), 0.0) for twin in twins]

  def logged(workdir):  # every iteration's metrics but their timings
    rows = map(json.loads, (workdir / "frozenlake/metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]

  alone = logged(tmp_path)
  assert len(alone) == 2 and alone[0]["collapse/computed"] == 1.0 and len(alone[0]) > 40
  for i, future in enumerate(futures):
    assert future.result()["final_val_success"] == results["frozenlake"]["final_val_success"]
    assert logged(tmp_path / f"twin{i}") == alone


@pytest.mark.parametrize("setting,value,error", [("sft_warmup_steps", 10, "do not fit in 6 steps"),
                                                  ("habit_move", "Wait", "'Wait' is not a frozenlake action")])
def test_bad_demo_settings_fail_before_any_work(tmp_path, setting, value, error):
  config = shortened("demo", tmp_path)
  config.demo[setting] = value
  with pytest.raises(ValueError, match=error):
    run(config)
  assert not os.path.exists(tmp_path / "tokenizer")


def test_paired_gain_by_hand():
  before, after = [1, 0, 0, 1, 0], [1, 1, 0, 0, 1]  # changes 0, +1, 0, -1, +1
  gain, se = paired_gain(before, after)
  assert gain == pytest.approx(0.2)
  assert se == pytest.approx(np.sqrt(((0.2 ** 2) * 2 + 0.8 ** 2 * 2 + 1.2 ** 2) / 4 / 5))
