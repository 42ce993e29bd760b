"""Answer one chat prompt with a local checkpoint.

  python -m ragen_jax.chat --config=configs/chat.py --config.prompt="Hi"
"""

from __future__ import annotations

from ragen_jax import config as config_lib
from ragen_jax.assembly import load_model, mesh_from_config
from ragen_jax.sampling import generate


def chat(config) -> str:
  """Greedy (or sampled) reply to `config.prompt` through the model's chat template."""
  model, tokenizer = load_model(config.model_path, mesh_from_config(config.mesh), key="model_path",
                                dtype=config.dtype, param_dtype=config.dtype)
  prompt = tokenizer.apply_chat_template([{"role": "user", "content": config.prompt}], tokenize=True,
                                         add_generation_prompt=True)
  prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
  (reply,) = generate(model, [prompt], config.max_new_tokens, temperature=config.temperature, seed=config.seed)
  return tokenizer.decode(reply, skip_special_tokens=True)


def main(config):
  print(f"user: {config.prompt}")
  print(f"assistant: {chat(config)}")


if __name__ == "__main__":
  config_lib.run(main, default_config="configs/chat.py")
