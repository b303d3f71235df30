"""Shared fixtures. Every checkpoint is made here, on the fly, in temporary folders, in exactly the
layout of the Hugging Face hub files (random weights: the hub is unreachable offline)."""

import atexit
import fcntl
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Kernels are chosen without timing (each format's default kernel, float32 for dtype "auto"), so no
# result depends on how busy the machine is; the tests of the measurement fake its timings. And
# the kept choices go to a folder of this run's own, never the user's cache (scripts run by the
# tests inherit both).
os.environ["GPT2_MEASURE_KERNELS"] = "0"
_KERNEL_CACHE = tempfile.mkdtemp(prefix="gpt2-kernel-cache-")
atexit.register(shutil.rmtree, _KERNEL_CACHE, ignore_errors=True)
os.environ["GPT2_KERNEL_CACHE"] = str(Path(_KERNEL_CACHE) / "kernels.json")
# Without a CUDA GPU, Triton's interpreter runs the fused step's GPU kernels on CPU tensors
# (tests/test_fused_step.py). Triton reads this when it is imported (first use of the fused step).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gpt2 import GPT2Config, load_gpt2  # noqa: E402
from offline.random_weights import save_agreeing_pair, save_random_checkpoint  # noqa: E402

# The test models are tiny: threads buy nothing and, on a busy 2-core machine, cost a lot.
torch.set_num_threads(1)
# The processes the tests start (notebook kernels, the scripts) too: two test workers on 2 cores,
# each running a child whose OpenMP threads spin while they wait for a core, took 1.5-5x as long.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A tiny config for fast tests; TINY_VOCAB for exact enumeration of output distributions.
TINY = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=100)
TINY_VOCAB = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32, vocab_size=16)
# Real GPT-2 tokenizer vocabulary, tiny width: for the scripts, which decode text.
TINY_TEXT = GPT2Config(n_layer=4, n_head=2, n_embd=64, n_positions=128, vocab_size=50257)
# The target of the agreeing pair (pair_dirs / target / draft below): its draft is its first 2 blocks.
AGREEING_TARGET = TINY.with_(n_layer=4)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The scripts say when the machine is busy (gpt2.speed.machine_load: a load average above the core
    count); the tests check their other output, so in this process the machine looks quiet
    whatever its load (tests/test_machine_load.py fakes a busy one)."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture(autouse=True)
def one_thread():
    """Every test starts on one thread, whatever the one before it did: a script's main() run in
    this process sets PyTorch's threads from its --threads (once a benchmark's default of 2 stayed
    set, and the tests after it in that worker, thousands of tiny forwards whose 2 threads wait for
    each other on a busy machine, ran many times slower)."""
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    """A tiny target and a draft made of its first 2 blocks that often agree (test_generation,
    test_tree): (target folder, draft folder)."""
    root = tmp_path_factory.mktemp("pair")
    return save_agreeing_pair(root / "target", root / "draft", AGREEING_TARGET, draft_n_layer=2,
                              damping=0.1, seed=11, std=0.2, embedding_std=0.3)


@pytest.fixture(scope="module")
def target(pair_dirs):
    return load_gpt2(pair_dirs[0])


@pytest.fixture(scope="module")
def draft(pair_dirs):
    return load_gpt2(pair_dirs[1])


@pytest.fixture(scope="session")
def make_checkpoint(shared):
    """make_checkpoint(config, seed=0, std=0.02, layout="hub") -> folder with config.json and
    model.safetensors of random weights (each made once a run: `shared`)."""
    made = {}

    def make(config: GPT2Config, seed: int = 0, std: float = 0.02, layout: str = "hub",
             embedding_std: float | None = None) -> Path:
        key = (config, seed, std, layout, embedding_std)
        if key not in made:
            name = f"ckpt-{layout}-s{seed}-{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}"
            made[key] = shared(name, lambda folder: save_random_checkpoint(folder, config, seed, std, layout,
                                                                           embedding_std))
        return made[key]

    return make


@pytest.fixture(scope="session")
def shared(tmp_path_factory):
    """shared(name, build) -> build(folder)'s result (picklable), built once for the whole run. Each
    xdist worker has its own session, so a session fixture is built once per worker; through this the
    first worker to ask builds it, in a folder of this run that every worker sees, and the others wait
    for it and take the same result (a checkpoint's folder, a command's output)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(exist_ok=True)

    def get(name: str, build):
        kept = root / f"{name}.pickle"
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not kept.exists():
                folder = root / name
                shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
                folder.mkdir()
                result = build(folder)
                partial = kept.with_suffix(".partial")
                partial.write_bytes(pickle.dumps(result))
                partial.rename(kept)  # a result is never read half written
            return pickle.loads(kept.read_bytes())

    return get


@pytest.fixture(scope="session")
def text_pair_dirs(shared):
    """(target_dir, draft_dir): an agreeing pair with GPT-2's real vocabulary, small widths."""
    return shared("text-pair", lambda root: save_agreeing_pair(
        root / "target", root / "draft", TINY_TEXT, draft_n_layer=2, damping=0.05, seed=3, embedding_std=1.0))


