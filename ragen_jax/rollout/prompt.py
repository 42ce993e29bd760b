"""The reference prompt layout (SPEC §2) through the model's chat template.

A conversation is rendered as per-turn chunks, each built on device from token
tables made once on the host:

  turn 0: <system open> system text <user open> user(0) <assistant open> "<think>"
  turn k: [EOS if the reply did not end with it] <turn switch> "Reward:\\n{r}\\n" user(k) <assistant open> "<think>"

user(k) = "Turn {k+1}:\\nState:\\n{observation}\\nYou have {N} actions left. Always output: ..."
The chat-template pieces come from rendering a conversation with marker contents
and splitting at the markers, so any chat template (ChatML, Llama 3, ...) works.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from envs import text as env_text
from envs.text import THINK_OPEN

SYSTEM_PREFIX = "You're a helpful assistant. "
FORMAT_REMINDER = ("Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
                   "with no extra text. Strictly follow this format.")
_MARKERS = ("\x01S\x01", "\x01U1\x01", "\x01A1\x01", "\x01U2\x01")
_DIGITS = tuple("0123456789")
MAX_REWARD_DIGITS = 3  # |reward| < 1000 is rendered exactly (two decimals)


@dataclasses.dataclass(frozen=True)
class ChatPieces:
  """Text around message contents in the model's chat template."""

  system_open: str       # before the system message
  system_to_user: str    # after the system message, before the first user message
  generation_open: str   # after a user message: the assistant header
  end_of_reply: str      # the template's end of an assistant message (usually the EOS token)
  reply_to_user: str     # after end_of_reply, before the next user message

  @classmethod
  def from_tokenizer(cls, tokenizer) -> ChatPieces:
    messages = [{"role": "system", "content": _MARKERS[0]}, {"role": "user", "content": _MARKERS[1]},
                {"role": "assistant", "content": _MARKERS[2]}, {"role": "user", "content": _MARKERS[3]}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    positions = [rendered.find(m) for m in _MARKERS]
    if min(positions) < 0 or positions != sorted(positions):
      raise ValueError("the tokenizer's chat template does not render system/user/assistant messages in order")
    cut = [0]
    for marker, pos in zip(_MARKERS, positions):
      cut += [pos, pos + len(marker)]
    parts = [rendered[a:b] for a, b in zip(cut[0::2], cut[1::2])] + [rendered[cut[-1]:]]
    system_open, system_to_user, generation_open, after_reply, final_open = parts
    if final_open != generation_open:
      raise ValueError("the chat template opens the assistant turn differently after the first turn")
    eos = tokenizer.eos_token or ""
    end_of_reply = eos if eos and after_reply.startswith(eos) else ""
    return cls(system_open, system_to_user, generation_open, end_of_reply, after_reply[len(end_of_reply):])


def format_reward(reward: float) -> str:
  """Host rendering of a turn reward: two decimals, trailing zeros dropped ("-0.1", "10", "0.25")."""
  cents = round(reward * 100)
  sign = "-" if cents < 0 else ""
  whole, frac = divmod(abs(cents), 100)
  out = f"{sign}{whole}"
  if frac:
    out += f".{frac:02d}".rstrip("0")
  return out


def user_text(turn: int, observation: str, actions_left: int, max_response_tokens: int) -> str:
  """The user message of a turn (without the reward line)."""
  return (f"Turn {turn + 1}:\nState:\n{observation}\nYou have {actions_left} actions left. {FORMAT_REMINDER} "
          f"Max response length: {max_response_tokens} words (tokens).")


def system_text(env_instruction: str) -> str:
  return SYSTEM_PREFIX + env_instruction


def conversation_text(pieces: ChatPieces, system: str, turns) -> str:
  """Host reference of a whole rendered conversation.

  `turns` is a list of (reward of the previous turn or None, user text, reply text or None,
  reply ended with EOS). The last reply is not closed: the episode ends with it.
  """
  out = pieces.system_open + system + pieces.system_to_user
  for i, (prev_reward, user, reply, ended_by_eos) in enumerate(turns):
    if i:
      out += pieces.reply_to_user + f"Reward:\n{format_reward(prev_reward)}\n"
    out += user + pieces.generation_open + THINK_OPEN
    if reply is not None:
      out += reply + ("" if ended_by_eos or i == len(turns) - 1 else pieces.end_of_reply)
  return out


@flax.struct.dataclass
class TurnTables:
  """Token tables of the turn chunks: `system` opens the conversation (the system prompt,
  kept by every context window), `first` starts turn 0 ("Turn 1"), `head` opens a later
  turn (reward line, "Turn k"), `tail` follows the observation."""

  system: env_text.TextTable
  first: env_text.TextTable
  head: env_text.TextTable
  tail: env_text.TextTable


# `head` slots: opening (after EOS / after a stop sequence), sign, digits, ".", tenths, hundredths, "\n", "Turn k".
OPEN_AFTER_EOS, OPEN_AFTER_STOP = 0, 1


def build_turn_tables(vocab: env_text.Vocab, pieces: ChatPieces, system: str, max_turns: int,
                      max_actions: int, max_response_tokens: int) -> TurnTables:
  """Tokenises every fixed fragment of the turn chunks once (host)."""
  reward_open = pieces.reply_to_user + "Reward:\n"
  system_part = ((pieces.system_open + system + pieces.system_to_user,),)
  first = (("Turn 1:\nState:\n",),)
  head = ((reward_open, pieces.end_of_reply + reward_open), ("-",), *([_DIGITS] * MAX_REWARD_DIGITS), (".",),
          _DIGITS, _DIGITS, ("\n",), tuple(f"Turn {k + 1}:\nState:\n" for k in range(max_turns)))
  tail = tuple(f"\nYou have {n} actions left. {FORMAT_REMINDER} Max response length: {max_response_tokens} words "
               f"(tokens)." + pieces.generation_open + THINK_OPEN for n in range(max_actions + 1))
  return TurnTables(system=env_text.compile_template(vocab, system_part),
                    first=env_text.compile_template(vocab, first), head=env_text.compile_template(vocab, head),
                    tail=env_text.compile_template(vocab, (tail,)))


def head_choices(turn, prev_reward, prev_ended_by_eos) -> jax.Array:
  """Jittable slot choices of `head` for turn >= 1: opening, the previous turn's reward, "Turn k"."""
  cents = jnp.round(prev_reward * 100).astype(jnp.int32)
  magnitude = jnp.minimum(jnp.abs(cents), 10 ** (MAX_REWARD_DIGITS + 2) - 1)
  whole, frac = magnitude // 100, magnitude % 100
  tenths, hundredths = frac // 10, frac % 10
  powers = list(reversed(range(MAX_REWARD_DIGITS)))
  choices = [jnp.where(prev_ended_by_eos, OPEN_AFTER_EOS, OPEN_AFTER_STOP), jnp.where(cents < 0, 0, -1)]
  choices += [jnp.where((whole >= 10 ** p) | (p == 0), (whole // 10 ** p) % 10, -1) for p in powers]
  choices += [jnp.where(frac > 0, 0, -1), jnp.where(frac > 0, tenths, -1), jnp.where(hundredths > 0, hundredths, -1),
              0, turn]
  return jnp.stack([jnp.asarray(c, jnp.int32) for c in choices])


def _join(*parts):
  ids = jnp.concatenate([ids for ids, _ in parts])
  valid = jnp.concatenate([jnp.arange(ids.shape[0]) < n for ids, n in parts])
  return ids, valid


def first_chunk(tables: TurnTables, obs_ids, obs_len, actions_left):
  """Jittable: one row's turn-0 chunk as (ids int32[C0], valid bool[C0]); holes between the parts.
  Its first `tables.system.max_tokens` slots are the system prompt."""
  zero = jnp.zeros((1,), jnp.int32)
  return _join(env_text.render_slots(tables.system, zero), env_text.render_slots(tables.first, zero),
               (obs_ids, obs_len), env_text.render_slots(tables.tail, jnp.asarray([actions_left], jnp.int32)))


def chunk_segments(system_tokens: int, chunk_len: int, turn) -> jax.Array:
  """Jittable: int32[chunk_len] segment ids of a turn's chunk: 0 for the system prompt (turn 0's
  first `system_tokens`, always visible), turn + 1 for the rest (see `models.transformer`)."""
  system = (jnp.arange(chunk_len) < system_tokens) & (turn == 0)
  return jnp.where(system, 0, turn + 1).astype(jnp.int32)


def turn_chunk(tables: TurnTables, obs_ids, obs_len, turn, prev_reward, prev_ended_by_eos, actions_left):
  """Jittable: one row's chunk for turn >= 1 as (ids int32[C], valid bool[C])."""
  return _join(env_text.render_slots(tables.head, head_choices(turn, prev_reward, prev_ended_by_eos)),
               (obs_ids, obs_len), env_text.render_slots(tables.tail, jnp.asarray([actions_left], jnp.int32)))
