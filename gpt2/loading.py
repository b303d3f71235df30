"""Load GPT-2 weights from the Hugging Face hub or from local safetensors files.

Where the weights come from (`load_gpt2`'s argument):
  - "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl": the openai-community repos on the hub,
  - any other hub repo id "owner/name",
  - a local directory with model.safetensors (and config.json; without it the config is inferred),
  - a single .safetensors file (config inferred from the tensor shapes, head size 64).

Two key layouts exist. The hub files hold "wte.weight", "h.0.attn.c_attn.weight", ... with the
linear weights stored [in, out] (OpenAI's Conv1D), plus a causal-mask buffer "h.N.attn.bias" per
layer that we never read. Files written by transformers' save_pretrained prefix every key with
"transformer." and may hold "lm_head.weight" (a copy of wte.weight). Both load.

device and dtype are checked before anything is read or downloaded (gpt2.speed.device): dtype "auto"
(the default) is decided per model once its shapes are known: on CPU the format measured fastest
on this machine for those shapes (float32, float16 weights, or bfloat16; gpt2.speed.kernels), with one
line saying which and why; bfloat16/float16 on CUDA, float16 on MPS; names as strings work.

On a CPU, loading attaches the fast face (gpt2/speed/kernels.py): each linear layer and the head run on
the kernel chosen for this machine, measured once and kept in the user's cache folder; one line
says which and where the choice is kept. kernels=False (or GPT2_FAST_LINEAR=0 for every load)
keeps the model plain PyTorch, as gpt2/model.py reads.

When a name looks like a hub repo id but the hub cannot be reached, loading fails within seconds
(one quick probe of the endpoint instead of huggingface_hub's retry ladder) unless the files are
in the local hub cache, and the message names the local folder it also looked for.

Weights are never unpickled, and the model is built on the "meta" device (no memory, no random
init) so the loaded tensors become its parameters directly: peak memory stays near the size of
the weights.
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
from .speed.device import auto_format, dtype_note, log_kernel_choice, note_once, resolve_device, resolve_dtype
from .speed.fast_linear import QUANTIZE_CHOICES, dequantize_int8, int8_per_channel
from .speed import kernels as fast_face
from .speed import weight_cache
from .speed.stored_weights import STORABLE, StoredWeight, give_back_freed_memory
from .model import GPT2

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


def load_gpt2(name_or_path, device=None, dtype="auto", quantize=None, kernels=True, compile=False) -> GPT2:
    """Load a GPT-2 from the hub or a local path (see the module docstring) in eval mode.

    device: "cpu" (None), "cuda", "cuda:N", "mps", "auto" or a torch.device.
    dtype: "auto" (gpt2.speed.device.auto_format: on CPU the format measured fastest here for this
    model's shapes, which may be float16 weights in a float32 model, i.e. quantize="fp16"),
    "float32", "bfloat16", "float16" or the torch dtype; None keeps the dtype stored in the file.
    A bad choice is a ValueError; a 16-bit dtype without a fast path on this CPU runs on PyTorch's
    plain path, with one line saying so and what is faster here.
    quantize="int8": weight-only int8 for the linear layers and the tied head/embedding,
    symmetric per output channel, computed from the file's weights at load time. The
    parameters then hold the dequantized weights in `dtype` (the model *is* the quantized one,
    whichever kernel runs it); on CPU the linears run on the int8 bytes (gpt2.speed.fast_linear).
    quantize="fp16": the same weights rounded to float16 in a float32 model (dtype "auto" or
    "float32"); on an x86 CPU the linears read the 16-bit weights and multiply in float32.
    kernels=False: the plain face, every linear layer on F.linear as gpt2/model.py reads (dtype
    "auto" is then float32); True attaches gpt2/speed/kernels.py's (unless GPT2_FAST_LINEAR=0).
    compile: True gives the model the compiled decode path (gpt2.speed.compiled; on a CUDA GPU its block
    recorded as CUDA graphs, gpt2.speed.cuda_graph), "graph" the CUDA-graph path with the eager block (a
    CUDA GPU), "fused" that path with five Triton kernels a block (gpt2.speed.fused_step), "auto" the
    faster of eager and compiled on a CPU, of eager and CUDA graphs on a GPU, measured here (one line
    says which and why), False (default) keeps it eager."""
    device = resolve_device("cpu" if device is None else device)
    if compile is not False:
        # The compiled paths (which register a custom op) are imported only when asked for: every
        # check a grader forks imports the project afresh.
        from .speed.compiled import COMPILE_CHOICES
        if compile not in COMPILE_CHOICES:
            raise ValueError(f"compile must be one of {COMPILE_CHOICES}, got {compile!r}")
    resolve_dtype(dtype, device)  # a bad dtype fails here, before anything is downloaded
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    if quantize == "fp16":
        dtype = fp16_weights_dtype(dtype, device)
    config, weights_path = resolve_checkpoint(name_or_path)
    model = load_safetensors(weights_path, config, device=device, dtype=dtype, quantize=quantize,
                             kernels=kernels)
    if compile:
        attach_decode_path(model, compile, device, Path(weights_path).parent.name)
    return model


def attach_decode_path(model: GPT2, compile, device: torch.device, name: str) -> None:
    """load_gpt2's compile (True, "graph", "fused" or "auto") on the loaded model."""
    from .speed.compiled import choose_compiled, compile_decode
    from .speed.cuda_graph import choose_graphed, graph_decode

    if compile == "auto":  # a GPU's choice is between eager and CUDA graphs, a CPU's eager and compiled
        _, why = (choose_graphed if device.type == "cuda" else choose_compiled)(model)
        note_once(f"note: compile auto for {name}: {why}", sys.stderr)
    elif compile in ("graph", "fused"):
        graph_decode(model, fused=compile == "fused")
    elif device.type == "cuda":  # on a GPU, the compiled block recorded as CUDA graphs
        graph_decode(model, compiled=True)
    else:
        compile_decode(model)


def fp16_weights_dtype(dtype, device) -> torch.dtype:
    """quantize="fp16" keeps float16 weights in a float32 model (the kernel multiplies in float32):
    dtype "auto", None or float32 -> float32; anything else is a ValueError."""
    if dtype in ("auto", None) or resolve_dtype(dtype, device) == torch.float32:
        return torch.float32
    raise ValueError(f"quantize='fp16' stores the weights in float16 and computes in float32; it "
                     f"needs dtype 'float32' (or 'auto'), not {dtype!r}")


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


def load_safetensors(path, config: GPT2Config | None = None, device=None, dtype=None,
                     quantize=None, kernels=True) -> GPT2:
    """Build a GPT2 whose parameters are the tensors of a safetensors file (either key layout).
    device, dtype, quantize and kernels as in load_gpt2, except that dtype None (the default)
    keeps the file's."""
    kernels = kernels and fast_face.ENABLED
    path = Path(path)
    device = resolve_device("cpu" if device is None else device)
    if quantize == "fp16":
        dtype = fp16_weights_dtype(dtype, device)
    resolve_dtype(dtype, device)  # a bad dtype fails before the file is opened
    try:
        with safe_open(path, framework="pt", device="cpu") as f:  # reads only the header
            file_keys = list(f.keys())
            prefix = "transformer." if any(k.startswith("transformer.") for k in file_keys) else ""
            # name in our model -> shape in the file
            shapes = {k.removeprefix(prefix): tuple(f.get_slice(k).get_shape()) for k in file_keys}
        if config is None:
            config = infer_config(shapes, path)
            print(f"note: no {CONFIG_NAME} for {path}: the config was inferred from its tensors "
                  f"(n_layer={config.n_layer}, n_embd={config.n_embd}, n_positions="
                  f"{config.n_positions}, vocab_size={config.vocab_size}) with n_head = n_embd / 64 "
                  f"= {config.n_head}, as in every official GPT-2. If this model has other heads, put "
                  f"its {CONFIG_NAME} in one folder with the weights (named {WEIGHTS_NAME}) and pass "
                  f"the folder.", file=sys.stderr)
        with torch.device("meta"), no_weight_init():
            model = GPT2(config)  # shapes only, no memory
        dtype, quantize = resolve_format(dtype, quantize, device, config, path, kernels)
        expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
        check_tensor_names_and_shapes(shapes, expected, path)
        stored = kernels and device.type == "cpu"  # the fast face holds what its kernels read
        fmt = storage_format(dtype, quantize, path)
        plan = fast_face.planned_path(fmt, dtype or torch.float32, config) if stored else None
        # Kept only where the kernels' choice is known before the weights are read (not on the
        # load that measures it); float32 computes nothing to keep but its kernel's panels.
        key = (weight_cache.key(path, fmt, dtype or torch.float32, plan)
               if plan is not None and (fmt != "float32" or plan in fast_face.STORABLE_PATHS) else None)
        cached, cache_file = (weight_cache.lookup(key) or (None, None)) if key else (None, None)
        state = {}
        for name in expected:
            if cached and name in cached:  # mapped from the weight cache, nothing computed
                state[name] = held_weight(fmt, cached[name], expected[name], dtype)
                continue
            # The file is memory-mapped, and every page read stays in this process's memory
            # until the file is closed. Reopening it per tensor releases each tensor's pages
            # right after its copy is made, so the peak stays near the size of the weights.
            with safe_open(path, framework="pt", device="cpu") as f:
                tensor = f.get_tensor(prefix + name)
            if name.endswith(CONV1D_SUFFIXES):
                tensor = tensor.t()  # [in, out] -> [out, in]
            linear = name.endswith(CONV1D_SUFFIXES) or name == "wte.weight"
            kernel = fast_face.path_for_weight(plan, fmt, dtype or torch.float32, tensor.numel()) if stored else None
            if stored and linear and (quantize is not None or kernel in fast_face.STORABLE_PATHS):
                # what the format stores, packed now where the kernel's panels replace it (one
                # weight at a time: the peak stays near the size of what the model holds)
                layouts = format_layouts(tensor if quantize else tensor.to(dtype or tensor.dtype), quantize)
                if kernel in fast_face.STORABLE_PATHS:
                    layouts = fast_face.packed_layouts(kernel, layouts)
                state[name] = held_weight(fmt, layouts, expected[name], dtype)
                big = tensor.numel() * tensor.element_size() >= TRIM_BYTES
                del tensor, layouts
                if big:  # (its float32 copy and temporaries go back now, not at the end of the load)
                    give_back_freed_memory()
                continue
            if quantize == "int8" and linear:  # the plain face: float32 parameters of the int8 values
                q, scale = int8_per_channel(tensor)
                tensor = dequantize_int8(q, scale, dtype or tensor.dtype)
            if quantize == "fp16" and linear:
                tensor = tensor.to(torch.float16)  # the model's values are the 16-bit ones
            state[name] = tensor.to(device=device, dtype=dtype or tensor.dtype).contiguous()
            del tensor
    except SafetensorError as e:
        raise CheckpointError(
            f"{path} is not a readable safetensors file ({e}). It may be truncated or corrupt: "
            f"delete it and download it again."
        ) from None
    stored_weights = {name: t for name, t in state.items() if isinstance(t, StoredWeight)}
    model.load_state_dict({name: t for name, t in state.items() if name not in stored_weights}, strict=False,
                          assign=True)
    for name, weight in stored_weights.items():
        set_stored_parameter(model, name, weight)
    del state, stored_weights
    give_back_freed_memory()
    if kernels:
        said = fast_face.attach_kernels(model)
        if key is not None:
            said.append(keep_weights(model, key, cached, cache_file))
        if said:  # logged, not printed: the scripts show model.kernel_choice in their own summary
            model.kernel_choice = "; ".join(said)
            log_kernel_choice(model.kernel_choice)
    model.quantize = quantize  # the weights' format, where not the dtype's ("int8", "fp16" or None)
    return model.requires_grad_(False).eval()


def set_stored_parameter(model, name: str, weight: StoredWeight) -> None:
    """Make a StoredWeight the parameter `name` of model as it is (nn.Parameter(...) would detach it,
    and the first operation on a tensor subclass costs seconds of imports inside torch)."""
    module_name, _, attribute = name.rpartition(".")
    weight._is_param = True  # what nn.Parameter marks a tensor subclass with: isinstance(w, nn.Parameter)
    model.get_submodule(module_name)._parameters[attribute] = weight


def storage_format(dtype, quantize, path) -> str:
    """The weight format a loaded model stores: "int8", "fp16" (float16 weights in a float32
    model), or the dtype's name ("float32", "bfloat16", "float16"; dtype None: the file's)."""
    if quantize is not None:
        return quantize
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    with safe_open(path, framework="pt", device="cpu") as f:
        return str(f.get_tensor(next(k for k in f.keys() if k.endswith("wpe.weight"))).dtype).removeprefix("torch.")


# A weight read from the file at least this large gives its freed copy back to the system at once
# (give_back_freed_memory), so that the freed blocks of many weights do not add up during the load.
TRIM_BYTES = 1 << 24
# Rows of a weight quantized at a time: the float32 temporaries of int8_per_channel stay small.
QUANTIZE_ROWS = 4096


def format_layouts(weight: torch.Tensor, quantize: str) -> dict[str, torch.Tensor]:
    """What a format stores of one weight [out, in] read from the file: int8 bytes and scales
    (quantized QUANTIZE_ROWS rows at a time: int8_per_channel is per row), float16 values, or
    (quantize None) the weight itself."""
    if quantize is None:
        return {"plain": weight.contiguous()}
    if quantize == "fp16":
        return {"half": weight.to(torch.float16)}
    q = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], QUANTIZE_ROWS):
        q[start:start + QUANTIZE_ROWS], scale[start:start + QUANTIZE_ROWS] = int8_per_channel(
            weight[start:start + QUANTIZE_ROWS])
    return {"q": q, "scale": scale}


