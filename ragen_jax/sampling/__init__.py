"""Batched sampling with a KV cache that continues across turns."""

from ragen_jax.sampling.rules import SamplingRule, sample, sampling_logits
from ragen_jax.sampling.sampler import (CacheOverflowError, Generation, SamplerState, decode, extend, prefill,
                                        stop_sequence_array)
from ragen_jax.sampling.session import SamplingSession, generate, pad_batch

__all__ = [
    "CacheOverflowError", "Generation", "SamplerState", "SamplingRule", "SamplingSession", "decode", "extend",
    "generate", "pad_batch", "prefill", "sample", "sampling_logits", "stop_sequence_array",
]
