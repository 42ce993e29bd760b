"""GGUF -> Hugging Face conversion of the bundled SmolLM2-135M-Instruct, checked with transformers/torch.

Peers: transformers' PyTorch Llama on the converted directory, llama.cpp's own
permute (as written in convert_hf_to_gguf.py), and a GPT-2-style reference BPE
(encoder.py's algorithm) over the GGUF merges for the tokenizer.
"""

import math

import gguf
import numpy as np
import pytest
import regex
import torch
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from ragen_jax.models import gguf_convert

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
  return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
  return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()


def llama_cpp_permute(w, n_head):
  """`LlamaModel.permute` from llama.cpp's convert_hf_to_gguf.py."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head, head_dim", [(9, 64), (3, 64), (1, 8), (2, 4)])
def test_unpermute_inverts_llama_cpp_permute(n_head, head_dim):
  w = np.random.default_rng(n_head).normal(size=(n_head * head_dim, 5))
  permuted = llama_cpp_permute(w, n_head)
  assert not np.array_equal(permuted, w)
  np.testing.assert_array_equal(gguf_convert.unpermute_rotary_rows(permuted, n_head), w)
  np.testing.assert_array_equal(llama_cpp_permute(gguf_convert.unpermute_rotary_rows(w, n_head), n_head), w)


def test_unpermute_rejects_rows_not_split_over_heads():
  with pytest.raises(ValueError, match="cannot un-permute 10 rows over 3 heads"):
    gguf_convert.unpermute_rotary_rows(np.zeros((10, 4)), 3)


def test_config_matches_upstream_smollm2(smollm2_dir):
  config = transformers.AutoConfig.from_pretrained(smollm2_dir)
  upstream = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
  assert {k: getattr(config, k) for k in upstream} == upstream
  assert config.rope_parameters["rope_theta"] == 100000.0


def test_checkpoint_loads_without_missing_or_unexpected_keys(smollm2_dir):
  _, info = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, output_loading_info=True)
  assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()


def test_greedy_next_token_after_capital_of_france_is_paris(hf_model, tokenizer):
  inputs = tokenizer("The capital of France is", return_tensors="pt")
  with torch.no_grad():
    logits_V = hf_model(**inputs).logits[0, -1]
  assert tokenizer.decode(int(logits_V.argmax())) == " Paris"


@pytest.mark.parametrize("prompt, continuation", [
    ("One, two, three, four, five,", " six, seven, eight"),
    ("1, 2, 3, 4, 5,", " 6, 7, 8"),
])
def test_greedy_continues_counting(hf_model, tokenizer, prompt, continuation):
  # Position-sensitive: with q/k left in llama.cpp's rotary layout the model loses count.
  inputs = tokenizer(prompt, return_tensors="pt")
  out = hf_model.generate(**inputs, max_new_tokens=9, do_sample=False)
  assert tokenizer.decode(out[0, inputs.input_ids.shape[1]:]).startswith(continuation)


def test_weights_equal_transformers_own_gguf_loader(smollm2_dir):
  pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file")
  from safetensors.numpy import load_file
  gguf_path = gguf_convert.bundled_gguf_path()
  peer = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                           dtype=torch.float32)
  ours = load_file(smollm2_dir / "model.safetensors")
  peer_weights = {k: v.numpy() for k, v in peer.state_dict().items() if k != "lm_head.weight"}  # tied
  assert peer_weights.keys() == ours.keys()
  for name, w in ours.items():
    np.testing.assert_array_equal(w, peer_weights[name], err_msg=name)


def _reference_bpe_ids(text, tokens, merges):
  """GPT-2 encoder.py BPE with llama.cpp's `smollm` pre-tokenizer (digits isolated, then the GPT-2 split)."""
  vocab = {t: i for i, t in enumerate(tokens)}
  ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
  spell = bytes_to_unicode()
  gpt2_split = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
  ids = []
  for chunk in regex.split(r"(\p{N})", text):
    for word in gpt2_split.findall(chunk):
      parts = [spell[b] for b in word.encode("utf-8")]
      while len(parts) > 1:
        rank, i = min((ranks.get(pair, math.inf), i) for i, pair in enumerate(zip(parts, parts[1:])))
        if rank == math.inf:
          break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
      ids += [vocab[p] for p in parts]
  return ids


REFERENCE_TEXTS = [
    " Paris",
    "The capital of France is Paris.",
    "Numbers 12345 and 3.14159, 1,000,000",
    "  leading and trailing spaces  \tand tabs\n\nnewlines\r\n",
    "I'm sure they'll say it's fine, don't you?",
    "Café naïve résumé 日本語のテキスト 😀👍🏽",
    "def f(x):\n    return x ** 2  # comment",
]


