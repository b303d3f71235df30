"""Where a GPT-2's weights come from and how they are read: the Hugging Face hub or local
safetensors files (gpt2/loading.py builds the model from them).

Sources (`load_gpt2`'s argument):
  - "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl": the openai-community repos on the hub,
  - any other hub repo id "owner/name",
  - a local directory with model.safetensors (and config.json; without it the config is inferred),
  - a single .safetensors file (config inferred from the tensor shapes, head size 64).

Two key layouts exist. The hub files hold "wte.weight", "h.0.attn.c_attn.weight", ... with the
linear weights stored [in, out] (OpenAI's Conv1D), plus a causal-mask buffer "h.N.attn.bias" per
layer that we never read. Files written by transformers' save_pretrained prefix every key with
"transformer." and may hold "lm_head.weight" (a copy of wte.weight). Both load.

When a name looks like a hub repo id but the hub cannot be reached, loading fails within seconds
(one quick probe of the endpoint instead of huggingface_hub's retry ladder) unless the files are
in the local hub cache, and the message names the local folder it also looked for.

Weights are never unpickled. Device and dtype names are checked here too, before anything is read
or downloaded.
"""

import contextlib
import difflib
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open

from .config import GPT2Config

OFFICIAL_REPOS = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
}
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
# The four linear layers per block, stored [in, out] in the checkpoints (we use [out, in]).
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Seconds to wait for the hub endpoint to answer before calling it unreachable.
HUB_PROBE_TIMEOUT = 4.0
# Tensors a checkpoint may carry that the model does not need.
IGNORED = re.compile(r"^(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")
# The ways to a pair with no hub (the offline/ tools), named in every error that may mean "no hub".
TRAIN_PAIR_COMMAND = "python -m offline.train_pair --out runs/trained_pair"
STANDINS_COMMAND = "python -m offline.random_weights --size tiny --draft-layers 2 --out runs/standins"


class CheckpointError(Exception):
    """The weights could not be found, downloaded or read. The message says what to do."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "half": "float16"}


def resolve_dtype(dtype) -> torch.dtype | None:
    """A name ("float32", "bfloat16", "float16", or fp32/bf16/fp16) or one of those torch dtypes
    -> the torch dtype; None -> None (keep the checkpoint's dtype). Anything else is a ValueError
    that lists what works."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.").lower()
        dtype = DTYPES.get(DTYPE_ALIASES.get(name, name), dtype)
    if dtype in DTYPES.values():
        return dtype
    raise ValueError(f"dtype {dtype!r} is not supported: use float32 (the default), bfloat16 or "
                     f"float16, or \"auto\" for the format measured fastest here (gpt2.speed). The model "
                     f"runs in floating point only (int8 weights: quantize=\"int8\").")


