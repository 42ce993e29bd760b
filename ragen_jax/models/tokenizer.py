"""A small byte-level BPE tokenizer trained on environment text, saved as a HF tokenizer directory.

The demo model uses it: a few hundred tokens cover the prompts, observations and
reasoning of the grid environments, so a model of a few million parameters can
learn them on CPU. Chat turns use ChatML, like SmolLM2 and Qwen2.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|im_end|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", EOS)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")  # whole tokens, so stops and parsing are cheap
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, out_dir: str | os.PathLike | None = None,
                    split_words: bool = True,
                    isolated_words: Iterable[str] = ()) -> transformers.PreTrainedTokenizerFast:
  """Trains a byte-level BPE on `texts`; saves it to `out_dir` when given.

  With `split_words=False` merges may cross spaces, so the fixed phrases of the
  prompts become a few long tokens (short sequences for a CPU demo). Each of
  `isolated_words` (e.g. the action names) is never merged with the text around it
  (one token when the texts use it often), so a decision reads the same wherever it appears.
  """
  backend = Tokenizer(models.BPE())
  words = sorted(isolated_words, key=len, reverse=True)  # longest first, so no word splits a longer one
  isolate = [pre_tokenizers.Split(Regex("|".join(map(re.escape, words))), behavior="isolated")] if words else []
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      *isolate,
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words),
  ])
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  backend.train_from_iterator(texts, trainer)
  backend.add_tokens(list(TAG_TOKENS))
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=backend, bos_token=None, eos_token=EOS, pad_token="<|endoftext|>",
      unk_token=None, chat_template=CHATML_TEMPLATE)
  if out_dir is not None:
    tokenizer.save_pretrained(out_dir)
  return tokenizer