def held_weight(fmt: str, layouts: dict, shape, dtype) -> torch.Tensor:
    """The parameter for one weight held as `layouts`: the plain tensor itself, or a StoredWeight
    of shape [out, in] reading as dtype (float32 where the file's dtype is kept)."""
    if set(layouts) == {"plain"}:
        return layouts["plain"]
    return StoredWeight(fmt, layouts, shape, dtype or torch.float32)


def keep_weights(model, key: dict, cached, cache_file) -> str:
    """After attach_kernels: the load line's part about the weight cache. A load that mapped the
    cache says so; any other keeps what it computed (the stored weights' plain-tensor layouts:
    int8 bytes and scales, 16-bit values, our C kernel's panels) in the cache."""
    if cached:
        return (f"weights mapped from the weight cache {weight_cache_name(cache_file)} ({key['format']}, "
                f"nothing quantized or packed again)")
    held = {}
    for name, p in model.named_parameters():
        if isinstance(p, StoredWeight):
            kept = {layout: t for layout, t in p.layouts.items()
                    if layout in STORABLE and not (layout == "plain" and key["format"] == "float32")}
        elif key["format"] != "float32" and (name.endswith(CONV1D_SUFFIXES) or name == "wte.weight"):
            kept = {"plain": p.data}  # (a bfloat16 or float16 model's values, cast from the file)
        else:
            continue
        if kept:
            held[name] = kept
    written = weight_cache.store(key, held)
    if written is None:
        return f"{key['format']} weights computed now (no weight cache)"
    return (f"{key['format']} weights computed now and kept in {weight_cache_name(written)} "
            f"(the next load maps them)")


