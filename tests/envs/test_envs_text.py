"""Token tables, rendering and answer parsing (envs.text) against real tokenizers."""
import functools
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import text

NAMES = ("Up", "Down", "Left", "Right")
TOGGLES = tuple(f"toggle {r} {c}" for r in range(3) for c in range(3))
ARMS = ("Oak", "Dragon")

# Replies (the generation after the prompt's `<think>`) and their outcome under RAGEN's think grammar:
# (reply, names, max_actions, keep_unknown, expected ids, expected valid); written from the reference's rules.
CASES = [
  ("push</think><answer>Up || Down</answer>", NAMES, 2, False, [0, 1], True),
  # the answer is the block right after the reasoning's </think>, with only whitespace between
  ("go</think> So: <answer>Up</answer>", NAMES, 2, False, [], False),
  ("go <answer>Up</answer>", NAMES, 2, False, [], False),
  ("I could write <answer>Up</answer> but no</think><answer>Down</answer>", NAMES, 2, False, [1], True),
  ("a</think>b</think>\n\u3000<answer>Left</answer>", NAMES, 2, False, [2], True),
  ("a</think>\u2003\u00a0\x1c<answer>Left</answer>", NAMES, 2, False, [2], True),
  ("a</think>.<answer>Left</answer>", NAMES, 2, False, [], False),
  ("a</think><answer>Left</think><answer>Up</answer>", NAMES, 2, False, [], False),  # content "LeftUp"
  ("<think>a</think><answer>Up</answer>", NAMES, 2, False, [0], True),
  ("x</think><answer>Left</answer> then <answer>Right</answer>", NAMES, 2, False, [2], True),
  ("Up</answer></think><answer>Down</answer>", NAMES, 2, False, [1], True),
  ("x</think><answer>Up", NAMES, 2, False, [], False),
  ("no answer at all</think>", NAMES, 2, False, [], False),
  ("x</think><ANSWER>Up</ANSWER>", NAMES, 2, False, [], False),
  # inside the block: stray tags removed, case folded, any Unicode whitespace stripped
  ("x</think><answer>UP||dOwN</answer>", NAMES, 2, False, [0, 1], True),
  ("x</think><answer>DOWN</answer>", NAMES, 2, False, [1], True),
  ("x</think><answer>Up\u00a0</answer>", NAMES, 2, False, [0], True),
  ("x</think><answer>\u3000Left\u2028||\x85Right\u202f</answer>", NAMES, 2, False, [2, 3], True),
  ("x</think><answer>Up\u200b</answer>", NAMES, 2, False, [], False),  # zero-width space is not whitespace
  ("x</think><answer><answer>Up</answer>", NAMES, 2, False, [0], True),
  ("x</think><answer>Le<think>ft || <|im_end|>Up</think></answer>", NAMES, 2, False, [2, 0], True),
  ("x</think><answer></ans<think>wer>Up</answer>", NAMES, 2, False, [0], True),  # removals join a later tag
  ("x</think><answer><thi</think>nk>Up</answer>", NAMES, 2, False, [], False),  # ... but not an earlier one
  ("x</think><answer>U<|im_start|>p</answer>", NAMES, 2, False, [0], True),
  ("x</think><answer>Oa\u212a || dragon</answer>", ARMS, 2, False, [0, 1], True),  # Kelvin sign lowers to k
  ("x</think><answer>O\u212aa</answer>", ARMS, 2, False, [], False),
  ("x</think><answer>  Left \n||\tRight  </answer>", NAMES, 2, False, [2, 3], True),
  ("x</think><answer>Up || Up || Down</answer>", NAMES, 2, False, [0, 0], True),
  ("x</think><answer>Up || Down || Jump</answer>", NAMES, 2, False, [0, 1], True),  # past the limit: dropped
  # partially valid answers: the recognised actions, in order, and the format penalty
  ("x</think><answer>Up || Jump</answer>", NAMES, 2, False, [0], False),
  ("x</think><answer>Jump || Left || Up</answer>", NAMES, 2, False, [2], False),
  ("x</think><answer>Jump || Left || Up</answer>", NAMES, 3, False, [2, 0], False),
  ("x</think><answer></answer>", NAMES, 2, False, [], False),
  ("x</think><answer> || \n || </answer>", NAMES, 2, False, [], False),
  ("\x00\x7f\ufffd\u00e9</think><answer>Down</answer>\x01", NAMES, 2, False, [1], True),
  ("x</think><answer>Up ||| Down</answer>", NAMES, 2, False, [0], False),
  ("x</think><answer>Up||||Down</answer>", NAMES, 3, False, [0, 1], True),
  ("x</think><answer>Up|Down</answer>", NAMES, 2, False, [], False),
  ("x</think><answer>move up</answer>", NAMES, 2, False, [], False),
  ("x</think><answer>Up\u221a</answer>", NAMES, 2, False, [], False),
  ("x</think><answer>Right || Left || Up || Down || Up</answer>", NAMES, 10, False, [3, 2, 0, 1, 0], True),
  ("x</think><answer>toggle 0 1 || flip 2 2 || TOGGLE 2 2</answer>", TOGGLES, 2, True, [1, -1], True),
  ("x</think><answer> toggle  0 1 </answer>", TOGGLES, 2, True, [-1], True),
  ("x</think><answer> || </answer>", TOGGLES, 2, True, [], False),
]

