"""Text I/O for environments: token tables, on-device rendering and answer parsing.

Three pieces, all built once on the host from a real `transformers` tokenizer:

* `Vocab` knows the bytes every token id stands for (`Vocab.table`, a device
  `VocabTable`). The device parser works on those bytes, so it does not care how
  the model split `<answer>` or an action name into tokens.
* `compile_template` turns an environment's *template* into a `TextTable`. A
  template is a tuple of slots; each slot is a tuple of candidate strings. An
  observation is one candidate per slot (or nothing), concatenated. Every
  distinct candidate is tokenised once on the host; `render_slots` concatenates
  their token ids on device into a fixed-size, padded array.
* `parse_actions` reads one reply (the generation after the prompt's
  `<think>`) on device and returns the action ids of its answer block;
  `reasoning_length` counts its reasoning tokens; `parse_replies` and
  `reasoning_lengths` do both for a batch, on a buffer sized for ordinary
  replies whenever they fit. `answer_parts` and
  `parse_actions_text` are the host-side reference with the same rules,
  written with `re` and `str` methods on the turn's text (`<think>` + reply).

Tokenisation: rendered ids decode (`tokenizer.decode`) to exactly the host text,
but they are the concatenation of per-fragment tokenisations (each grid cell,
coordinate and fixed phrase is tokenised alone), so they may differ from
`tokenizer.encode(text)` of the whole observation. Fragments whose natural
encoding does not reproduce their bytes (e.g. SentencePiece adding a leading
"▁") are re-encoded by greedy longest match over the vocabulary. (SentencePiece
decoders drop a space at the very start of a decoded text; no observation
starts with one.)

Answer grammar (RAGEN's `ctx_manager._parse_response` and the env manager's
action lookup; SPEC §2). The turn is the prompt's `<think>` followed by the
reply. With `enable_think` it must match `<think>(.*?)</think>\\s*<answer>(.*?)</answer>`
(`re.search`, DOTALL): the reasoning runs to the first `</think>` that is
followed, after whitespace only, by `<answer>` with a `</answer>` somewhere
after it, and the answer block is that one, up to its first `</answer>` (an
`<answer>` inside the reasoning is not the answer). Without `enable_think` the
block is the first `<answer>(.*?)</answer>` and there is no reasoning. Inside
the block each of `STRIPPED_TAGS` is removed in turn (`str.replace`, so a
removal may join the halves of a later tag); the content is split on `||`
(left to right, non-overlapping, like `str.split`); each piece is stripped of
whitespace (`str.strip()`: any Unicode whitespace) and empty pieces are
dropped; the first `max_actions` pieces are kept and matched against the
action names after `str.lower()` (only ASCII letters and the Kelvin sign lower
to ASCII). The turn is invalid (format penalty) when there is no block, no
piece, or any kept piece is unknown; the known pieces are returned in order
either way (the rollout steps them). With `keep_unknown=True` (environments
whose `step` itself punishes bad actions, like LightsOut) unknown pieces stay
in place as id -1 and only a missing or empty block is invalid. Bytes that are
not UTF-8 decode to U+FFFD on the host: neither whitespace nor a letter there,
as on device.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
ACTION_SEP = "||"
STRIPPED_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE, "<|im_start|>", "<|im_end|>")  # RAGEN's order
WHITESPACE = (" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
              "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")  # every char with str.isspace(), re's \s
_KELVIN = "\u212a"  # the one non-ASCII char whose str.lower() is ASCII ("k")
_BLANK_RUN = re.compile(r"\s*")  # re's \s, as in the reference pattern
_BLANK_CODES = {n: [int.from_bytes(c.encode(), "big") for c in WHITESPACE if len(c.encode()) == n] for n in (1, 2, 3)}
_TAGS_TL = np.array([list(t.encode().ljust(max(map(len, STRIPPED_TAGS)), b"\0")) for t in STRIPPED_TAGS], np.uint8)
_TAGS_T = np.array([len(t) for t in STRIPPED_TAGS], np.int32)

_METASPACE = "\u2581"
_SENTENCEPIECE_DECODERS = {"Metaspace", "ByteFallback", "Fuse", "Strip"}
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# --------------------------------------------------------------------------- vocab


@struct.dataclass
class VocabTable:
  """Bytes of every token id, for parsing on device.

  bytes_VB: uint8[V, B] UTF-8 bytes of token v, zero-padded.
  len_V: int32[V] number of valid bytes (0 for ids the tokenizer does not know).
  """

  bytes_VB: jax.Array
  len_V: jax.Array


def _gpt2_byte_decoder() -> dict[str, int]:
  """Inverse of GPT-2's bytes_to_unicode: printable stand-in char -> byte."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


