"""Random-weight GPT-2 checkpoints in the exact hub layout, for tests and benchmarks offline.

    python -m offline.random_weights --size gpt2-large --out checkpoints/large      # one model
    python -m offline.random_weights --size tiny --draft-layers 2 --out checkpoints/tiny-pair
    python spec_decoding_generate.py --target checkpoints/tiny-pair/target \
        --draft checkpoints/tiny-pair/draft

Sizes: the four official shapes (gpt2 .. gpt2-xl) and "tiny" (4 blocks of width 128, GPT-2's
vocabulary and 1024 positions: runs the scripts in seconds). With --draft-layers K it writes an
agreeing pair (save_agreeing_pair) into OUT/target and OUT/draft.

The cost of running a model does not depend on its weight values, so a random checkpoint of the
gpt2-large shape times like the real one. `save_agreeing_pair` makes a draft/target pair that
agrees often, like GPT-2 Small and Large do on real text: the draft is the target's first blocks,
and the target's remaining blocks are damped so they change the output little.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from gpt2.config import OFFICIAL_CONFIGS, GPT2Config

LAYOUTS = ("hub", "transformers")
SIZES = {"tiny": GPT2Config(n_layer=4, n_head=4, n_embd=128), **OFFICIAL_CONFIGS}
STANDIN_MARKER = "standins.json"  # beside OUT/target and OUT/draft: what the pair is (benchmark.py reads it)
MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.bias$")


def random_hub_state_dict(config: GPT2Config, seed: int = 0, std: float = 0.02,
                          embedding_std: float | None = None) -> dict[str, torch.Tensor]:
    """Tensors named and shaped as in the openai-community files: linear weights [in, out], and
    the float32 causal-mask buffer h.N.attn.bias [1, 1, n_positions, n_positions] per layer."""
    g = torch.Generator().manual_seed(seed)
    E, P, V = config.n_embd, config.n_positions, config.vocab_size

    def randn(*shape, scale=std):
        return torch.randn(*shape, generator=g) * scale

    emb = std if embedding_std is None else embedding_std
    sd = {"wte.weight": randn(V, E, scale=emb), "wpe.weight": randn(P, E, scale=emb)}
    mask = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
    for i in range(config.n_layer):
        h = f"h.{i}."
        sd[h + "ln_1.weight"] = 1 + randn(E)
        sd[h + "ln_1.bias"] = randn(E)
        sd[h + "attn.bias"] = mask  # the buffer the real files carry; shared storage is fine here
        sd[h + "attn.c_attn.weight"] = randn(E, 3 * E)
        sd[h + "attn.c_attn.bias"] = randn(3 * E)
        sd[h + "attn.c_proj.weight"] = randn(E, E)
        sd[h + "attn.c_proj.bias"] = randn(E)
        sd[h + "ln_2.weight"] = 1 + randn(E)
        sd[h + "ln_2.bias"] = randn(E)
        sd[h + "mlp.c_fc.weight"] = randn(E, 4 * E)
        sd[h + "mlp.c_fc.bias"] = randn(4 * E)
        sd[h + "mlp.c_proj.weight"] = randn(4 * E, E)
        sd[h + "mlp.c_proj.bias"] = randn(E)
    sd["ln_f.weight"] = 1 + randn(E)
    sd["ln_f.bias"] = randn(E)
    return sd


def save_checkpoint(directory, state: dict, config: GPT2Config, layout: str = "hub") -> Path:
    """Write config.json + model.safetensors. layout "hub": keys as on the hub; "transformers":
    as save_pretrained writes them (a "transformer." prefix, plus lm_head.weight)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous().clone() for k, v in state.items()}  # safetensors refuses shared storage
    if layout == "transformers":
        tensors = {"transformer." + k: v for k, v in tensors.items() if not MASK_BUFFER.match(k)}
        tensors["lm_head.weight"] = tensors["transformer.wte.weight"].clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    return directory


def save_random_checkpoint(directory, config: GPT2Config, seed: int = 0, std: float = 0.02,
                           layout: str = "hub", embedding_std: float | None = None) -> Path:
    return save_checkpoint(directory, random_hub_state_dict(config, seed, std, embedding_std),
                           config, layout)


