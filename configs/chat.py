"""One greedy chat reply from a local checkpoint (default: the bundled SmolLM2-135M-Instruct)."""

import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.model_path = ""  # a local HF directory; "" = the bundled SmolLM2-135M-Instruct
  config.dtype = "float32"
  config.prompt = "What is the capital of France? Answer in one sentence."
  config.max_new_tokens = 48
  config.temperature = 0.0
  config.seed = 0
  config.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  return config
