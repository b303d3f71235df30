"""GPT-2's byte-pair-encoding tokenizer, via tiktoken's "gpt2" encoding."""

import functools

EOT_ID = 50256  # <|endoftext|>


@functools.lru_cache(maxsize=1)
def get_tokenizer():
    """The tiktoken Encoding. Its BPE files are downloaded once, or read from TIKTOKEN_CACHE_DIR."""
    import tiktoken

    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise RuntimeError(
            f"Could not load tiktoken's 'gpt2' encoding ({type(e).__name__}: {e}). tiktoken "
            f"downloads its BPE files on first use; offline, point TIKTOKEN_CACHE_DIR at a folder "
            f"that holds them (this repo's CI uses ../shared/tiktoken_cache)."
        ) from None


def encode(text: str) -> list[int]:
    return get_tokenizer().encode(text, allowed_special={"<|endoftext|>"})


def decode(ids) -> str:
    return get_tokenizer().decode(list(ids))