def save_agreeing_pair(target_dir, draft_dir, target_config: GPT2Config, draft_n_layer: int,
                       damping: float = 0.35, seed: int = 0, std: float = 0.02,
                       embedding_std: float = 0.3) -> tuple[Path, Path]:
    """A target and a draft that often pick the same next token.

    The draft is the target's embeddings, first draft_n_layer blocks and final LayerNorm. The
    target's later blocks have their output projections scaled by `damping`, so they nudge the
    residual stream a little. With the defaults, at the gpt2-large shape with a 4-block draft,
    the two agree on most next tokens of real text (teacher-forced; docs/performance.md has the
    measured rate). On text they generate
    themselves random models soon fall into loops that both predict, so acceptance there is near
    1: such a pair shows what the costs allow, not GPT-2's real acceptance. A larger embedding_std
    makes both models near-deterministic copiers (they then agree always).
    """
    sd = random_hub_state_dict(target_config, seed, std, embedding_std)
    for i in range(draft_n_layer, target_config.n_layer):
        for name in ("attn.c_proj", "mlp.c_proj"):
            sd[f"h.{i}.{name}.weight"] = sd[f"h.{i}.{name}.weight"] * damping
            sd[f"h.{i}.{name}.bias"] = sd[f"h.{i}.{name}.bias"] * damping
    draft_config = target_config.with_(n_layer=draft_n_layer)
    draft_sd = {k: v for k, v in sd.items()
                if not k.startswith("h.") or int(k.split(".")[1]) < draft_n_layer}
    return (save_checkpoint(target_dir, sd, target_config),
            save_checkpoint(draft_dir, draft_sd, draft_config))



# ---------------------------------------------------------------------------------------------
# Command line


def file_bytes(config: GPT2Config) -> int:
    """Size of the model.safetensors save_random_checkpoint writes (float32, mask buffers included)."""
    E, P = config.n_embd, config.n_positions
    per_block = 12 * E * E + 13 * E + P * P  # 4 linears + biases + 2 LayerNorms + the mask buffer
    return 4 * (config.n_layer * per_block + (config.vocab_size + P) * E + 2 * E)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline.random_weights",
        description="Write a random-weight GPT-2 checkpoint (config.json + model.safetensors, the "
                    "hub's layout) of an official shape, or a draft/target pair. It runs as fast "
                    "as the real model; its text and acceptance rates are not real.")
    parser.add_argument("--size", choices=list(SIZES), default="tiny",
                        help="tiny (4 blocks, width 128), gpt2, gpt2-medium, gpt2-large or gpt2-xl "
                             "(default: tiny)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--draft-layers", type=int, metavar="K",
                        help="write a pair instead: OUT/target of --size and OUT/draft made of its "
                             "first K blocks, agreeing often (offline.random_weights.save_agreeing_pair)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="overwrite a checkpoint already in --out")
    args = parser.parse_args(argv)
    config = SIZES[args.size]
    if args.draft_layers is not None and not 1 <= args.draft_layers < config.n_layer:
        parser.error(f"--draft-layers must be between 1 and {config.n_layer - 1} for --size "
                     f"{args.size} ({config.n_layer} blocks), got {args.draft_layers}")
    folders = ([args.out / "target", args.out / "draft"] if args.draft_layers is not None
               else [args.out])
    existing = [str(f / "model.safetensors") for f in folders if (f / "model.safetensors").exists()]
    if existing and not args.force:
        parser.error(f"{', '.join(existing)} already exists; not overwriting it. Pass --force to "
                     f"overwrite, or choose another --out.")
    print(f"Writing a random-weight {args.size} ({config.n_layer} blocks, width {config.n_embd}, "
          f"{file_bytes(config) / 1e9:.2f} GB per model) to {args.out} ...", file=sys.stderr, flush=True)
    if args.draft_layers is None:
        save_random_checkpoint(args.out, config, seed=args.seed)
        print(f"Wrote {args.out}. Load it with load_gpt2({str(args.out)!r}).")
        return 0
    recipe = {"what": "random-weight stand-ins: they time like real models; text and acceptance are not real",
              "target": f"{args.size} shape ({config.n_layer} blocks, width {config.n_embd})",
              "draft": f"the target's first {args.draft_layers} blocks; the target's later blocks "
                       f"damped (save_agreeing_pair)",
              "damping": 0.35, "embedding_std": 0.3, "seed": args.seed}
    save_agreeing_pair(folders[0], folders[1], config, args.draft_layers, damping=recipe["damping"],
                       seed=args.seed, embedding_std=recipe["embedding_std"])
    (args.out / STANDIN_MARKER).write_text(json.dumps(recipe, indent=2))
    print(f"Wrote {folders[0]} and {folders[1]}. Try:\n  python spec_decoding_generate.py "
          f"--target {folders[0]} --draft {folders[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
