"""Built-in model shapes against the parameter counts their model cards state, and the bundled checkpoint."""

import dataclasses
import json

import jax
import pytest
from safetensors.numpy import load_file

from ragen_jax.models import ModelConfig
from ragen_jax.models.model import abstract_params
from ragen_jax.models.shapes import SHAPES, shape_config

# (total, non-embedding) parameters in billions as each model card writes them (None: not stated there);
# Llama's are the exact counts Meta publishes.
MODEL_CARDS = {
    "qwen2.5-0.5b": ("0.49", "0.36"), "qwen2.5-1.5b": ("1.54", "1.31"), "qwen2.5-3b": ("3.09", "2.77"),
    "qwen2.5-7b": ("7.61", "6.53"),
    "llama-3.2-1b": ("1.235814400", None), "llama-3.2-3b": ("3.212749824", None),
    "llama-3.1-8b": ("8.030261248", None),
    "qwen3-0.6b": ("0.6", "0.44"), "qwen3-1.7b": ("1.7", "1.4"), "qwen3-4b": ("4.0", "3.6"),
    "qwen3-8b": ("8.2", "6.95"),
    "smollm2-135m": ("0.135", None), "smollm2-1.7b": ("1.71", None),
}


def _close_to_stated(count: int, stated: str) -> bool:
  """Within one unit of the stated figure's last digit (cards round some figures and truncate others)."""
  unit = 10.0 ** -(len(stated.split(".")[1]) if "." in stated else 0)
  return abs(count / 1e9 - float(stated)) <= unit * (1 + 1e-9)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_counts_match_the_model_cards(name):
  config = shape_config(name)
  total = sum(x.size for x in jax.tree.leaves(abstract_params(config)))
  embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
  stated_total, stated_non_embedding = MODEL_CARDS[name]
  assert _close_to_stated(total, stated_total), (total, stated_total)
  if stated_non_embedding:
    assert _close_to_stated(total - embeddings, stated_non_embedding), (total - embeddings, stated_non_embedding)


def test_smollm2_135m_shape_is_the_bundled_checkpoint(smollm2_dir):
  bundled = ModelConfig.from_hf(json.loads((smollm2_dir / "config.json").read_text()))
  shape = shape_config("smollm2-135m")
  ids = {"bos_token_id": None, "eos_token_ids": (), "pad_token_id": None}  # the tokenizer's, not the shape's
  assert dataclasses.replace(bundled, **ids) == dataclasses.replace(shape, **ids)
  count = sum(x.size for x in load_file(str(smollm2_dir / "model.safetensors")).values())
  assert count == sum(x.size for x in jax.tree.leaves(abstract_params(shape)))


def test_an_unknown_shape_names_the_built_in_ones():
  with pytest.raises(ValueError, match="unknown model shape 'qwen2.5-4b'; built in: qwen2.5-0.5b, "):
    shape_config("qwen2.5-4b")
