"""The demo tokenizer: merges across spaces, action names kept as tokens of their own."""

from ragen_jax.models.tokenizer import train_tokenizer

ACTIONS = ("Up", "Down", "Left", "Right")
REPLIES = [f"box goes 1 up; next push {a}. So: {a} || {b}.</think><answer>{a} || {b}</answer>"
           for a in ACTIONS for b in ACTIONS] * 10
REPLY = "next push Right. So: Up || Right.</think><answer>Up || Right</answer>"


def _pieces(tokenizer, text):
  return [tokenizer.decode([i]) for i in tokenizer.encode(text)]


def _merged_actions(pieces):
  return [p for p in pieces if p not in ACTIONS and any(a in p for a in ACTIONS)]


def test_isolated_action_names_are_the_same_token_in_the_reasoning_and_the_answer():
  tokenizer = train_tokenizer(REPLIES, vocab_size=400, split_words=False, isolated_words=ACTIONS)
  pieces = _pieces(tokenizer, REPLY)
  assert "".join(pieces) == REPLY
  assert pieces.count("Right") == 3 and pieces.count("Up") == 2 and not _merged_actions(pieces)
  assert len(pieces) < len(REPLY) / 3  # the rest still merges across spaces


def test_without_isolation_merges_swallow_the_action_names():
  tokenizer = train_tokenizer(REPLIES, vocab_size=400, split_words=False)
  assert _merged_actions(_pieces(tokenizer, REPLY))  # e.g. 'Up || ' is one token
