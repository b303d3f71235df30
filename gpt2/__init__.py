"""A hand-written GPT-2 with an explicit per-layer KV cache."""

from .config import OFFICIAL_CONFIGS, GPT2Config
from .kv_cache import KVCache
from .loading import CheckpointError, load_gpt2, load_safetensors
from .model import GPT2
from .tokenizer import EOT_ID, decode, encode, get_tokenizer

__all__ = [
    "GPT2", "GPT2Config", "OFFICIAL_CONFIGS", "KVCache", "CheckpointError", "load_gpt2",
    "load_safetensors", "EOT_ID", "encode", "decode", "get_tokenizer",
]