def resolve_device(name: str = "auto") -> torch.device:
    """"auto" -> cuda, then mps, then cpu. A named device must exist on this machine; otherwise a
    ValueError says what is missing and what to pass instead."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(name)!r}: CUDA is not available here (no NVIDIA GPU, or a "
                             f"CPU-only PyTorch build). Use cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(name)!r}: this machine has {torch.cuda.device_count()} "
                             f"CUDA device(s), numbered from 0")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {str(name)!r}: Apple's MPS is not available here. Use cpu or auto.")
    elif device.type != "cpu":
        raise ValueError(f"device {str(name)!r}: only cpu, cuda and mps are supported")
    return device


def peek_config(name_or_path) -> GPT2Config | None:
    """The config of a model without reading or downloading its weights, where that is cheap: an
    official name, or a local folder with config.json. None otherwise (other hub repos, files)."""
    text = str(name_or_path)
    folder = Path(text).expanduser()
    if (folder / CONFIG_NAME).is_file() and (folder / WEIGHTS_NAME).is_file():
        return read_config(folder / CONFIG_NAME)
    if text in OFFICIAL_REPOS:
        return GPT2Config.from_name(text)
    return None


def resolve_checkpoint(name_or_path) -> tuple[GPT2Config | None, Path]:
    """Find (and if needed download) the weights. Returns (config or None to infer, weights path)."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    is_hub_name = looks_like_hub_name(text)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(
                f"{path} is not a .safetensors file. Only safetensors weights are read (pickled "
                f".bin/.pt files can run code when loaded); pass a model.safetensors file or its folder."
            )
        return None, path
    # A folder of models (e.g. runs/trained_pair, holding target/ and draft/) is local whatever its name.
    if path.is_dir() and not (path / WEIGHTS_NAME).is_file() and model_subfolders(path):
        raise CheckpointError(f"The folder {path} has no {WEIGHTS_NAME}: {which_subfolder(path)}")
    # A local folder wins over a hub name only if it holds weights (this repo has a gpt2/ folder).
    if path.is_dir() and ((path / WEIGHTS_NAME).is_file() or not is_hub_name):
        weights = path / WEIGHTS_NAME
        if not weights.is_file():
            raise CheckpointError(
                f"The folder {path} has no {WEIGHTS_NAME}. Put the weights there (with "
                f"{CONFIG_NAME}), or pass the .safetensors file itself."
            )
        config_file = path / CONFIG_NAME
        return (read_config(config_file) if config_file.is_file() else None), weights
    if is_hub_name:
        if text in OFFICIAL_REPOS:
            return download_from_hub(OFFICIAL_REPOS[text])
        # "checkpoints/target" is a valid repo id too: every hub error also says what is local.
        local = (f"the folder {path} here has no {WEIGHTS_NAME}" if path.is_dir()
                 else f"there is no folder {path} here{did_you_mean(path)}")
        return download_from_hub(text, local_note=local)
    if text.endswith(".safetensors") or "/" in text or text.startswith((".", "~")) or "\\" in text:
        raise CheckpointError(f"No such file or folder: {path}{did_you_mean(path)}")
    close = difflib.get_close_matches(text, list(OFFICIAL_REPOS) + local_names(Path(".")), n=1)
    raise CheckpointError(
        f"Unknown model {text!r}. Use one of {', '.join(OFFICIAL_REPOS)}, a hub repo id "
        f"'owner/name', a local folder with {CONFIG_NAME} + {WEIGHTS_NAME}, or a .safetensors file."
        + (f" Did you mean {close[0]}?" if close else "")
    )


def local_names(folder: Path) -> list[str]:
    """The names in a folder (hidden ones left out), or [] if it cannot be listed."""
    try:
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


def closest_existing_path(path: Path) -> Path | None:
    """The existing path nearest to a missing one, for "did you mean": from the deepest folder of
    path that exists, each further part replaced by the closest name there (difflib). None if some
    part has no close name."""
    base = path
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.exists():
        return None
    guess = base
    for part in path.parts[len(base.parts):]:
        close = difflib.get_close_matches(part, local_names(guess), n=1)
        if not close:
            return None
        guess = guess / close[0]
    return guess


def model_subfolders(folder: Path) -> list[Path]:
    """The subfolders of folder that hold a model (model.safetensors), e.g. a pair's target/, draft/."""
    return [folder / name for name in local_names(folder) if (folder / name / WEIGHTS_NAME).is_file()]


def which_subfolder(folder: Path) -> str:
    """What to pass instead of a folder of models: the pair's two halves, or one of its models."""
    names = [sub.name for sub in model_subfolders(folder)]
    if "target" in names and "draft" in names:
        return (f"it holds a pair (target/ and draft/), not one model. Pass {folder / 'target'} as "
                f"the target and {folder / 'draft'} as the draft, e.g. --target {folder / 'target'} "
                f"--draft {folder / 'draft'}.")
    return f"it holds {len(names)} model folder(s): pass one of {', '.join(str(folder / n) for n in names)}."


def did_you_mean(path: Path) -> str:
    """" (did you mean X?)" for a missing path when a close one exists, else ""."""
    guess = closest_existing_path(path)
    if guess is None or guess == path:
        return ""
    if guess.is_dir() and not (guess / WEIGHTS_NAME).is_file() and model_subfolders(guess):
        return f" (did you mean {guess}? {which_subfolder(guess)})"
    return f" (did you mean {guess}?)"


def looks_like_hub_name(text: str) -> bool:
    """An official name, or "owner/name" (which may also be a local folder: resolve_checkpoint decides)."""
    return text in OFFICIAL_REPOS or (
        re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None and not text.endswith(".safetensors"))


