"""Feature drafters on disk: a folder with model.safetensors (the drafter's own weights only: the
target's embedding, ln_f and head are never copied in), config.json (its kind, sizes, and which
target it was trained for) and README.md (how it was made). offline/train_drafter.py writes them;
load_feature_drafter reads them back, refusing a drafter trained for another target.

A drafter reads the target's features, so it is only meaningful on the target it was trained
with: config.json keeps a fingerprint of that target (target_fingerprint), checked on loading.
"""

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from gpt2 import GPT2
from .drafter import Drafter
from .eagle import EagleDrafter, EagleNet
from .medusa import MedusaDrafter, MedusaHeads

KINDS = ("medusa", "eagle")


def target_fingerprint(target: GPT2) -> str:
    """A short hash of the target's sizes and some of its weights (its first embedding rows and
    ln_f), rounded to bfloat16 so the same checkpoint loaded in float32 or bfloat16 matches."""
    c = target.config
    h = hashlib.sha256(f"{c.n_layer} {c.n_head} {c.n_embd} {c.vocab_size}".encode())
    for tensor in (target.wte(torch.arange(64, device=target.wpe.weight.device)), target.ln_f.weight, target.ln_f.bias):
        h.update(tensor.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def save_feature_drafter(folder: Path, kind: str, module: torch.nn.Module, target: GPT2,
                         config: dict, extra_tensors: dict | None = None) -> None:
    """Write model.safetensors and config.json into `folder` (which must exist)."""
    state = {name: t.detach().contiguous().cpu() for name, t in module.state_dict().items()}
    state.update(extra_tensors or {})
    save_file(state, str(folder / "model.safetensors"))
    c = target.config
    config = {"kind": kind, **config,
              "target": {"n_layer": c.n_layer, "n_head": c.n_head, "n_embd": c.n_embd,
                         "vocab_size": c.vocab_size, "n_positions": c.n_positions,
                         "fingerprint": target_fingerprint(target)}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def parse_drafter_spec(text: str) -> tuple[str, str] | None:
    """"medusa:DIR" or "eagle:DIR" (command lines' --drafter) -> (kind, DIR); None for other text."""
    kind, sep, folder = text.partition(":")
    if kind not in KINDS:
        return None
    if not folder:
        raise ValueError(f"--drafter {kind} needs the drafter's folder: {kind}:DIR (made by "
                         f"python -m offline.train_drafter --kind {kind} --out DIR)")
    return kind, folder


def read_config(folder) -> dict:
    folder = Path(folder).expanduser()
    path = folder / "config.json"
    if not path.is_file() or not (folder / "model.safetensors").is_file():
        raise ValueError(f"{folder} holds no feature drafter (config.json and model.safetensors, made by "
                         f"python -m offline.train_drafter)")
    config = json.loads(path.read_text())
    if config.get("kind") not in KINDS:
        raise ValueError(f"{path}: kind {config.get('kind')!r} is not one of {', '.join(KINDS)}")
    return config


def load_feature_drafter(folder, target: GPT2, kind: str | None = None) -> Drafter:
    """The MedusaDrafter or EagleDrafter saved in `folder`, on the target's device and dtype.
    kind, if given, must match the folder's. ValueError if it was trained for another target."""
    config = read_config(folder)
    if kind is not None and config["kind"] != kind:
        raise ValueError(f"{folder} holds a {config['kind']} drafter, not {kind}: use "
                         f"--drafter {config['kind']}:{folder}")
    trained_for = config["target"]
    if trained_for["fingerprint"] != target_fingerprint(target):
        raise ValueError(
            f"{folder} was trained for another target ({trained_for['n_layer']} layers, width "
            f"{trained_for['n_embd']}, fingerprint {trained_for['fingerprint']}); this target has "
            f"{target.config.n_layer} layers, width {target.config.n_embd}, fingerprint "
            f"{target_fingerprint(target)}. A feature drafter reads its own target's features: train "
            f"one for this target with python -m offline.train_drafter --target DIR.")
    state = load_file(str(Path(folder).expanduser() / "model.safetensors"))
    w = target.wpe.weight  # (the device and dtype to put the drafter on)
    if config["kind"] == "medusa":
        heads = MedusaHeads(target, config["num_heads"], config.get("shared_readout", False))
        heads.load_state_dict(state)
        return MedusaDrafter(target, with_kernels(heads.to(w.device, w.dtype).eval(), target))
    draft_vocab = state.pop("draft_vocab", None)
    net = EagleNet(target)
    net.load_state_dict(state)
    return EagleDrafter(target, with_kernels(net.to(w.device, w.dtype).eval(), target), draft_vocab)


def with_kernels(module: torch.nn.Module, target: GPT2) -> torch.nn.Module:
    """The drafter's linear layers on the target's footing: an accelerated target (a gpt2.speed
    FastGPT2) gets a drafter on this machine's kernels too (gpt2.speed.kernels.attach_kernels: in a
    16-bit format the plain path is far slower than the packed kernels the target runs on); a
    plain target, a plain drafter."""
    if hasattr(target, "lm_head"):  # a FastGPT2 (gpt2.speed is imported only for one)
        from gpt2.speed.kernels import attach_kernels
        attach_kernels(module)
    return module
