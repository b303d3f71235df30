"""gpt2.tokenizer: GPT-2's tokenizer from the files in the package, with no download and no
TIKTOKEN_CACHE_DIR, identical to tiktoken's own "gpt2" encoding."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2.tokenizer import EOT_ID, decode, encode, get_tokenizer

ROOT = Path(__file__).resolve().parents[1]
# tiktoken's own copy of the BPE files, beside the project in dev sessions and CI: only the
# comparison with tiktoken's encoding uses it.
SHARED_TIKTOKEN = ROOT.parent / "shared" / "tiktoken_cache"


def varied_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """n strings that exercise every branch of GPT-2's pre-tokenizer pattern and the byte fallback:
    English and code lines from this repo, contractions, digits, runs of whitespace, accented
    letters, CJK, emoji (multi-byte, some joined by ZWJ), control characters, lone surrogate-free
    random code points, and the special token in odd places."""
    rng = random.Random(seed)
    lines = [line for path in sorted((ROOT / "gpt2").glob("*.py")) + [ROOT / "README.md"]
             for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    pieces = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", " don't", "I'M", "12345", " 3.14",
              "\t", "\n\n", "   ", " \n ", "\r\n", "café", "naïve", "Ελληνικά", "русский", "日本語",
              "中文字符", "한국어", "😀", "👩‍👩‍👧", "🇫🇷", "\u200b", "\x00", "\x7f", "©®", "<|endoftext|>",
              "<|endoftext", "|>", "def f(x):", "    return x**2", "  ", "!!!", "...", "$$"]
    blocks = [(0x20, 0x7F), (0xA0, 0x250), (0x370, 0x500), (0x3040, 0x3100), (0x4E00, 0x4F00),
              (0x1F300, 0x1F650), (0x0, 0x20)]
    corpus = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            text = rng.choice(lines)
        elif kind == 1:
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        else:
            lo, hi = rng.choice(blocks)
            text = "".join(chr(rng.randrange(lo, hi)) if rng.random() < 0.8 else rng.choice(" \n")
                           for _ in range(rng.randint(1, 30)))
        corpus.append(text)
    return corpus


def test_known_ids_and_round_trip():
    """A few ids everyone can check against GPT-2 (e.g. Hugging Face's tokenizer), and decode undoes
    encode on the whole corpus, special token included."""
    assert encode("Hello world") == [15496, 995]
    assert encode(" the") == [262]
    assert encode("<|endoftext|>") == [EOT_ID]
    assert get_tokenizer().n_vocab == 50257
    for text in varied_corpus(1000):
        assert decode(encode(text)) == text


@pytest.mark.skipif(not SHARED_TIKTOKEN.is_dir(), reason="no copy of tiktoken's BPE files beside the repo")
def test_same_ids_as_tiktokens_gpt2(monkeypatch):
    """Encoding for encoding, the same as tiktoken.get_encoding("gpt2") (which reads its own copy of
    the files from the shared cache), on 3,000 varied strings."""
    import tiktoken

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))
    theirs, ours = tiktoken.get_encoding("gpt2"), get_tokenizer()
    assert ours._mergeable_ranks == theirs._mergeable_ranks
    assert ours._special_tokens == theirs._special_tokens
    corpus = varied_corpus()
    assert ours.encode_ordinary_batch(corpus) == theirs.encode_ordinary_batch(corpus)
    assert ([ours.encode(t, allowed_special="all") for t in corpus]
            == [theirs.encode(t, allowed_special="all") for t in corpus])


def test_no_download_and_no_cache_dir(tmp_path):
    """A fresh interpreter with tiktoken's cache pointed at an empty folder (so any attempt to read or
    download the BPE files would fail offline or leave a file there) still encodes."""
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    env.update(TIKTOKEN_CACHE_DIR=str(empty), PYTHONPATH=str(ROOT))
    code = "from gpt2 import encode; print(encode('Hello world'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[15496, 995]"
    assert list(empty.iterdir()) == []


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    """A corrupted copy of a BPE file is reported by name, not silently used."""
    import gpt2.tokenizer as tokenizer

    for name in ("encoder.json", "vocab.bpe"):
        (tmp_path / name).write_bytes((tokenizer.TOKENIZER_FILES / name).read_bytes())
    with open(tmp_path / "vocab.bpe", "a", encoding="utf-8") as f:
        f.write("a b\n")
    monkeypatch.setattr(tokenizer, "TOKENIZER_FILES", tmp_path)
    with pytest.raises(RuntimeError, match="vocab.bpe is not OpenAI's file"):
        tokenizer.mergeable_ranks()