def _decoder_types(node) -> set[str]:
  if node is None:
    return set()
  if node["type"] == "Sequence":
    return set().union(*(_decoder_types(d) for d in node["decoders"]))
  if node["type"] == "Replace":
    if node["pattern"].get("String") == _METASPACE and node["content"] == " ":
      return {"Metaspace"}
    return {"Replace"}
  return {node["type"]}


def token_bytes(tokenizer) -> list[bytes]:
  """Bytes each token id contributes to a decoded text (mid-sequence).

  Supports byte-level BPE (GPT-2, Llama-3, SmolLM, Qwen) and SentencePiece-style
  tokenizers (Metaspace "▁" and `<0xNN>` byte fallback). Others raise ValueError.
  """
  backend = tokenizer.backend_tokenizer
  types = _decoder_types(json.loads(backend.to_str())["decoder"])
  byte_level = "ByteLevel" in types
  if not byte_level and not (types and types <= _SENTENCEPIECE_DECODERS):
    raise ValueError(
      f"unsupported tokenizer decoder {sorted(types) or 'None'}: on-device text needs a decoder "
      "that concatenates token bytes (byte-level BPE or SentencePiece-style)"
    )
  added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
  byte_decoder = _gpt2_byte_decoder()
  out = []
  for i in range(backend.get_vocab_size(with_added_tokens=True)):
    piece = backend.id_to_token(i)
    if i in added or piece is None:
      out.append((added.get(i) or "").encode())
    elif byte_level:
      out.append(bytes(byte_decoder[c] for c in piece) if all(c in byte_decoder for c in piece) else piece.encode())
    elif "ByteFallback" in types and _BYTE_FALLBACK.fullmatch(piece):
      out.append(bytes([int(piece[3:5], 16)]))
    else:
      out.append((piece.replace(_METASPACE, " ") if "Metaspace" in types else piece).encode())
  return out


class Vocab:
  """A tokenizer seen as byte strings; built once on the host.

  `table_size` pads the device table for models whose embedding is larger
  than the tokenizer (ids past the tokenizer decode to nothing).
  """

  def __init__(self, tokenizer, table_size: int | None = None):
    self.tokenizer = tokenizer
    self.token_bytes = token_bytes(tokenizer)
    size = max(table_size or 0, len(self.token_bytes))
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    backend = tokenizer.backend_tokenizer
    fallback = {i for i in range(len(self.token_bytes)) if _BYTE_FALLBACK.fullmatch(backend.id_to_token(i) or "")}
    self._id_of_bytes: dict[bytes, int] = {}  # for greedy encoding: no special tokens, byte fallback last
    for i in sorted(range(len(self.token_bytes)), key=lambda i: i in fallback):
      if self.token_bytes[i] and i not in special:
        self._id_of_bytes.setdefault(self.token_bytes[i], i)
    self._max_len = max(len(b) for b in self.token_bytes)
    width = max(self._max_len, 1)
    bytes_VB = np.zeros((size, width), np.uint8)
    len_V = np.zeros((size,), np.int32)
    for i, b in enumerate(self.token_bytes):
      bytes_VB[i, : len(b)] = np.frombuffer(b, np.uint8)
      len_V[i] = len(b)
    self.table = VocabTable(bytes_VB=jnp.asarray(bytes_VB), len_V=jnp.asarray(len_V))

  def decode_bytes(self, ids: Sequence[int]) -> bytes:
    return b"".join(self.token_bytes[i] if 0 <= i < len(self.token_bytes) else b"" for i in ids)

  def encode(self, text: str) -> list[int]:
    """Ids whose bytes are exactly `text`: the tokenizer's own encoding when it
    round-trips, else greedy longest match over the vocabulary."""
    data = text.encode()
    ids = self.tokenizer.encode(text, add_special_tokens=False)
    if self.decode_bytes(ids) == data:
      return list(ids)
    ids, pos = [], 0
    while pos < len(data):
      for size in range(min(self._max_len, len(data) - pos), 0, -1):
        token = self._id_of_bytes.get(data[pos : pos + size])
        if token is not None:
          break
      else:
        raise ValueError(f"tokenizer has no token for byte {data[pos]:#04x} of {text!r}")
      ids.append(token)
      pos += size
    return ids


