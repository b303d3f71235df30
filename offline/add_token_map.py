"""Give a trained EAGLE drafter a reduced draft vocabulary (EAGLE-3's token map) after training:

    python -m offline.add_token_map --drafter DIR --out DIR2 --size 8192 [--text PATH ...]

The map is the corpus's `size` most frequent tokens (train_pair's corpus discovery and split, the
same as `offline.train_drafter --draft-vocab N` computes at the end of training); the weights are
copied unchanged. The drafter then reads out over those rows only: a cheaper draft step, q zero
elsewhere (exactness does not depend on the map). Written atomically; DIR is never changed.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .train_drafter import TrainDrafterError, corpus_tokens
from .train_pair import TrainPairError, write_pair_atomically
from spec_decoding.drafters.feature_files import read_config


def add_token_map(drafter_dir, out, size: int, texts: list[str] | None = None) -> float:
    """Copy the EAGLE drafter in drafter_dir to out with a token map of `size` tokens. Returns the
    share of the corpus's training tokens the map covers."""
    drafter_dir, out = Path(drafter_dir).expanduser(), Path(out).expanduser().resolve()
    try:
        config = read_config(drafter_dir)
    except ValueError as e:
        raise TrainDrafterError(str(e)) from None
    if config["kind"] != "eagle":
        raise TrainDrafterError(f"{drafter_dir} holds a {config['kind']} drafter: a token map is for eagle")
    vocab_size = config["target"]["vocab_size"]
    if not 1 <= size <= vocab_size:
        raise TrainDrafterError(f"--size must be between 1 and the vocabulary size {vocab_size}, got {size}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainDrafterError(f"{out} already exists and is not empty; choose a new --out folder")
    train, _ = corpus_tokens(texts, 1)
    state = load_file(str(drafter_dir / "model.safetensors"))
    state["draft_vocab"] = torch.bincount(train, minlength=vocab_size).topk(size).indices.sort().values
    coverage = float(torch.isin(train, state["draft_vocab"]).float().mean())
    config.update(draft_vocab=size, token_map={"from": str(drafter_dir), "coverage": round(coverage, 4),
                                               "texts": list(texts) if texts else None})

    def write(folder: Path):
        save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        readme = drafter_dir / "README.md"
        note = (f"\n\nToken map added by `python -m offline.add_token_map`: the corpus's {size} most "
                f"frequent tokens ({coverage:.1%} of its training tokens).\n")
        (folder / "README.md").write_text((readme.read_text() if readme.is_file() else "") + note)

    write_pair_atomically(out, write)
    return coverage


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offline.add_token_map",
                                     description="Give an EAGLE drafter a reduced draft vocabulary.")
    parser.add_argument("--drafter", required=True, help="an EAGLE drafter's folder (offline.train_drafter)")
    parser.add_argument("--out", required=True, help="folder to create")
    parser.add_argument("--size", type=int, required=True, help="tokens in the map")
    parser.add_argument("--text", nargs="+", metavar="PATH", help="corpus (default: the standard library's sources)")
    args = parser.parse_args(argv)
    try:
        coverage = add_token_map(args.drafter, args.out, args.size, args.text)
    except TrainPairError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Saved {args.out}: {args.size} tokens, {coverage:.1%} of the corpus's training tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
