"""Token tables, rendering and answer parsing (envs.text) against real tokenizers."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text

NAMES = ("Up", "Down", "Left", "Right")
TOGGLES = tuple(f"toggle {r} {c}" for r in range(3) for c in range(3))

# (answer text, names, max_actions, keep_unknown, expected ids, expected valid)
CASES = [
  ("<think>push</think><answer>Up || Down</answer>", NAMES, 2, False, [0, 1], True),
  ("<answer>UP||dOwN</answer>", NAMES, 2, False, [0, 1], True),
  ("<answer>  Left \n||\tRight  </answer>", NAMES, 2, False, [2, 3], True),
  ("<answer>Up || Up || Down</answer>", NAMES, 2, False, [0, 0], True),
  ("<answer>Up || Down || Jump</answer>", NAMES, 2, False, [0, 1], True),
  ("<answer>Up || Jump</answer>", NAMES, 2, False, [0], False),
  ("<answer>Jump || Up || Down</answer>", NAMES, 2, False, [0], False),
  ("<answer>Up", NAMES, 2, False, [], False),
  ("<think>no answer at all</think>", NAMES, 2, False, [], False),
  ("<answer>Left</answer> then <answer>Right</answer>", NAMES, 2, False, [2], True),
  ("<answer></answer>", NAMES, 2, False, [], False),
  ("<answer> || \n || </answer>", NAMES, 2, False, [], False),
  ("\x00\x7f\ufffd\u00e9<answer>Down</answer>\x01", NAMES, 2, False, [1], True),
  ("<answer>Up ||| Down</answer>", NAMES, 2, False, [0], False),
  ("<answer>Up||||Down</answer>", NAMES, 3, False, [0, 1], True),
  ("<answer>Up|Down</answer>", NAMES, 2, False, [], False),
  ("<answer>move up</answer>", NAMES, 2, False, [], False),
  ("<ANSWER>Up</ANSWER>", NAMES, 2, False, [], False),
  ("<answer><answer>Up</answer>", NAMES, 2, False, [], False),
  ("Up</answer><answer>Down</answer>", NAMES, 2, False, [1], True),
  ("<answer>\u00a0Up</answer>", NAMES, 2, False, [], False),
  ("<answer>Up\u221a</answer>", NAMES, 2, False, [], False),
  ("<answer>Right || Left || Up || Down || Up</answer>", NAMES, 10, False, [3, 2, 0, 1, 0], True),
  ("<answer>toggle 0 1 || flip 2 2 || TOGGLE 2 2</answer>", TOGGLES, 2, True, [1, -1], True),
  ("<answer> toggle  0 1 </answer>", TOGGLES, 2, True, [-1], True),
  ("<answer> || </answer>", TOGGLES, 2, True, [], False),
]

FRAGMENTS = [
  "<answer>", "</answer>", "<think>", "</think>", "||", "|", " ", "  ", "\n", "\t", "Up", "up", "DOWN",
  "Left", "right", "jump", "x", "\u221a", "<", ">", "answer", "/", "\u00a0", "toggle 1 2", "ans", "wer>",
]  # fmt: skip


def noise(rng, most: int) -> str:
  """Up to `most` - 1 random fragments."""
  return "".join(rng.choice(FRAGMENTS, size=rng.integers(0, most)))


def device_parse(vocab, texts_or_ids, names, max_actions, keep_unknown=False):
  """Parse a batch on device; each item is a str (natively encoded) or a list of ids."""
  ids = [vocab.tokenizer.encode(t, add_special_tokens=False) if isinstance(t, str) else t for t in texts_or_ids]
  width = 64 * (1 + max(len(i) for i in ids) // 64)  # few distinct shapes: few compilations
  ids_BT = np.zeros((len(ids), width), np.int32)
  for b, row in enumerate(ids):
    ids_BT[b, : len(row)] = row
  names_AL, names_len_A = text.action_name_table(names)
  parse = functools.partial(text.parse_actions, max_actions=max_actions, keep_unknown=keep_unknown)
  out = jax.vmap(parse, in_axes=(None, 0, 0, None, None))(
    vocab.table, jnp.asarray(ids_BT), jnp.array([len(i) for i in ids]), jnp.asarray(names_AL), jnp.asarray(names_len_A)
  )
  return [
    ([int(a) for a in acts[:n]], bool(v))
    for acts, n, v in zip(np.asarray(out.actions_K), np.asarray(out.n_actions), np.asarray(out.valid))
  ], ids


def test_token_bytes_decode_like_the_tokenizer(tokenizer, vocab):
  anchor = vocab.encode("a")
  for token in range(len(vocab.token_bytes)):
    data = vocab.token_bytes[token]
    try:
      expected = "a" + data.decode()
    except UnicodeDecodeError:  # a partial UTF-8 token; checked through whole characters below
      continue
    assert tokenizer.decode(anchor + [token]) == expected, (token, data)
  for char in ("\u221a", "\u00e9", "\u4e2d", "\U0001f600"):
    ids = tokenizer.encode("b" + char, add_special_tokens=False)
    assert tokenizer.decode(anchor + ids) == "a" + vocab.decode_bytes(ids).decode()
    assert vocab.decode_bytes(ids).decode().endswith("b" + char)


def test_encode_reproduces_text_exactly(tokenizer, vocab, rng):
  for _ in range(200):
    s = "x" + noise(rng, 12)
    ids = vocab.encode(s)
    assert vocab.decode_bytes(ids) == s.encode()
    assert tokenizer.decode(ids) == s


def test_unsupported_decoder_is_rejected():
  from tokenizers import Tokenizer, models
  from transformers import PreTrainedTokenizerFast

  wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
  with pytest.raises(ValueError, match="unsupported tokenizer decoder"):
    text.Vocab(PreTrainedTokenizerFast(tokenizer_object=wordpiece))


def test_render_slots_concatenates_chosen_candidates(tokenizer, vocab, rng):
  slots = (("Grid:\n",), ("#", "_", "\u221a"), ("", " || "), text.coordinate_texts(3, 3, ", "), ("\n",))
  table = text.compile_template(vocab, slots)
  assert table.max_tokens == sum(max(len(vocab.encode(c)) for c in slot) for slot in slots)
  render = jax.jit(text.render_slots)
  for _ in range(30):
    choice = [int(rng.integers(-1, len(slot))) for slot in slots]
    ids, length = render(table, jnp.array(choice))
    expected = "".join(slot[c] for slot, c in zip(slots, choice) if c >= 0)
    assert tokenizer.decode(np.asarray(ids)[: int(length)].tolist()) == expected
    assert not np.asarray(ids)[int(length) :].any()


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_parse_cases_host_and_device(vocab, case):
  answer, names, max_actions, keep_unknown, expected, valid = case
  assert text.parse_actions_text(answer, names, max_actions, keep_unknown) == (expected, valid)
  # the native tokenisation and a char-by-char one must parse alike
  by_char = [i for ch in answer for i in vocab.encode(ch)]
  got, ids = device_parse(vocab, [answer, by_char], names, max_actions, keep_unknown)
  host = text.parse_actions_text(vocab.tokenizer.decode(ids[0]), names, max_actions, keep_unknown)
  assert got == [host, (expected, valid)]


def random_answer(rng) -> str:
  """Noise, then an answer block of up to 4 pieces (names in any case, junk), maybe unclosed."""
  pieces = []
  for _ in range(rng.integers(0, 5)):
    word = str(rng.choice(NAMES + TOGGLES + ("jump", "", "\u221a")))
    word = word.upper() if rng.random() < 0.3 else word.lower() if rng.random() < 0.5 else word
    pieces.append(str(rng.choice([" ", "", "\n"])) + word + str(rng.choice(["", " ", "\t"])))
  separator = str(rng.choice(["||", " || ", "|||"]))
  close = "</answer>" if rng.random() < 0.9 else ""
  return noise(rng, 4) + "<answer>" + separator.join(pieces) + close + noise(rng, 4)


def test_parse_fuzz_host_device_agree(vocab, rng):
  texts = [noise(rng, 16) for _ in range(200)]
  texts += [random_answer(rng) for _ in range(300)]
  random_ids = [rng.integers(0, len(vocab.token_bytes), size=rng.integers(0, 24)).tolist() for _ in range(100)]
  answer_ids = vocab.tokenizer.encode("<answer>", add_special_tokens=False)
  random_ids += [answer_ids + ids for ids in random_ids]
  outcomes = []
  for names, keep_unknown in ((NAMES, False), (TOGGLES, True)):
    for max_actions in (1, 3):
      got, ids = device_parse(vocab, texts + random_ids, names, max_actions, keep_unknown)
      for item_ids, device in zip(ids, got):
        decoded = vocab.tokenizer.decode(item_ids)
        assert device == text.parse_actions_text(decoded, names, max_actions, keep_unknown), decoded
      outcomes += [(len(actions), valid) for actions, valid in got]
  # the fuzz reaches every kind of outcome
  assert {(0, False), (1, False), (1, True), (2, True), (3, True)} <= set(outcomes)


def test_ids_past_the_length_and_vocab_are_ignored(vocab):
  ids = vocab.encode("<answer>Left</answer>")
  names_AL, names_len_A = map(jnp.asarray, text.action_name_table(NAMES))
  noise = jnp.array(ids + vocab.encode("<answer>Up</answer>"))
  out = text.parse_actions(vocab.table, noise, jnp.int32(len(ids)), names_AL, names_len_A, 2)
  assert out.actions_K.tolist() == [2, -1] and bool(out.valid)
  out = text.parse_actions(vocab.table, jnp.array([-5, 10**6] + ids), jnp.int32(len(ids) + 2), names_AL, names_len_A, 2)
  assert out.actions_K.tolist() == [2, -1] and bool(out.valid)


def test_find_token_locates_the_token_holding_the_pattern(vocab, rng):
  find = jax.jit(text.find_token, static_argnums=3)
  outcomes = set()
  for _ in range(40):
    ids = vocab.encode(noise(rng, 12))
    padded = jnp.zeros(64, jnp.int32).at[: len(ids)].set(jnp.array(ids, jnp.int32))
    index, found = find(vocab.table, padded, jnp.int32(len(ids)), "</think>")
    at = vocab.decode_bytes(ids).find(b"</think>")
    assert bool(found) == (at >= 0)
    outcomes.add(bool(found))
    if at >= 0:  # the pattern's first byte lies in token `index`
      assert len(vocab.decode_bytes(ids[:index])) <= at < len(vocab.decode_bytes(ids[: index + 1]))
  assert outcomes == {True, False}


def test_action_names_are_checked():
  for bad in ("", " Up", "Up||Down", "\u221a"):
    with pytest.raises(ValueError):
      text.action_name_table(["Down", bad])