# --------------------------------------------------------------------------- rendering


@struct.dataclass
class TextTable:
  """One environment's observation template, tokenised for one tokenizer.

  fragment_ids_FL: int32[F, L] token ids of each distinct candidate string.
  fragment_len_F: int32[F] number of ids of each fragment.
  slot_fragments_SC: int32[S, C] fragment of candidate c in slot s (-1 padding).
  max_tokens: static bound on a rendered observation's length.
  """

  fragment_ids_FL: jax.Array
  fragment_len_F: jax.Array
  slot_fragments_SC: jax.Array
  max_tokens: int = struct.field(pytree_node=False)


Template = tuple[tuple[str, ...], ...]


def compile_template(vocab: Vocab, slots: Template) -> TextTable:
  """Tokenise every candidate of every slot once (host side)."""
  index: dict[str, int] = {}
  for slot in slots:
    for text in slot:
      index.setdefault(text, len(index))
  encoded = [vocab.encode(text) for text in index]
  width = max(1, *(len(ids) for ids in encoded))
  fragment_ids = np.zeros((len(encoded), width), np.int32)
  for f, ids in enumerate(encoded):
    fragment_ids[f, : len(ids)] = ids
  fragment_len = np.array([len(ids) for ids in encoded], np.int32)
  slot_fragments = np.full((len(slots), max(len(s) for s in slots)), -1, np.int32)
  for s, slot in enumerate(slots):
    slot_fragments[s, : len(slot)] = [index[text] for text in slot]
  max_tokens = int(sum(max(fragment_len[index[t]] for t in slot) for slot in slots))
  return TextTable(
    fragment_ids_FL=jnp.asarray(fragment_ids),
    fragment_len_F=jnp.asarray(fragment_len),
    slot_fragments_SC=jnp.asarray(slot_fragments),
    max_tokens=max_tokens,
  )


def render_slots(table: TextTable, choice_S: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Concatenate the chosen candidate of each slot (-1: skip the slot).

  Returns (ids int32[max_tokens] zero-padded, length int32).
  """
  num_slots, width = table.slot_fragments_SC.shape[0], table.fragment_ids_FL.shape[1]
  fragment_S = table.slot_fragments_SC[jnp.arange(num_slots), jnp.maximum(choice_S, 0)]
  fragment_S = jnp.where(choice_S >= 0, fragment_S, -1)
  safe_S = jnp.maximum(fragment_S, 0)
  len_S = jnp.where(fragment_S >= 0, table.fragment_len_F[safe_S], 0)
  start_S = jnp.cumsum(len_S) - len_S
  offset_L = jnp.arange(width)
  dest_SL = jnp.where(offset_L < len_S[:, None], start_S[:, None] + offset_L, table.max_tokens)
  ids = jnp.zeros((table.max_tokens,), jnp.int32)
  ids = ids.at[dest_SL.ravel()].set(table.fragment_ids_FL[safe_S].ravel(), mode="drop")
  return ids, jnp.sum(len_S).astype(jnp.int32)


def coordinate_texts(rows: int, cols: int, prefix: str = "") -> tuple[str, ...]:
  """`prefix + "(r, c)"` for every cell, in row-major (flat index) order."""
  return tuple(f"{prefix}({r}, {c})" for r in range(rows) for c in range(cols))


def coordinate_list(mask_HW: np.ndarray) -> str:
  """Host: "(r, c), (r, c)" for the True cells of a mask, row-major (RAGEN's layout)."""
  return ", ".join(f"({r}, {c})" for r, c in np.argwhere(mask_HW))


def coordinate_list_slots(rows: int, cols: int, count: int) -> Template:
  """Slots for up to `count` coordinates joined by ", " (choice = flat index)."""
  return (coordinate_texts(rows, cols),) + (coordinate_texts(rows, cols, ", "),) * (count - 1)


def grid_slots(rows: int, cols: int, symbols: Sequence[str]) -> Template:
  """Slots for a symbol grid, rows joined by "\\n" (choices from `grid_choices`)."""
  row = (tuple(symbols),) * cols
  return row + sum((((("\n",),) + row) for _ in range(rows - 1)), ())


def grid_choices(codes_HW: jax.Array) -> jax.Array:
  """Slot choices for `grid_slots`: symbol codes with the newline slots between rows."""
  rows = codes_HW.shape[0]
  with_newline = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), codes_HW.astype(jnp.int32)], axis=1)
  return with_newline.ravel()[1:]


