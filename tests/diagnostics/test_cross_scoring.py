"""Cross-scoring: the cached, chunked scorer vs transformers pair by pair; pair extraction and sampling."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from envs import text as env_text
from ragen_jax import mesh as mesh_lib
from ragen_jax.diagnostics import cross_scoring as xs
from ragen_jax.models import load_pretrained
from ragen_jax.rollout.episodes import reasoning_lengths
from ragen_jax.trajectories import TrajectoryWriter
from tests.diagnostics.batch_fixtures import CLOSE, THINK, Episode, Turn, make_batch, random_episodes
from tests.models.hf_fixtures import save_hf_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen2_bias")
  return save_hf_model("qwen2_bias", path, initializer_range=0.3), path


def torch_reasoning_logp(hf_model, prompt, reasoning) -> float:
  """Σ log p(reasoning | prompt) from one unpadded transformers forward, in float64."""
  reasoning = [int(t) for t in reasoning]
  if not reasoning:
    return 0.0
  ids = torch.tensor([[int(t) for t in prompt] + reasoning])
  with torch.no_grad():
    logp = torch.log_softmax(hf_model(ids).logits[0].double(), dim=-1)
  start = len(prompt) - 1
  return float(sum(logp[start + i, token] for i, token in enumerate(reasoning)))


def random_pairs(rng, vocab=128, num_prompts=5, num_rows=7, window=12, max_tokens=9):
  prompt_len = rng.integers(1, window + 1, num_prompts)
  prompt_len[0] = window
  reasoning_len = rng.integers(0, max_tokens + 1, num_rows)
  reasoning_len[0] = max_tokens
  prompts = rng.integers(4, vocab, (num_prompts, window))
  reasoning = np.where(np.arange(max_tokens) < reasoning_len[:, None],
                       rng.integers(4, vocab, (num_rows, max_tokens)), 0)
  return prompts, prompt_len, reasoning, reasoning_len


@pytest.fixture(scope="module")
def pairs_and_reference(tiny):
  """Random prompts and reasonings (some empty, some at full width) and their torch scores."""
  prompts, prompt_len, reasoning, reasoning_len = random_pairs(np.random.default_rng(0))
  want = np.asarray([[torch_reasoning_logp(tiny[0], prompts[j, :prompt_len[j]], reasoning[r, :reasoning_len[r]])
                      for j in range(len(prompts))] for r in range(len(reasoning))])
  return (prompts, prompt_len, reasoning, reasoning_len), want


@pytest.mark.parametrize("block_tokens,columns_per_step,rows_per_step", [(4, 1, None), (32, 2, 3), (1, 5, 7)])
def test_scorer_matches_transformers_pair_by_pair(tiny, pairs_and_reference, block_tokens, columns_per_step,
                                                  rows_per_step):
  model = load_pretrained(tiny[1])
  inputs, want = pairs_and_reference
  score = jax.jit(functools.partial(xs.cross_logp, model.config, block_tokens=block_tokens,
                                    columns_per_step=columns_per_step, rows_per_step=rows_per_step))
  got = np.asarray(score(model.params, *map(jnp.asarray, inputs)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-4)
  assert np.all(got[inputs[3] == 0] == 0.0)


def test_sharded_scorer_equals_single_device(tmp_path):
  save_hf_model("qwen2_bias", tmp_path, initializer_range=0.3)
  prompts, prompt_len, reasoning, reasoning_len = random_pairs(np.random.default_rng(1), num_rows=16)
  args = (jnp.asarray(prompts), jnp.asarray(prompt_len), jnp.asarray(reasoning), jnp.asarray(reasoning_len))
  single_model = load_pretrained(tmp_path)
  score = jax.jit(functools.partial(xs.cross_logp, single_model.config, block_tokens=4, columns_per_step=1,
                                    rows_per_step=8))
  single = np.asarray(score(single_model.params, *args))
  mesh = mesh_lib.make_mesh(2, 2, 2)
  model = load_pretrained(tmp_path, mesh=mesh)
  with jax.set_mesh(mesh):
    sharded = np.asarray(score(model.params, *args))
  np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-5)


def test_score_pairs_reads_prompts_and_reasonings_off_the_packed_batch(tiny):
  hf_model, path = tiny
  model = load_pretrained(path)
  rng = np.random.default_rng(2)
  episodes = random_episodes(rng, num_groups=2, group_size=2, max_turns=3, vocab=128, open_share=0.0)
  batch = make_batch(episodes, seq_len=64, max_turns=3)
  cells = [(b, k) for b, e in enumerate(episodes) for k in range(len(e.turns)) if e.turn_texts()[k][1]]
  rows = cells[:6]
  cols = cells[-3:] + [(0, 0), cells[-2], (1, 0)]  # repeats: the same cell, a group's shared first prompt
  assert episodes[0].group == episodes[1].group
  pairs = xs.CrossPairs(row_episode=jnp.asarray([b for b, _ in rows]), row_turn=jnp.asarray([k for _, k in rows]),
                        row_mask=jnp.ones(len(rows), bool), col_episode=jnp.asarray([b for b, _ in cols]),
                        col_turn=jnp.asarray([k for _, k in cols]), own_col=jnp.zeros(len(rows), jnp.int32))
  max_tokens = 5  # cuts some reasonings
  score = jax.jit(functools.partial(xs.score_pairs, model.config, max_reasoning_tokens=max_tokens, prompt_window=64,
                                    block_tokens=2))
  got, lengths = score(model.params, batch, pairs)
  texts = {cell: episodes[cell[0]].turn_texts()[cell[1]] for cell in rows + cols}
  want = [[torch_reasoning_logp(hf_model, texts[c][0], texts[r][1][:max_tokens]) for c in cols] for r in rows]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-4)
  assert np.asarray(lengths).tolist() == [min(len(texts[r][1]), max_tokens) for r in rows]


def test_reasoning_mask_and_eligibility_follow_think_blocks():
  episode = Episode(0, [10, 11], [Turn([20, 21, 22], [30]), Turn([], [31]), Turn([23], [32], closed=False),
                                  Turn([24, 25], [33])], observations=[[40], [41, 42], [43]])
  batch = make_batch([episode], seq_len=40, max_turns=5)
  tokens = np.asarray(batch.tokens[0])
  mask = np.asarray(xs.reasoning_token_mask(batch)[0])
  assert tokens[mask].tolist() == [20, 21, 22, 24, 25]
  assert np.asarray(xs.has_reasoning(batch))[0].tolist() == [True, False, False, True, False]
  last_prompt = episode.turn_texts()[3][0]
  assert tokens[len(last_prompt) - 1] == THINK and tokens[len(last_prompt) + 2] == CLOSE
  fits = np.asarray(xs.eligible_turns(batch, prompt_window=len(last_prompt) - 1))[0]
  assert fits.tolist() == [True, False, False, False, False]


@pytest.mark.parametrize("enable_think", [True, False])
def test_reasoning_span_of_rolled_out_replies_follows_the_answer_grammar(tokenizer, enable_think):
  cases = [  # (reply, its reasoning by the reference's rules; None: no well-formed answer)
    ("push on</think><answer>Up || Left</answer>", "push on"),
    ("push on</think><answer>Up || Jump</answer>", "push on"),  # penalised, still reasoned
    ("I could write <answer>Up</answer> but no</think><answer>Down</answer>",
     "I could write <answer>Up</answer> but no"),
    ("a</think>b</think>\n<answer>Left</answer>", "a</think>b"),
    ("go</think> So: <answer>Up</answer>", None),
    ("go <answer>Up</answer>", None),
    ("go</think><answer>Up", None),
  ]
  replies, prompt = [tokenizer.encode(reply) for reply, _ in cases], tokenizer.encode("Turn 1:<think>")
  batch, width = len(cases), max(map(len, replies))
  tokens_BN = np.zeros((batch, width), np.int32)
  for row, ids in enumerate(replies):
    tokens_BN[row, :len(ids)] = ids
  lengths_B, ones_B = jnp.array([len(ids) for ids in replies]), jnp.ones(batch, jnp.int32)
  chunk_BP = jnp.tile(jnp.array(prompt), (batch, 1))
  writer = TrajectoryWriter.empty(batch, len(prompt) + width, 1)
  writer = writer.write_chunk(0, 0, chunk_BP, jnp.ones_like(chunk_BP, bool), jnp.ones_like(chunk_BP), ones_B)
  reasoning_B = reasoning_lengths(env_text.Vocab(tokenizer).table, jnp.asarray(tokens_BN), lengths_B, enable_think)
  writer = writer.write_reply(len(prompt), 0, ones_B > 0, jnp.asarray(tokens_BN), lengths_B, jnp.zeros((batch, width)),
                              ones_B, jnp.zeros(batch), ones_B > 0, reasoning_B, 0 * ones_B)
  trajectories = writer.finish(jnp.zeros(batch, bool), jnp.arange(batch))
  mask, has = np.asarray(xs.reasoning_token_mask(trajectories)), np.asarray(xs.has_reasoning(trajectories))[:, 0]
  for row, (reply, reasoning) in enumerate(cases):
    expected = reasoning if enable_think else None
    assert has[row] == bool(expected), reply
    assert tokenizer.decode(np.asarray(trajectories.tokens)[row][mask[row]].tolist()) == (expected or ""), reply


def test_prompt_equivalence_marks_identical_prompts_only():
  shared = Turn([20], [30])
  episodes = [Episode(0, [10, 11], [shared]), Episode(0, [10, 11], [shared, Turn([21], [31])], [[40]]),
              Episode(1, [10, 12], [shared, Turn([21], [31])], [[40]]), Episode(2, [10], [shared])]
  batch = make_batch(episodes, seq_len=24, max_turns=2)
  pairs = xs.CrossPairs(row_episode=jnp.zeros(1, jnp.int32), row_turn=jnp.zeros(1, jnp.int32),
                        row_mask=jnp.ones(1, bool), col_episode=jnp.asarray([0, 1, 2, 3, 1, 2]),
                        col_turn=jnp.asarray([0, 0, 0, 0, 1, 1]), own_col=jnp.zeros(1, jnp.int32))
  equiv = np.asarray(xs.prompt_equivalence(batch, pairs))
  want = np.eye(6, dtype=bool)
  want[0, 1] = want[1, 0] = True
  np.testing.assert_array_equal(equiv, want)


def test_first_turn_pairs_draw_eligible_episodes_without_replacement():
  rng = np.random.default_rng(3)
  episodes = random_episodes(rng, num_groups=4, group_size=5, max_turns=2, vocab=64, open_share=0.3)
  batch = make_batch(episodes, seq_len=48, max_turns=2)
  eligible = {b for b, e in enumerate(episodes) if e.turn_texts()[0][1]}
  group_first = [min(b for b, e in enumerate(episodes) if e.group == g) for g in range(4)]
  for num_rows, seed in [(6, 0), (20, 1)]:
    pairs = jax.jit(xs.first_turn_pairs, static_argnums=(1, 2, 4))(batch, 4, num_rows, jax.random.key(seed), 48)
    mask = np.asarray(pairs.row_mask)
    real = np.asarray(pairs.row_episode)[mask].tolist()
    assert mask.sum() == min(num_rows, len(eligible)) and set(real) <= eligible and len(set(real)) == len(real)
    assert np.asarray(pairs.own_col)[mask].tolist() == [episodes[b].group for b in real]
    assert np.asarray(pairs.col_episode).tolist() == group_first and not np.asarray(pairs.col_turn).any()
  with pytest.raises(ValueError, match="without replacement"):
    xs.first_turn_pairs(batch, 4, 21, jax.random.key(0), 48)


def test_trajectory_pairs_are_episode_uniform_then_turn_uniform():
  no, yes = Turn([], [30]), Turn([20], [30])
  episodes = [Episode(0, [10], [yes]), Episode(0, [10], [yes, no, yes, yes, yes], [[40]] * 4),
              Episode(1, [11], [no, yes], [[41]]), Episode(1, [11], [no, no], [[41]])]
  batch = make_batch(episodes, seq_len=48, max_turns=5)
  draws = 4000
  keys = jax.random.split(jax.random.key(0), draws // 16)
  pairs = jax.jit(jax.vmap(lambda k: xs.trajectory_pairs(batch, 16, k, 48)))(keys)
  assert np.asarray(pairs.row_mask).all()
  np.testing.assert_array_equal(np.asarray(pairs.own_col), np.broadcast_to(np.arange(16), (draws // 16, 16)))
  cells = np.stack([np.asarray(pairs.row_episode).ravel(), np.asarray(pairs.row_turn).ravel()], axis=1)
  want = {(0, 0): 1 / 3, (1, 0): 1 / 12, (1, 2): 1 / 12, (1, 3): 1 / 12, (1, 4): 1 / 12, (2, 1): 1 / 3}
  counts = {cell: int(np.sum(np.all(cells == cell, axis=1))) for cell in want}
  assert sum(counts.values()) == draws  # never an episode or turn without reasoning
  for cell, p in want.items():
    assert abs(counts[cell] / draws - p) < 4 * np.sqrt(p * (1 - p) / draws), (cell, counts[cell])
  no_reasoning = make_batch([episodes[3]] * 2, seq_len=48, max_turns=5)
  assert not np.asarray(xs.trajectory_pairs(no_reasoning, 4, jax.random.key(0), 48).row_mask).any()