# The same rules without a think block (RAGEN's enable_think=False): the first `<answer>(.*?)</answer>`.
NO_THINK_CASES = [
  ("go</think> So: <answer>Up</answer>", NAMES, 2, False, [0], True),
  ("go <answer>Up</answer>", NAMES, 2, False, [0], True),
  ("I could write <answer>Up</answer> but no</think><answer>Down</answer>", NAMES, 2, False, [0], True),
  ("<answer>Left</answer> then <answer>Right</answer>", NAMES, 2, False, [2], True),
  ("Up</answer><answer>Down</answer>", NAMES, 2, False, [1], True),
  ("<answer><answer>Up</answer>", NAMES, 2, False, [0], True),
  ("<answer>DOWN || Jump</answer>", NAMES, 2, False, [1], False),
  ("<answer>Up", NAMES, 2, False, [], False),
]

# (reply, the reasoning under the think grammar, by the reference's rules; None: no well-formed answer)
REASONING_CASES = [
  ("go</think><answer>Up</answer>", "go"),
  ("go</think>\n <answer>Up || Jump</answer>", "go"),
  ("go</think> So: <answer>Up</answer>", None),
  ("go <answer>Up</answer>", None),
  ("go</think><answer>Up", None),
  ("I could write <answer>Up</answer> but no</think><answer>Down</answer>", "I could write <answer>Up</answer> but no"),
  ("a</think>b</think>\n<answer>Left</answer>", "a</think>b"),
  ("</think><answer>Left</answer>", ""),
]

FRAGMENTS = [
  "<answer>", "</answer>", "<think>", "</think>", "||", "|", " ", "  ", "\n", "\t", "Up", "up", "DOWN",
  "Left", "right", "jump", "x", "\u221a", "<", ">", "answer", "/", "\u00a0", "toggle 1 2", "ans", "wer>",
  "\u3000", "\u2003", "\x85", "\x1c", "\u200b", "\u212a", "Oa", "<|im_end|>", "<thi", "nk>", "</th",
]  # fmt: skip


def noise(rng, most: int) -> str:
  """Up to `most` - 1 random fragments."""
  return "".join(rng.choice(FRAGMENTS, size=rng.integers(0, most)))