# --------------------------------------------------------------------------- parsing


def action_name_table(names: Sequence[str], width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Lower-cased ASCII bytes of action names: (uint8[A, L], int32[A])."""
  for name in names:
    if not name or not name.isascii() or name != name.strip() or ACTION_SEP in name \
        or any(tag in name for tag in STRIPPED_TAGS):
      raise ValueError(f"action name {name!r} must be non-empty ASCII, unpadded and free of {ACTION_SEP!r} and tags")
  if len({n.lower() for n in names}) != len(names):
    raise ValueError(f"action names {tuple(names)} must differ in more than case")
  width = width or max(len(n) for n in names)
  chars = np.zeros((len(names), width), np.uint8)
  for a, name in enumerate(names):
    chars[a, : len(name)] = np.frombuffer(name.lower().encode(), np.uint8)
  return chars, np.array([len(n) for n in names], np.int32)


@struct.dataclass
class ParsedActions:
  """One turn's answer. actions_K: int32[K] action ids, -1 past n_actions
  (and for unknown names when keep_unknown); valid: False means format penalty."""

  actions_K: jax.Array
  n_actions: jax.Array
  valid: jax.Array


def answer_parts(turn: str, enable_think: bool = True) -> tuple[str, str] | None:
  """Host reference of the grammar (module docstring) on a turn's text, the prompt's `<think>` included:
  (reasoning, answer with the tags removed and stripped), or None without a well-formed answer block.

  Finds what the reference's `re.search` finds in linear time with `str.find` (the lazy pattern backtracks
  quadratically on e.g. thousands of `<answer>`s): only the first `<think>` can start a match (a later start
  sees a subset of its `</think>`s), the reasoning ends at the first `</think>` followed, after whitespace,
  by `<answer>`, and if that block has no `</answer>` after it no later one does either.
  """
  reasoning, start = "", 0
  if enable_think:
    think = turn.find(THINK_OPEN)
    if think < 0:
      return None
    close = turn.find(THINK_CLOSE, think + len(THINK_OPEN))
    while close >= 0:
      start = _BLANK_RUN.match(turn, close + len(THINK_CLOSE)).end()
      if turn.startswith(ANSWER_OPEN, start):
        break
      close = turn.find(THINK_CLOSE, close + len(THINK_CLOSE))
    if close < 0:
      return None
    reasoning = turn[think + len(THINK_OPEN) : close]
  start = turn.find(ANSWER_OPEN, start)
  end = turn.find(ANSWER_CLOSE, start + len(ANSWER_OPEN)) if start >= 0 else -1
  if end < 0:
    return None
  answer = turn[start + len(ANSWER_OPEN) : end]
  for tag in STRIPPED_TAGS:
    answer = answer.replace(tag, "").strip()
  return reasoning, answer


def parse_actions_text(
  turn: str, action_names: Sequence[str], max_actions: int, keep_unknown: bool = False, enable_think: bool = True
) -> tuple[list[int], bool]:
  """Host reference parser of a turn's text, the prompt's `<think>` included (module docstring): (action ids, valid)."""
  parts = answer_parts(turn, enable_think)
  if parts is None:
    return [], False
  pieces = [p.strip() for p in parts[1].split(ACTION_SEP)]
  pieces = [p for p in pieces if p][:max_actions]
  lookup = {n.lower(): a for a, n in enumerate(action_names)}
  ids = [lookup.get(p.lower(), -1) for p in pieces]
  if keep_unknown:
    return ids, bool(ids)
  known = [a for a in ids if a >= 0]
  return known, bool(ids) and len(known) == len(ids)


def _token_lengths(vocab: VocabTable, ids_T: jax.Array, length: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(ids clipped into the table, byte count of each of ids_T[:length] (0 after it))."""
  known_T = (jnp.arange(ids_T.shape[0]) < length) & (ids_T >= 0) & (ids_T < vocab.len_V.shape[0])
  safe_T = jnp.where(known_T, ids_T, 0)
  return safe_T, jnp.where(known_T, vocab.len_V[safe_T], 0)


