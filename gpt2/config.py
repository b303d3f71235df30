"""GPT-2 hyper-parameters: one dataclass, plus the four official sizes."""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    n_positions: int = 1024  # longest sequence the position embedding covers
    vocab_size: int = 50257  # GPT-2's BPE vocabulary (50256 is <|endoftext|>)
    layer_norm_epsilon: float = 1e-5
    # GPT-2 uses GELU with the tanh approximation ("gelu_new" in Hugging Face configs).

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPT2Config.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT2Config: n_embd={self.n_embd} must be divisible by n_head={self.n_head}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_name(cls, name: str) -> "GPT2Config":
        """One of "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"."""
        if name not in OFFICIAL_CONFIGS:
            raise ValueError(
                f"Unknown GPT-2 size {name!r}; the official sizes are {', '.join(OFFICIAL_CONFIGS)}"
            )
        return OFFICIAL_CONFIGS[name]

    @classmethod
    def from_hf_dict(cls, d: dict) -> "GPT2Config":
        """Read the fields we need from a Hugging Face GPT-2 config.json."""
        try:
            return cls(
                n_layer=d["n_layer"],
                n_head=d["n_head"],
                n_embd=d["n_embd"],
                n_positions=d.get("n_positions", d.get("n_ctx", 1024)),
                vocab_size=d["vocab_size"],
                layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
            )
        except KeyError as e:
            raise ValueError(f"config.json is missing the GPT-2 field {e.args[0]!r}") from None

    def to_hf_dict(self) -> dict:
        """The config.json that Hugging Face's GPT2LMHeadModel reads."""
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_positions": self.n_positions,
            "n_ctx": self.n_positions,
            "vocab_size": self.vocab_size,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "tie_word_embeddings": True,
            # <|endoftext|>, where the vocabulary has it
            **({"bos_token_id": 50256, "eos_token_id": 50256} if self.vocab_size > 50256 else {}),
        }

    def with_(self, **changes) -> "GPT2Config":
        return replace(self, **changes)


OFFICIAL_CONFIGS = {
    "gpt2": GPT2Config(n_layer=12, n_head=12, n_embd=768),  # 124M parameters
    "gpt2-medium": GPT2Config(n_layer=24, n_head=16, n_embd=1024),  # 355M
    "gpt2-large": GPT2Config(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": GPT2Config(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}