def _batch(vocab, texts_or_ids):
  """Items (a str, natively encoded, or a list of ids) as padded ids, lengths and the items' ids."""
  ids = [vocab.tokenizer.encode(t, add_special_tokens=False) if isinstance(t, str) else t for t in texts_or_ids]
  width = 128 * (1 + max(len(i) for i in ids) // 128)  # few distinct shapes: few compilations
  ids_BT = np.zeros((len(ids), width), np.int32)
  for b, row in enumerate(ids):
    ids_BT[b, : len(row)] = row
  return jnp.asarray(ids_BT), jnp.array([len(i) for i in ids]), ids


@functools.partial(jax.jit, static_argnames=("max_actions", "keep_unknown", "enable_think", "token_bytes"))
def _parse_replies(vocab_table, ids_BT, lengths_B, names_AL, names_len_A, max_actions, keep_unknown, enable_think,
                   token_bytes):
  names = [jnp.broadcast_to(x, (ids_BT.shape[0],) + x.shape) for x in (names_AL, names_len_A)]
  return text.parse_replies(vocab_table, ids_BT, lengths_B, *names, max_actions, keep_unknown, enable_think,
                            token_bytes)


def device_parse(vocab, texts_or_ids, names, max_actions, keep_unknown=False, enable_think=True,
                 token_bytes=text.NARROW_TOKEN_BYTES):
  """Parse a batch of replies on device (`text.parse_replies`): [(action ids, valid)] and the items' ids."""
  ids_BT, lengths_B, ids = _batch(vocab, texts_or_ids)
  names_AL, names_len_A = map(jnp.asarray, text.action_name_table(names))
  out = _parse_replies(vocab.table, ids_BT, lengths_B, names_AL, names_len_A, max_actions, keep_unknown,
                       enable_think, token_bytes)
  return [
    ([int(a) for a in acts[:n]], bool(v))
    for acts, n, v in zip(np.asarray(out.actions_K), np.asarray(out.n_actions), np.asarray(out.valid))
  ], ids


def device_reasoning(vocab, texts_or_ids, enable_think=True, token_bytes=text.NARROW_TOKEN_BYTES) -> list[int]:
  """Reasoning lengths of a batch of replies on device (`text.reasoning_lengths`)."""
  ids_BT, lengths_B, _ = _batch(vocab, texts_or_ids)
  lengths = jax.jit(text.reasoning_lengths, static_argnames=("enable_think", "token_bytes"))
  return np.asarray(lengths(vocab.table, ids_BT, lengths_B, enable_think, token_bytes)).tolist()


def tokens_before(vocab, ids, num_bytes: int) -> int:
  """How many of the leading tokens of ids end within the first num_bytes bytes."""
  return int(np.sum(np.cumsum([len(vocab.token_bytes[i]) for i in ids]) <= num_bytes))


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


@pytest.mark.parametrize("enable_think", [True, False])
def test_parse_cases_host_and_device(vocab, enable_think):
  cases = CASES if enable_think else NO_THINK_CASES
  for reply, names, max_actions, keep_unknown, expected, valid in cases:
    assert text.parse_actions_text(text.THINK_OPEN + reply, names, max_actions, keep_unknown, enable_think) \
      == (expected, valid), reply
  for config in {case[1:4] for case in cases}:  # one device batch per parser configuration
    group = [case for case in cases if case[1:4] == config]
    replies = [case[0] for case in group]
    # the native tokenisation and a char-by-char one must parse alike
    by_char = [[i for ch in reply for i in vocab.encode(ch)] for reply in replies]
    got, ids = device_parse(vocab, replies + by_char, *config, enable_think)
    for reply, item_ids, native, char_wise, case in zip(replies, ids, got, got[len(group):], group):
      host = text.parse_actions_text(text.THINK_OPEN + vocab.tokenizer.decode(item_ids), *config, enable_think)
      assert [native, char_wise] == [host, tuple(case[4:])], reply


def test_reasoning_cases(vocab):
  replies = [reply for reply, _ in REASONING_CASES]
  items = [vocab.encode(reply) for reply in replies]  # the tokenizer's split of the exact bytes
  items += [[i for ch in reply for i in vocab.encode(ch)] for reply in replies]  # one token per char
  assert device_reasoning(vocab, items, enable_think=False) == [0] * len(items)
  for (reply, reasoning), item_ids, length in zip(REASONING_CASES * 2, items, device_reasoning(vocab, items)):
    assert vocab.decode_bytes(item_ids) == reply.encode()
    assert length == (0 if reasoning is None else tokens_before(vocab, item_ids, len(reasoning.encode()))), reply
    parts = text.answer_parts(text.THINK_OPEN + reply)
    assert (None if parts is None else parts[0]) == reasoning


def random_answer(rng) -> str:
  """Noise, maybe a `</think>` and whitespace, then an answer block of up to 4 pieces (names in any case,
  tags, junk), maybe unclosed, then noise."""
  pieces = []
  for _ in range(rng.integers(0, 5)):
    word = str(rng.choice(NAMES + TOGGLES + ("jump", "", "\u221a", "Oa\u212a", "Le<think>ft", "<answer>up")))
    word = word.upper() if rng.random() < 0.3 else word.lower() if rng.random() < 0.5 else word
    pieces.append(str(rng.choice([" ", "", "\n", "\u3000"])) + word + str(rng.choice(["", " ", "\t", "\u00a0"])))
  separator = str(rng.choice(["||", " || ", "|||"]))
  think = "</think>" + str(rng.choice(["", " ", "\n\u2003", "."])) if rng.random() < 0.8 else ""
  close = "</answer>" if rng.random() < 0.9 else ""
  return noise(rng, 4) + think + "<answer>" + separator.join(pieces) + close + noise(rng, 4)


def test_parse_fuzz_host_device_agree(vocab, rng):
  texts = [noise(rng, 16) for _ in range(200)]
  texts += [random_answer(rng) for _ in range(300)]
  random_ids = [rng.integers(0, len(vocab.token_bytes), size=rng.integers(0, 24)).tolist() for _ in range(100)]
  answer_ids = vocab.tokenizer.encode("</think><answer>", add_special_tokens=False)
  random_ids += [answer_ids + ids for ids in random_ids]
  outcomes = []
  for enable_think in (True, False):
    for names, max_actions, keep_unknown in ((NAMES + ARMS, 3, False), (TOGGLES, 2, True)):
      got, ids = device_parse(vocab, texts + random_ids, names, max_actions, keep_unknown, enable_think)
      for item_ids, device in zip(ids, got):
        turn = text.THINK_OPEN + vocab.tokenizer.decode(item_ids)
        assert device == text.parse_actions_text(turn, names, max_actions, keep_unknown, enable_think), turn
      outcomes += [(enable_think, len(actions), valid) for actions, valid in got]
    reasoning = device_reasoning(vocab, ids, enable_think)
    for item_ids, length in zip(ids, reasoning):
      decoded = vocab.tokenizer.decode(item_ids)
      parts = text.answer_parts(text.THINK_OPEN + decoded, enable_think)
      if vocab.decode_bytes(item_ids) == decoded.encode():  # the host text has the device's bytes
        assert length == (tokens_before(vocab, item_ids, len(parts[0].encode())) if parts else 0), decoded
    assert any(reasoning) == enable_think
  # the fuzz reaches every kind of outcome
  kinds = ((0, False), (1, False), (1, True), (2, True), (3, True))
  assert {(think, n, valid) for think in (True, False) for n, valid in kinds} <= set(outcomes)


def test_a_batch_parses_alike_on_a_narrow_buffer_and_on_the_worst_case_one(vocab, rng):
  replies = [random_answer(rng) for _ in range(60)] + [noise(rng, 16) for _ in range(20)]
  ids_BT, lengths_B, _ = _batch(vocab, replies)  # 128 slots a reply
  most = int(np.max(text.reply_bytes(vocab.table, ids_BT, lengths_B)))
  # reasoning of the vocabulary's longest token, then an answer: more than 2 bytes a token, with the answer last
  long_reply = [int(np.argmax(vocab.table.len_V))] * 100 + vocab.encode("</think><answer>Up</answer>")
  long_bytes = text.reply_bytes(vocab.table, jnp.asarray([long_reply]), jnp.array([len(long_reply)]))
  width = vocab.table.bytes_VB.shape[1]
  buffer = text.narrow_buffer_bytes(128, width, 2)
  assert most <= buffer < int(long_bytes[0]) and buffer < 128 * width
  # two batches of one shape (one compilation): every reply fits in the narrow buffer; then the last one does not
  for items in (replies, replies[:-1] + [long_reply]):
    for enable_think, config in ((True, (NAMES + ARMS, 3, False)), (False, (TOGGLES, 2, True))):
      on_narrow, ids = device_parse(vocab, items, *config, enable_think, token_bytes=2)
      on_widest, _ = device_parse(vocab, items, *config, enable_think, token_bytes=10**6)
      assert on_narrow == on_widest
      for item_ids, device in zip(ids, on_narrow):
        assert device == text.parse_actions_text(text.THINK_OPEN + vocab.tokenizer.decode(item_ids), *config,
                                                 enable_think)
      assert device_reasoning(vocab, items, enable_think, 2) == device_reasoning(vocab, items, enable_think, 10**6)
      if enable_think:
        assert any(valid for _, valid in on_narrow)
        assert items[-1] is not long_reply or on_narrow[-1] == ([0], True)  # its answer lies past the narrow end


# The reference's own pattern (RAGEN ctx_manager), the peer of the linear-time host parser.
_PEER_THINK = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
_PEER_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def peer_answer_parts(turn: str, enable_think: bool) -> tuple[str, str] | None:
  match = (_PEER_THINK if enable_think else _PEER_ANSWER).search(turn)
  if match is None:
    return None
  answer = match.group(2 if enable_think else 1)
  for tag in text.STRIPPED_TAGS:
    answer = answer.replace(tag, "").strip()
  return (match.group(1) if enable_think else ""), answer


def test_answer_parts_equal_the_reference_regex(rng):
  pieces = ["<think>", "</think>", "<answer>", "</answer>", "<|im_end|>", " ", "\n", "\u3000", "Up", "||", "x", "<"]
  turns = ["".join(rng.choice(pieces, size=rng.integers(0, 14))) for _ in range(3000)]
  turns += [random_answer(rng) for _ in range(500)]
  found = 0
  for turn in turns:
    for enable_think in (True, False):
      parts = text.answer_parts(turn, enable_think)
      assert parts == peer_answer_parts(turn, enable_think), (turn, enable_think)
      found += parts is not None
  assert found > 500  # the fuzz reaches well-formed blocks too


def test_answer_parts_are_linear_on_pathological_replies():
  long_reply = "<think>" + "let me count the boxes. " * 3000 + "</think> <answer>Up || Down</answer>"
  start = time.process_time()
  for enable_think in (True, False):
    for tag in ("<answer>", "<think>", "</answer>", "</think>", "</think> <answer>"):
      assert text.answer_parts(tag * 8000, enable_think) is None
    assert text.answer_parts("<think>" * 8000 + "</think><answer>a</answer>", enable_think)[1] == "a"
    assert text.answer_parts("<think>a</think>" + "<answer>" * 8000 + "</answer>", enable_think)[1] == ""
  assert text.answer_parts(long_reply) == (long_reply[7:-36], "Up || Down")
  assert text.answer_parts(long_reply, enable_think=False) == ("", "Up || Down")
  assert time.process_time() - start < 1.0  # the reference regex takes seconds on each of these


def test_ids_past_the_length_and_vocab_are_ignored(vocab):
  ids = vocab.encode("go</think><answer>Left</answer>")
  names_AL, names_len_A = map(jnp.asarray, text.action_name_table(NAMES))
  noise = jnp.array(ids + vocab.encode("<answer>Up</answer>"))
  out = text.parse_actions(vocab.table, noise, jnp.int32(len(ids)), names_AL, names_len_A, 2)
  assert out.actions_K.tolist() == [2, -1] and bool(out.valid)
  out = text.parse_actions(vocab.table, jnp.array([-5, 10**6] + ids), jnp.int32(len(ids) + 2), names_AL, names_len_A, 2)
  assert out.actions_K.tolist() == [2, -1] and bool(out.valid)


def test_whitespace_is_every_unicode_space():
  assert set(text.WHITESPACE) == {c for c in map(chr, range(0x110000)) if c.isspace()}
  assert [c for c in map(chr, range(0x80, 0x110000)) if c.lower().isascii()] == ["\u212a"]


def test_action_names_are_checked():
  for bad in ("", " Up", "Up\u00a0", "Up||Down", "\u221a", "<think>", "down"):
    with pytest.raises(ValueError):
      text.action_name_table(["Down", bad])