def _token_chars(vocab: VocabTable, ids_T: jax.Array, length: jax.Array,
                 buffer_bytes: int | None) -> tuple[jax.Array, jax.Array]:
  """Concatenated bytes of ids_T[:length] as uint8[`buffer_bytes`] (zero-padded; None: T * B, room for any ids)
  and their count."""
  num_tokens, width = ids_T.shape[0], vocab.bytes_VB.shape[1]
  safe_T, len_T = _token_lengths(vocab, ids_T, length)
  start_T = jnp.cumsum(len_T) - len_T
  size = buffer_bytes or num_tokens * width
  offset_B = jnp.arange(width)
  dest_TB = jnp.where(offset_B < len_T[:, None], start_T[:, None] + offset_B, size)
  chars = jnp.zeros((size,), jnp.uint8).at[dest_TB.ravel()].set(vocab.bytes_VB[safe_T].ravel(), mode="drop")
  return chars, jnp.sum(len_T)


def _pattern(text: str) -> tuple[np.ndarray, int]:
  """UTF-8 bytes of `text` for `_hits`: (uint8[L], L)."""
  data = text.encode()
  return np.frombuffer(data, np.uint8), len(data)


def _hits(chars_C: jax.Array, count: jax.Array, pattern_L, length) -> jax.Array:
  """bool[C]: where the bytes pattern_L[:length] start within chars[:count]."""
  size, width = chars_C.shape[0], pattern_L.shape[0]
  padded = jnp.concatenate([chars_C, jnp.zeros((width,), jnp.uint8)])
  hit = jnp.arange(size) + length <= count
  for k in range(width):
    hit &= (padded[k : k + size] == pattern_L[k]) | (k >= length)
  return hit


def _spread(hits_C: jax.Array, width: int, length) -> jax.Array:
  """bool[C]: the bytes covered by occurrences of `length` (<= width) bytes that start at hits_C."""
  covered = hits_C
  for k in range(1, width):
    covered = covered | (jnp.concatenate([jnp.zeros((k,), bool), hits_C[:-k]]) & (k < length))
  return covered


def _find(chars_C: jax.Array, count: jax.Array, pattern: str, start: jax.Array) -> tuple[jax.Array, jax.Array]:
  """First index >= start where `pattern` occurs within chars[:count]; (index, found)."""
  hit = _hits(chars_C, count, *_pattern(pattern)) & (jnp.arange(chars_C.shape[0]) >= start)
  index = jnp.argmax(hit)
  return index, hit[index]


def _blank(chars_C: jax.Array, count: jax.Array) -> jax.Array:
  """bool[C]: the bytes of whitespace characters within chars[:count] (in UTF-8 a character's lead byte
  never occurs inside another one, so a byte match is a character match)."""
  size = chars_C.shape[0]
  padded = jnp.concatenate([chars_C, jnp.zeros((2,), jnp.uint8)]).astype(jnp.int32)
  code_C = (padded[:size] << 16) | (padded[1 : size + 1] << 8) | padded[2:]  # the 3 bytes from each position
  blank = jnp.zeros((size,), bool)
  for length, codes in _BLANK_CODES.items():
    starts = jnp.isin(code_C >> 8 * (3 - length), jnp.array(codes)) & (jnp.arange(size) + length <= count)
    blank |= _spread(starts, length, length)
  return blank