@pytest.fixture(scope="session")
def text_pair(text_pair_dirs):
    target_dir, draft_dir = text_pair_dirs
    return load_gpt2(target_dir), load_gpt2(draft_dir)


@pytest.fixture
def kernel_cache_file(tmp_path, monkeypatch):
    """A new, empty cache of measured kernel choices (gpt2/speed/kernel_cache.py) with measuring on:
    its path. Nothing kept by earlier tests in this process is seen."""
    import gpt2.speed.kernel_cache

    path = tmp_path / "cache" / "kernels.json"
    monkeypatch.setenv("GPT2_KERNEL_CACHE", str(path))
    monkeypatch.setenv("GPT2_MEASURE_KERNELS", "1")
    monkeypatch.setattr(gpt2.speed.kernel_cache, "_KEPT", {})
    return path


def plain_with_format_values(folder, fmt: str):
    """gpt2/model.py as written holding a weight format's values, computed without gpt2.speed's
    loader: a float32, bfloat16 or float16 model as load_gpt2 casts it; for "int8" (and "w8a8",
    whose weights are int8's) and "fp16",
    float32 parameters whose token embedding (the tied head) and linear weights hold their
    int8-dequantized or float16-rounded values."""
    import torch.nn as nn
    from gpt2 import load_gpt2
    from gpt2.speed.accelerator import quantized_values

    if fmt not in ("int8", "fp16", "w8a8"):
        return load_gpt2(folder, dtype=fmt)
    model = load_gpt2(folder)
    with torch.no_grad():
        for weight in [model.wte.weight] + [m.weight for m in model.modules() if isinstance(m, nn.Linear)]:
            weight.copy_(quantized_values(weight, fmt, torch.float32))
    return model


def hf_gpt2(folder):
    """transformers' GPT2LMHeadModel from a checkpoint folder, in eval mode: the reference the tests
    compare with. Imported here, when a test asks: importing transformers takes seconds, and every
    test worker imports every test module."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(folder).eval()


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


def sibling_tree(vocab_size: int, seed: int = 1):
    """Inputs of one token-tree forward after a 6-token prompt: (prompt [1, 6], nodes [1, 3],
    positions [3], attn_mask [3, 9]). Two siblings at position 6 that must not see each other, then
    a child of the first at position 7."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab_size, (1, 6), generator=g)
    nodes = torch.randint(0, vocab_size, (1, 3), generator=g)
    positions = torch.tensor([6, 6, 7])
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[:, 6:] = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return prompt, nodes, positions, mask


# A trained pair in seconds (offline.train_pair with tiny sizes on a few standard-library modules): real
# language models that disagree now and then, for tests that need real rejections.
TRAIN_TEXTS = ["argparse.py", "textwrap.py", "string.py", "shlex.py", "heapq.py", "difflib.py",
               "calendar.py", "fractions.py", "bisect.py", "colorsys.py", "configparser.py"]
TINY_TARGET = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=64)
TINY_DRAFT = GPT2Config(n_layer=1, n_head=1, n_embd=32, n_positions=64)


def stdlib_texts() -> list[str]:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(stdlib / name) for name in TRAIN_TEXTS if (stdlib / name).is_file()]


@pytest.fixture(scope="session")
def trained_pair_dirs(shared):
    """(target_dir, draft_dir) of a pair trained for a few seconds by offline.train_pair (once a run:
    `shared`)."""
    from offline.train_pair import TrainSettings, train_pair

    def build(folder):
        out = folder / "pair"
        train_pair(out, stdlib_texts(), TrainSettings(target_steps=60, draft_steps=60, batch_size=8, seed=0),
                   TINY_TARGET, TINY_DRAFT, log=lambda *args: None)
        return out / "target", out / "draft"

    return shared("trained-pair", build)


@pytest.fixture(scope="module")  # each module its own copy, as when each made it
def unrelated_pair(make_checkpoint):
    """(target, draft): two unrelated random models over TINY_VOCAB. They agree on about half the
    tokens, so acceptances, rejections, residual draws, side branches and bonus tokens are all
    frequent: the pair of the lossless checks."""
    target = load_gpt2(make_checkpoint(TINY_VOCAB, seed=21, std=0.2, embedding_std=0.3))
    draft = load_gpt2(make_checkpoint(TINY_VOCAB, seed=22, std=0.2, embedding_std=0.3))
    return target, draft
