"""What every notebook does first: find the project, read the switch, load the pair.

The switch is three environment variables, read once when this module is imported:

    GPT2_TARGET  the target p, the model whose output we want   (default: see below)
    GPT2_DRAFT   the draft q, the model that proposes tokens     (default: see below)
    DEVICE       where the models run                            (default cuda if available, else cpu)

A model is an official name (gpt2 ... gpt2-xl), a hub id owner/name, a folder holding
config.json + model.safetensors, or a single .safetensors file. A relative folder or file is read
from the repository root, as on the command line there (GPT2_TARGET=runs/standins/target), not
from notebooks/ where Jupyter runs.

Defaults: with the Hugging Face hub reachable, the real gpt2-large (target) and gpt2 (draft).
Offline (HF_HUB_OFFLINE=1, or the hub cannot be reached), the small pair trained on this machine by
`python -m offline.train_pair --out runs/trained_pair` (GPT2_TRAINED_PAIR names another folder): real
language models of Python code that disagree the way real drafts and targets do.
"""

import os
import sys
from pathlib import Path

# The repo root: the folder holding gpt2/ and spec_decoding/ (this file sits in notebooks/).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402  (after the path set-up above)



def from_root(name: str) -> str:
    """A relative path as read from the repository root (where the README's commands run), when
    it exists there; anything else (a model name, a hub id, an absolute path) as it is."""
    path = Path(name).expanduser()
    return str(ROOT / path) if not path.is_absolute() and (ROOT / path).exists() else name


TRAINED_PAIR = Path(from_root(os.environ.get("GPT2_TRAINED_PAIR", str(ROOT / "runs" / "trained_pair"))))


def hub_reachable(timeout: float = 2.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def default_pair() -> tuple[str, str]:
    """(target, draft) when GPT2_TARGET / GPT2_DRAFT are not set."""
    if hub_reachable():
        return "gpt2-large", "gpt2"
    if not (TRAINED_PAIR / "target").is_dir():
        raise RuntimeError(
            f"The Hugging Face hub is unreachable and there is no trained pair in {TRAINED_PAIR}. "
            f"Make one (about 10 minutes on 2 CPU cores), from the repo root:\n"
            f"    python -m offline.train_pair --out {TRAINED_PAIR}\n"
            f"or set GPT2_TARGET and GPT2_DRAFT to local checkpoint folders.")
    return str(TRAINED_PAIR / "target"), str(TRAINED_PAIR / "draft")


if "GPT2_TARGET" in os.environ and "GPT2_DRAFT" in os.environ:
    TARGET, DRAFT = from_root(os.environ["GPT2_TARGET"]), from_root(os.environ["GPT2_DRAFT"])
else:
    TARGET, DRAFT = default_pair()
    TARGET = from_root(os.environ.get("GPT2_TARGET", TARGET))  # p: the model whose output we want
    DRAFT = from_root(os.environ.get("GPT2_DRAFT", DRAFT))  # q: the model that proposes tokens
DEVICE = os.environ.get("DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def is_code_model(name: str) -> bool:
    """A pair made by offline.train_pair (trained on Python code) leaves a train_pair.json beside it."""
    return (Path(name).parent / "train_pair.json").is_file()


# A prompt in the language the target knows: Python for a trained pair, English for GPT-2.
PROMPT = ("def parse_args(argv=None):\n    parser = argparse.ArgumentParser("
          if is_code_model(TARGET) else
          "In a shocking finding, scientists discovered a herd of unicorns living in")


def token_label(token: int, vocab_size: int) -> str:
    """A token as the notebooks print it: its text for GPT-2's vocabulary, #id for another (the
    tests' tiny models)."""
    from gpt2 import decode

    return repr(decode([token])) if vocab_size == 50257 else f"#{token}"


def encode_prompt(text: str, vocab_size: int) -> list[int]:
    """A prompt as token ids: GPT-2's tokens of text, or fixed ids for a model with another vocabulary."""
    from gpt2 import encode

    return encode(text) if vocab_size == 50257 else list(range(1, 12))


def load_pair():
    """(target, draft) loaded from TARGET and DRAFT onto DEVICE; prints their sizes."""
    from gpt2 import CheckpointError, load_gpt2

    try:
        target = load_gpt2(TARGET, device=DEVICE)
        draft = load_gpt2(DRAFT, device=DEVICE)
    except CheckpointError as e:
        raise CheckpointError(f"{e}\n(GPT2_TARGET and GPT2_DRAFT: a relative path is read from the "
                              f"repository root, {ROOT}, then from the notebook's folder, {Path.cwd()})") from None
    for name, model in (("target", target), ("draft", draft)):
        c = model.config
        print(f"{name:6}: {model.num_parameters() / 1e6:7.1f}M parameters, {c.n_layer} layers, "
              f"n_embd={c.n_embd}, vocab={c.vocab_size}")
    assert target.config.vocab_size == draft.config.vocab_size, "the pair must share one tokenizer"
    return target, draft