def check_local_checkpoint(name_or_path) -> None:
    """Raise now the CheckpointError that load_gpt2 would raise for a local path (missing, a folder
    of models, no weights), reading at most its config.json: the scripts check both models this way
    before loading either. Hub names are left to load_gpt2."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if not looks_like_hub_name(text) or (path.is_dir() and model_subfolders(path)):
        resolve_checkpoint(text)


def download_from_hub(repo_id: str, local_note: str | None = None) -> tuple[GPT2Config, Path]:
    """Fetch config.json and model.safetensors with huggingface_hub (its cache, HF_HUB_OFFLINE,
    HF_ENDPOINT and HF_TOKEN apply). local_note, for a name that could also be a local path, is
    added to every error ("there is no folder checkpoints/tagret here")."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    also = f"; and {local_note}" if local_note else ""
    # Unreachable hub: use the local cache if it has the files, else fail now, not after retries.
    unreachable = None if hub_offline() else hub_unreachable_reason()
    files = {}
    for filename in (CONFIG_NAME, WEIGHTS_NAME):
        try:
            files[filename] = Path(huggingface_hub.hf_hub_download(
                repo_id, filename, local_files_only=unreachable is not None))
        except RepositoryNotFoundError:
            raise CheckpointError(
                f"The hub has no repo {repo_id!r} (or it is private: set HF_TOKEN){also}. Check the name."
            ) from None
        except Exception as e:  # offline, unreachable, missing file, ...
            if unreachable or hub_offline():
                why = (f"the Hugging Face hub could not be reached ({unreachable})" if unreachable
                       else "HF_HUB_OFFLINE is set")
                raise CheckpointError(
                    f"Could not get {repo_id!r}: {why}, and its {filename} is not in the local "
                    f"hub cache{also}.\n{offline_ways_forward(repo_id)}"
                ) from None
            raise CheckpointError(
                f"Could not get {filename} of {repo_id!r} from the Hugging Face hub "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}){also}.\n"
                f"{offline_ways_forward(repo_id)}"
            ) from None
    return read_config(files[CONFIG_NAME]), files[WEIGHTS_NAME]


