"""GPT-2's byte-pair-encoding tokenizer, built from the BPE files shipped in gpt2/tokenizer_files/.

The files (encoder.json, vocab.bpe) are OpenAI's, unchanged (see tokenizer_files/SOURCE and
LICENSE). We read them here and hand them to tiktoken, which does the fast encoding: the result is
the same Encoding as `tiktoken.get_encoding("gpt2")`, but with no download and no TIKTOKEN_CACHE_DIR.
"""

import functools
import hashlib
import json
from pathlib import Path

EOT_ID = 50256  # <|endoftext|>

TOKENIZER_FILES = Path(__file__).resolve().parent / "tokenizer_files"
# sha256 of the two files as OpenAI publishes them (the hashes tiktoken checks its downloads against).
_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}

# How GPT-2 cuts text into pieces before merging bytes: contractions, runs of letters, of digits, of
# other symbols (each with an optional leading space), and whitespace. This is tiktoken's spelling
# of the pattern in OpenAI's release, with possessive quantifiers (++) so the regex never backtracks:
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _read(name: str) -> bytes:
    path = TOKENIZER_FILES / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RuntimeError(f"GPT-2's tokenizer file {path} is missing: reinstall the package "
                           f"(or restore the file from git).") from None
    if hashlib.sha256(data).hexdigest() != _SHA256[name]:
        raise RuntimeError(f"GPT-2's tokenizer file {path} is not OpenAI's file (its sha256 differs): "
                           f"restore it from git or reinstall the package.")
    return data


def _byte_of_char() -> dict[str, int]:
    """OpenAI's files spell each byte as one printable character: bytes that print (other than the
    space) stand for themselves, the other 68 are shifted to chr(256), chr(257), ... in order.
    (So a leading space, byte 32, reads as 'Ġ' = chr(288).) Returns {character: byte}."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    shifted = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(shifted)}


def mergeable_ranks() -> dict[bytes, int]:
    """{token's bytes: token id} for the 50,256 ordinary tokens.

    The ids are the merge order: first the 256 single bytes (in the order of _byte_of_char), then
    one token per line of vocab.bpe ("first second" = the merge that makes it). tiktoken merges
    the pair of lowest rank first, which is why the id must equal the merge rank. encoder.json
    spells the same table directly: we check the two agree."""
    byte_of = _byte_of_char()
    as_latin1 = str.maketrans({c: chr(b) for c, b in byte_of.items()})  # each character -> chr(its byte)

    def to_bytes(text: str) -> bytes:
        return text.translate(as_latin1).encode("latin-1")

    ranks = {bytes([b]): i for i, b in enumerate(byte_of.values())}
    merges = _read("vocab.bpe").decode("utf-8").split("\n")[1:-1]  # line 0 is "#version: 0.2"
    for line in merges:
        first, second = line.split()
        ranks[to_bytes(first) + to_bytes(second)] = len(ranks)

    encoder = {to_bytes(text): i for text, i in json.loads(_read("encoder.json")).items()
               if text != "<|endoftext|>"}
    if encoder != ranks:
        raise RuntimeError(f"GPT-2's tokenizer files in {TOKENIZER_FILES} disagree with each other.")
    return ranks


@functools.lru_cache(maxsize=1)
def get_tokenizer():
    """GPT-2's tokenizer: a tiktoken Encoding, identical to tiktoken.get_encoding("gpt2")."""
    import tiktoken

    return tiktoken.Encoding(name="gpt2", pat_str=PAT_STR, mergeable_ranks=mergeable_ranks(),
                             special_tokens={"<|endoftext|>": EOT_ID}, explicit_n_vocab=50257)


def encode(text: str) -> list[int]:
    return get_tokenizer().encode(text, allowed_special={"<|endoftext|>"})


def decode(ids) -> str:
    return get_tokenizer().decode(list(ids))
