"""Real `transformers` tokenizers built offline for the env text tests.

* `byte_bpe`: GPT-2/SmolLM-style byte-level BPE trained on env text, with
  `<think>`, `</think>`, `<answer>`, `</answer>` as added tokens.
* `sentencepiece`: Llama-style Unigram with Metaspace ("▁") pieces, byte
  fallback (`<0xNN>`) and a Strip decoder; "√" is not in its vocabulary.
"""
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import envs
from envs import text

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def env_corpus() -> list[str]:
  """Fragments, instructions and answers the envs produce, for tokenizer training."""
  lines = []
  for name in envs.REGISTRY:
    env, params = envs.make(name)
    lines += [piece for slot in env.template(params) for piece in slot]
    lines.append(env.instruction_text(params, 10))
  lines += [f"<think>go</think><answer>{a} || {b}</answer>" for a in ("Up", "Left") for b in ("Down", "Right")]
  return lines * 3


def byte_bpe_tokenizer() -> PreTrainedTokenizerFast:
  backend = Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=SPECIAL
  )
  backend.train_from_iterator(env_corpus(), trainer)
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
  tokenizer.add_tokens(["<think>", "</think>", "<answer>", "</answer>"])
  return tokenizer


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
  chars = [chr(c) for c in range(33, 127)]
  words = ["Up", "Down", "Left", "Right", "answer", "toggle", "Coordinates", "Player", "Grid", "Map", "rows"]
  pieces = [("<unk>", 0.0)] + [(f"<0x{b:02X}>", -20.0) for b in range(256)]
  pieces += [(c, -5.0) for c in chars] + [("\u2581", -4.0), ("\n", -5.0)]
  pieces += [(w, -3.0) for w in words] + [("\u2581" + w, -3.0) for w in words] + [("||", -3.0), ("</", -3.0)]
  for s in SPECIAL:
    pieces.append((s, 0.0))
  backend = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
  backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
  backend.decoder = decoders.Sequence(
    [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
  )
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
  tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
  return tokenizer


@pytest.fixture(scope="session", params=["byte_bpe", "sentencepiece"])
def tokenizer(request):
  return {"byte_bpe": byte_bpe_tokenizer, "sentencepiece": sentencepiece_tokenizer}[request.param]()


@pytest.fixture(scope="session")
def vocab(tokenizer):
  return text.Vocab(tokenizer)


@pytest.fixture
def rng():
  return np.random.default_rng(0)