def _compact(keep_C: jax.Array, *arrays_C: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """(count, arrays): the kept entries of each array moved to its front, zero after them."""
  size = keep_C.shape[0]
  dest_C = jnp.where(keep_C, jnp.cumsum(keep_C) - 1, size)
  return jnp.sum(keep_C).astype(jnp.int32), tuple(jnp.zeros_like(x).at[dest_C].set(x, mode="drop") for x in arrays_C)


@struct.dataclass
class _Turn:
  """A reply's bytes and its answer block (byte offsets; see `_read_turn`)."""

  chars: jax.Array
  count: jax.Array
  blank: jax.Array  # bool[C]: bytes of whitespace characters
  reasoning_end: jax.Array  # where the `</think>` closing the reasoning starts (think grammar)
  begin: jax.Array  # the answer block's content is chars[begin:end]
  end: jax.Array
  found: jax.Array


def _read_turn(vocab: VocabTable, ids_T: jax.Array, length: jax.Array, enable_think: bool,
               buffer_bytes: int | None) -> _Turn:
  """The answer block of a reply (ids_T[:length], the generation after the prompt's `<think>`), read on a buffer of
  `buffer_bytes` (`_token_chars`)."""
  chars, count = _token_chars(vocab, ids_T, length, buffer_bytes)
  size = chars.shape[0]
  position = jnp.arange(size)
  blank = _blank(chars, count)
  reasoning_end = jnp.int32(0)
  if enable_think:  # the first `</think>` followed, after whitespace only, by `<answer>`
    solid = jnp.concatenate([jax.lax.cummin(jnp.where(blank, size, position), reverse=True), jnp.array([size])])
    answer_at = solid[jnp.minimum(position + len(THINK_CLOSE), size)]
    opens = jnp.concatenate([_hits(chars, count, *_pattern(ANSWER_OPEN)), jnp.zeros((1,), bool)])
    candidate = _hits(chars, count, *_pattern(THINK_CLOSE)) & opens[answer_at]
    reasoning_end = jnp.argmax(candidate)
    open_at, has_open = answer_at[reasoning_end], candidate[reasoning_end]
  else:
    open_at, has_open = _find(chars, count, ANSWER_OPEN, jnp.int32(0))
  begin = open_at + len(ANSWER_OPEN)
  end, has_close = _find(chars, count, ANSWER_CLOSE, begin)
  return _Turn(chars=chars, count=count, blank=blank, reasoning_end=reasoning_end, begin=begin, end=end,
               found=has_open & has_close)


@functools.partial(jax.jit, static_argnames=("enable_think", "buffer_bytes"))
def reasoning_length(vocab: VocabTable, ids_T: jax.Array, length: jax.Array, enable_think: bool = True,
                     buffer_bytes: int | None = None) -> jax.Array:
  """Tokens of a reply (ids_T[:length]) strictly before the token where the `</think>` that closes its
  reasoning starts; 0 without a well-formed answer block or without `enable_think` (`reasoning_lengths` for a
  batch). `buffer_bytes` must hold the reply's bytes (None: room for any ids).

  The grammar runs on the reply's bytes, so it finds the tags however the model split them into tokens;
  a token that holds bytes before the `</think>` as well is not counted.
  """
  if not enable_think:
    return jnp.zeros((), jnp.int32)
  turn = _read_turn(vocab, ids_T, length, enable_think, buffer_bytes)
  _, len_T = _token_lengths(vocab, ids_T, length)
  return jnp.where(turn.found, jnp.sum(jnp.cumsum(len_T) <= turn.reasoning_end), 0).astype(jnp.int32)


def _shift_right(x: jax.Array, fill) -> jax.Array:
  return jnp.concatenate([jnp.full((1,), fill, x.dtype), x[:-1]])


@functools.partial(jax.jit, static_argnames=("max_actions", "keep_unknown", "enable_think", "buffer_bytes"))
def parse_actions(
  vocab: VocabTable,
  ids_T: jax.Array,
  length: jax.Array,
  names_AL: jax.Array,
  names_len_A: jax.Array,
  max_actions: int,
  keep_unknown: bool = False,
  enable_think: bool = True,
  buffer_bytes: int | None = None,
) -> ParsedActions:
  """Device parser for one reply's ids, the generation after the prompt's `<think>` (`parse_replies` for a
  batch); see module docstring.

  names_AL/names_len_A come from `action_name_table` (or an env's
  `action_name_table(state, params)`). Works on the turn's bytes, in a buffer of
  `buffer_bytes` that must hold them (None: T x (longest token in bytes), room for any ids).
  """
  turn = _read_turn(vocab, ids_T, length, enable_think, buffer_bytes)
  position = jnp.arange(turn.chars.shape[0])
  kelvin = _hits(turn.chars, turn.count, *_pattern(_KELVIN))
  in_block = turn.found & (position >= turn.begin) & (position < turn.end)
  block = _compact(in_block, turn.chars, turn.blank, kelvin)

  def remove(block, tag):  # tags are ASCII and never overlap themselves: str.replace removes every hit
    count, (chars, *_) = block
    tagged = _spread(_hits(chars, count, *tag), _TAGS_TL.shape[1], tag[1])
    return _compact((position < count) & ~tagged, *block[1]), None

  (count, (chars, blank, kelvin)), _ = jax.lax.scan(remove, block, (jnp.asarray(_TAGS_TL), jnp.asarray(_TAGS_T)))
  chars = jnp.where(kelvin, ord("k"), chars)  # after the tags, which are matched with case
  kelvin_tail = _spread(kelvin, len(_KELVIN.encode()), len(_KELVIN.encode())) & ~kelvin
  count, (chars, blank) = _compact((position < count) & ~kelvin_tail, chars, blank)
  content = position < count

  bar = content & (chars == ord("|"))
  bars_before = position - jax.lax.cummax(jnp.where(bar, -1, position)) - 1
  sep_start = bar & jnp.concatenate([bar[1:], jnp.zeros((1,), bool)]) & (bars_before % 2 == 0)
  separator = sep_start | _shift_right(sep_start, False)
  word = content & ~separator & ~blank
  piece = jnp.cumsum(sep_start)
  previous_word = _shift_right(jax.lax.cummax(jnp.where(word, position, -1)), -1)
  first = word & ((previous_word < 0) | (piece[jnp.maximum(previous_word, 0)] != piece))
  rank = jnp.cumsum(first) - 1
  kept = jnp.minimum(jnp.sum(first), max_actions)

  slot = jnp.where(word & (rank < max_actions), rank, max_actions)
  start_K = jax.ops.segment_min(position, slot, max_actions + 1)[:max_actions]
  stop_K = jax.ops.segment_max(position, slot, max_actions + 1)[:max_actions]
  width = names_AL.shape[1]
  gathered_KL = chars[jnp.clip(start_K[:, None] + jnp.arange(width), 0, chars.shape[0] - 1)]
  lower_KL = jnp.where((gathered_KL >= ord("A")) & (gathered_KL <= ord("Z")), gathered_KL + 32, gathered_KL)
  same_KAL = (lower_KL[:, None, :] == names_AL[None]) | (jnp.arange(width) >= names_len_A[:, None])[None]
  match_KA = jnp.all(same_KAL, axis=-1) & ((stop_K - start_K + 1)[:, None] == names_len_A[None])
  in_kept = jnp.arange(max_actions) < kept
  id_K = jnp.where(in_kept & jnp.any(match_KA, -1), jnp.argmax(match_KA, -1), -1).astype(jnp.int32)

  if keep_unknown:
    return ParsedActions(actions_K=id_K, n_actions=kept.astype(jnp.int32), valid=turn.found & (kept > 0))
  known = id_K >= 0
  dest = jnp.where(known, jnp.cumsum(known) - 1, max_actions)
  actions = jnp.full((max_actions,), -1, jnp.int32).at[dest].set(id_K, mode="drop")
  n_known = jnp.sum(known).astype(jnp.int32)
  return ParsedActions(actions_K=actions, n_actions=n_known, valid=turn.found & (kept > 0) & (n_known == kept))


NARROW_TOKEN_BYTES = 16  # bytes per token of the batch parsers' usual buffer (text averages ~4 in LLM vocabularies)
LONG_TOKENS = 2  # ... with room for this many of the vocabulary's longest tokens as well


def reply_bytes(vocab: VocabTable, ids_BT: jax.Array, lengths_B: jax.Array) -> jax.Array:
  """int32[B]: how many bytes each reply ids_BT[b, :lengths_B[b]] decodes to."""
  return jax.vmap(lambda ids, n: jnp.sum(_token_lengths(vocab, ids, n)[1]))(ids_BT, lengths_B)


def narrow_buffer_bytes(num_tokens: int, vocab_width: int, token_bytes: int = NARROW_TOKEN_BYTES) -> int:
  """The batch parsers' usual buffer for replies of `num_tokens` ids: `token_bytes` a token and `LONG_TOKENS` of
  the vocabulary's longest (`vocab_width` bytes), at most the worst case's T x `vocab_width`."""
  return min(num_tokens * min(vocab_width, token_bytes) + LONG_TOKENS * max(vocab_width - token_bytes, 0),
             num_tokens * vocab_width)


def _on_fitting_buffer(vocab: VocabTable, ids_BT: jax.Array, lengths_B: jax.Array, parse_batch, token_bytes: int):
  """`parse_batch(buffer_bytes)` on the `narrow_buffer_bytes` buffer when every reply's bytes fit in it, else on
  the worst case's (the vocabulary's longest token per token), chosen for the whole batch by `lax.cond`.

  The result is the same. The work is not: one long token (a tokenizer trained on repeated prompts learns
  whole sentences; real vocabularies hold long runs of spaces or dashes) would otherwise size every reply's
  buffer, at T x its length. The room for a few long tokens keeps a random model's replies on the narrow buffer.
  """
  num_tokens, width = ids_BT.shape[-1], vocab.bytes_VB.shape[1]
  narrow = narrow_buffer_bytes(num_tokens, width, token_bytes)
  if narrow == num_tokens * width:
    return parse_batch(None)
  fits = jnp.max(reply_bytes(vocab, ids_BT, lengths_B), initial=0) <= narrow
  return jax.lax.cond(fits, lambda: parse_batch(narrow), lambda: parse_batch(None))


def parse_replies(vocab: VocabTable, ids_BT: jax.Array, lengths_B: jax.Array, names_BAL: jax.Array,
                  names_len_BA: jax.Array, max_actions: int, keep_unknown: bool = False, enable_think: bool = True,
                  token_bytes: int = NARROW_TOKEN_BYTES) -> ParsedActions:
  """Jittable: `parse_actions` of a batch of replies, each with its own action names, on a buffer of about
  `token_bytes` a token when every reply fits in it (`_on_fitting_buffer`)."""
  def parse_batch(buffer_bytes):
    parse = functools.partial(parse_actions, max_actions=max_actions, keep_unknown=keep_unknown,
                              enable_think=enable_think, buffer_bytes=buffer_bytes)
    return jax.vmap(parse, in_axes=(None, 0, 0, 0, 0))(vocab, ids_BT, lengths_B, names_BAL, names_len_BA)

  return _on_fitting_buffer(vocab, ids_BT, lengths_B, parse_batch, token_bytes)


def reasoning_lengths(vocab: VocabTable, ids_BT: jax.Array, lengths_B: jax.Array, enable_think: bool = True,
                      token_bytes: int = NARROW_TOKEN_BYTES) -> jax.Array:
  """Jittable: int32[B], `reasoning_length` of a batch of replies, on a buffer of about `token_bytes` a token
  when every reply fits in it (`_on_fitting_buffer`)."""
  def lengths_batch(buffer_bytes):
    return jax.vmap(functools.partial(reasoning_length, enable_think=enable_think, buffer_bytes=buffer_bytes),
                    in_axes=(None, 0, 0))(vocab, ids_BT, lengths_B)

  return _on_fitting_buffer(vocab, ids_BT, lengths_B, lengths_batch, token_bytes)