def weight_cache_name(path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text.startswith(home + "/") else text


def resolve_format(dtype, quantize, device, config: GPT2Config, path, kernels=True
                   ) -> tuple[torch.dtype | None, str | None]:
    """(dtype, quantize) to load with, now that the model's shapes are known. "auto" without a
    quantize option is decided here (gpt2.speed.device.auto_format; float32 for the plain face) and said
    in one line; a 16-bit dtype without a fast path on this CPU gets its one-line note."""
    if isinstance(dtype, str) and dtype.lower() == "auto" and quantize is None:
        dtype, quantize, why = auto_format(device, config if kernels else None, format_logits(path, config, device))
        if why is not None and device.type == "cpu":
            name = {"fp16": "float16 weights (float32 math)", "int8": "int8 weights (float32 model)"}.get(
                quantize, str(dtype).removeprefix("torch."))
            note_once(f"note: dtype auto for {Path(path).parent.name or path}: {name}, {why}", sys.stderr)
        return dtype, quantize
    dtype = resolve_dtype(dtype, device, config)
    if dtype is not None and quantize != "int8":
        note_once(dtype_note(dtype, device), sys.stderr)
    return dtype, quantize


def format_logits(path, config: GPT2Config, device):
    """(format, tokens [B, T]) -> logits [B, T, vocab] of the model at path loaded in one of
    gpt2.speed.kernels.AUTO_FORMATS: what dtype="auto" measures a format's fidelity to float32 with
    (one model at a time, freed before the next)."""
    def logits_in(fmt: str, tokens: torch.Tensor) -> torch.Tensor:
        dtype, quantize = fast_face.AUTO_FORMATS[fmt]
        model = load_safetensors(path, config, device=device, dtype=dtype, quantize=quantize)
        with torch.inference_mode():
            return model(tokens.to(device)).float().cpu()
    return logits_in


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