def test_tokenizer_matches_reference_bpe_and_round_trips(tokenizer):
  reader = gguf.GGUFReader(gguf_convert.bundled_gguf_path())
  tokens = reader.fields["tokenizer.ggml.tokens"].contents()
  merges = reader.fields["tokenizer.ggml.merges"].contents()
  for text in REFERENCE_TEXTS:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == _reference_bpe_ids(text, tokens, merges), text
    assert tokenizer.decode(ids) == text
  assert len(tokenizer.encode(" Paris")) == 1


def test_tokenizer_adds_no_bos_and_keeps_special_tokens_whole(tokenizer):
  assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
  assert tokenizer("hello").input_ids == tokenizer.encode("hello", add_special_tokens=False)
  inner_ids = tokenizer.encode("user\nhi", add_special_tokens=False)
  assert tokenizer("<|im_start|>user\nhi<|im_end|>").input_ids == [1, *inner_ids, 2]
  assert tokenizer.decode([1, 2], skip_special_tokens=True) == ""


def test_chat_template_renders_im_start_markers(tokenizer):
  messages = [{"role": "user", "content": "What is 2+2?"}]
  text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert text == (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
  assert ids == tokenizer.encode(text, add_special_tokens=False)
  assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_missing_and_corrupt_files_give_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="GGUF file not found"):
    gguf_convert.convert_gguf_to_hf(tmp_path / "absent.gguf", tmp_path / "out")
  (tmp_path / "garbage.gguf").write_bytes(b"definitely not a GGUF file")
  with pytest.raises(ValueError, match="not a readable GGUF file.*magic"):
    gguf_convert.convert_gguf_to_hf(tmp_path / "garbage.gguf", tmp_path / "out")
  truncated = tmp_path / "truncated.gguf"
  with open(gguf_convert.bundled_gguf_path(), "rb") as src:
    truncated.write_bytes(src.read(3_000_000))
  with pytest.raises(ValueError, match="not a readable GGUF file"):
    gguf_convert.convert_gguf_to_hf(truncated, tmp_path / "out")


def _write_tiny_gguf(path, arch, tensors):
  writer = gguf.GGUFWriter(path, arch)
  for key, value in [("block_count", 1), ("context_length", 16), ("embedding_length", 8),
                     ("feed_forward_length", 16), ("attention.head_count", 2)]:
    writer.add_uint32(f"{arch}.{key}", value)
  writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
  for name, array in tensors.items():
    writer.add_tensor(name, array)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


@pytest.mark.parametrize("arch, tensors, message", [
    ("qwen2", {}, "unsupported GGUF architecture 'qwen2'"),
    ("llama", {"blk.0.attn_norm.weight": np.ones(8)}, "tensor 'blk.0.attn_norm.weight' has unsupported GGUF type F64"),
    ("llama", {"rope_freqs.weight": np.ones(4, np.float32)}, "tensor 'rope_freqs.weight' has no Hugging Face"),
    ("llama", {"token_embd.weight": np.ones((4, 8), np.float32)}, "GGUF lacks 10 Llama tensors"),
])
def test_unsupported_content_names_the_culprit(tmp_path, arch, tensors, message):
  path = _write_tiny_gguf(tmp_path / "tiny.gguf", arch, tensors)
  with pytest.raises(ValueError, match=message):
    gguf_convert.convert_gguf_to_hf(path, tmp_path / "out")


def test_interrupted_conversion_leaves_no_directory(tmp_path, monkeypatch):
  def convert_then_fail(gguf_path, out_dir):
    (out_dir / "config.json").write_text("{}")
    raise KeyboardInterrupt

  monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", convert_then_fail)
  with pytest.raises(KeyboardInterrupt):
    gguf_convert.bundled_model_dir(tmp_path)
  assert list(tmp_path.iterdir()) == []


def test_bundled_model_dir_converts_once_and_honours_env(smollm2_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(gguf_convert, "convert_gguf_to_hf", lambda *args: pytest.fail("converted again"))
  assert gguf_convert.bundled_model_dir(smollm2_dir.parent) == smollm2_dir
  (tmp_path / smollm2_dir.name).mkdir()
  monkeypatch.setenv("RAGEN_JAX_CACHE", str(tmp_path))
  assert gguf_convert.bundled_model_dir() == tmp_path / smollm2_dir.name
  assert sorted(p.name for p in smollm2_dir.iterdir()) == [
      "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_bundled_tokenizer_dir_holds_the_full_conversions_tokenizer(smollm2_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(gguf_convert, "_state_dict", lambda *args: pytest.fail("read the tensors"))
  tokenizer_dir = gguf_convert.bundled_tokenizer_dir(tmp_path)
  assert tokenizer_dir == tmp_path / f"{smollm2_dir.name}-tokenizer"
  assert sorted(p.name for p in tokenizer_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (tokenizer_dir / name).read_bytes() == (smollm2_dir / name).read_bytes(), name