def offline_ways_forward(repo_id: str) -> str:
    """The ways forward with no hub, as exact command lines: train a small real pair here, make
    random-weight stand-ins of the real shapes, or bring the files from elsewhere."""
    short = repo_id.split("/")[-1]
    trained = Path("runs/trained_pair")
    if (trained / "target").is_dir() and (trained / "draft").is_dir():  # made here already: use it
        first = ("  - use the small pair already trained here (runs/trained_pair): pass both "
                 "--target runs/trained_pair/target --draft runs/trained_pair/draft")
    else:
        first = (f"  - train a small real target/draft pair on this machine (about 10 minutes on 2 CPU "
                 f"cores, no download):\n      {TRAIN_PAIR_COMMAND}\n"
                 f"    then pass --target runs/trained_pair/target --draft runs/trained_pair/draft")
    ways = [
        first,
        f"  - or make a random-weight stand-in pair (seconds; --size gpt2-large for the real shape, "
        f"which times like the real model; their drafts agree almost always, unlike real models):\n"
        f"      {STANDINS_COMMAND}\n"
        f"    then pass --target runs/standins/target --draft runs/standins/draft",
        f"  - or download the repo's {CONFIG_NAME} and {WEIGHTS_NAME} elsewhere and pass their "
        f"folder instead, e.g. load_gpt2('/path/to/{short}') or --target/--draft /path/to/folder",
    ]
    if not hub_offline():
        ways.append("  - or, where the hub cache holds the files, set HF_HUB_OFFLINE=1 so that "
                    "nothing is asked of the network")
    return "Ways forward:\n" + "\n".join(ways)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_unreachable_reason(timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """None if the hub endpoint (HF_ENDPOINT) answers one HTTP request within timeout seconds, else
    why not. Any HTTP answer counts as reachable; the request goes through huggingface_hub's own
    session, so its proxy settings apply."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as e:  # refused, timed out, no DNS, no route, ...
        return f"{constants.ENDPOINT}: {type(e).__name__}: {str(e) or 'no answer'}"
    return None


def read_config(path: Path) -> GPT2Config:
    try:
        return GPT2Config.from_hf_dict(json.loads(Path(path).read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); download it again.") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


@contextlib.contextmanager
def checkpoint_errors(path: Path):
    """A file safetensors cannot read becomes a CheckpointError that says what to do."""
    try:
        yield
    except SafetensorError as e:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({e}). It may be truncated or corrupt: "
            f"delete it and download it again."
        ) from None


def read_header(path: Path) -> tuple[str, dict]:
    """(key prefix, {name in our model: shape in the file}) from the file's header alone. The
    prefix is "transformer." in files written by transformers' save_pretrained, else ""."""
    with safe_open(path, framework="pt", device="cpu") as f:
        file_keys = list(f.keys())
        prefix = "transformer." if any(k.startswith("transformer.") for k in file_keys) else ""
        return prefix, {k.removeprefix(prefix): tuple(f.get_slice(k).get_shape()) for k in file_keys}


def read_tensor(path: Path, prefix: str, name: str) -> torch.Tensor:
    """One tensor of the model from the file, linear weights turned to [out, in]. The file is
    memory-mapped, and every page read stays in this process's memory until the file is closed:
    opening it per tensor releases each tensor's pages right after its copy is made, so the peak
    stays near the size of the weights."""
    with safe_open(path, framework="pt", device="cpu") as f:
        tensor = f.get_tensor(prefix + name)
    return tensor.t() if name.endswith(CONV1D_SUFFIXES) else tensor  # [in, out] -> [out, in]


def inferred_config(shapes: dict, path: Path) -> GPT2Config:
    """infer_config, with one line saying that it was inferred and how to give the real one."""
    config = infer_config(shapes, path)
    print(f"note: no {CONFIG_NAME} for {path}: the config was inferred from its tensors "
          f"(n_layer={config.n_layer}, n_embd={config.n_embd}, n_positions="
          f"{config.n_positions}, vocab_size={config.vocab_size}) with n_head = n_embd / 64 "
          f"= {config.n_head}, as in every official GPT-2. If this model has other heads, put "
          f"its {CONFIG_NAME} in one folder with the weights (named {WEIGHTS_NAME}) and pass "
          f"the folder.", file=sys.stderr)
    return config


def empty_model(cls, config: GPT2Config):
    """A model of class cls built on the "meta" device (shapes only: no memory, no random init),
    whose parameters are then assigned the loaded tensors."""
    with torch.device("meta"), no_weight_init():
        return cls(config)


@contextlib.contextmanager
def no_weight_init():
    """Skip torch.nn.init while building a model whose weights are about to be replaced. (On the
    meta device there is nothing to initialise anyway, but the first normal_() there costs about a
    second of one-off set-up inside torch.)"""
    names = ("normal_", "uniform_", "kaiming_uniform_", "ones_", "zeros_")
    saved = {name: getattr(nn.init, name) for name in names}
    for name in names:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def infer_config(shapes: dict, path) -> GPT2Config:
    """Config from tensor shapes: wte [vocab, n_embd], wpe [n_positions, n_embd], h.N.* layers."""
    if "wte.weight" not in shapes or "wpe.weight" not in shapes:
        raise CheckpointError(
            f"{path} has no wte.weight/wpe.weight tensors: it is not a GPT-2 checkpoint."
        )
    vocab_size, n_embd = shapes["wte.weight"]
    n_positions = shapes["wpe.weight"][0]
    layers = {int(m.group(1)) for k in shapes if (m := re.match(r"h\.(\d+)\.", k))}
    if n_embd % 64:
        raise CheckpointError(
            f"{path}: n_embd={n_embd} is not a multiple of 64, so the number of heads can't be "
            f"inferred; put a config.json beside the weights."
        )
    return GPT2Config(n_layer=len(layers), n_head=n_embd // 64, n_embd=n_embd,
                      n_positions=n_positions, vocab_size=vocab_size)


def check_tensor_names_and_shapes(shapes: dict, expected: dict, path) -> None:
    """shapes: name -> shape in the file; expected: name -> shape in our model ([out, in])."""
    for name, shape in expected.items():
        file_shape = tuple(reversed(shape)) if name.endswith(CONV1D_SUFFIXES) else shape
        if name not in shapes:
            raise CheckpointError(
                f"{path} is missing the tensor {name!r}: the file is incomplete or does not match "
                f"its config (n_layer etc.). Download it again, or fix config.json."
            )
        if shapes[name] != file_shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {list(shapes[name])}, expected "
                f"{list(file_shape)} for this config. The config.json does not match the weights."
            )
    unexpected = [k for k in shapes if k not in expected and not IGNORED.match(k)]
    if unexpected:
        raise CheckpointError(
            f"{path} holds tensors this GPT-2 config does not have ({', '.join(unexpected[:5])}"
            f"{', ...' if len(unexpected) > 5 else ''}). The config.json does not match the weights."
        )
