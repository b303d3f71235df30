"""Train a small target and a smaller draft on text every machine has: a real pair, offline.

    python -m offline.train_pair --out DIR [--steps N] [--minutes CAP] [--text PATH ...] [--seed 0]

By default the corpus is the Python standard library's own source files (code and English
docstrings, found with sysconfig), so nothing is downloaded. Both models are GPT-2s with GPT-2's
real tokenizer and vocabulary, saved in the hub layout (DIR/target and DIR/draft, each
config.json + model.safetensors), so every tool of the project loads them unchanged. DIR/README.md
says how they were made and how well they do; DIR/train_pair.json holds the same as data.

Unlike random-weight stand-ins, these two really disagree now and then: at temperature 1 the draft
is accepted part of the time, and rejected tokens are replaced from a real residual distribution.

Two tricks make a few CPU minutes enough:
  * the loss is computed over the vocabulary the corpus uses (its most frequent tokens, nearly all
    of it) plus one shared "other" row for the rest of GPT-2's 50257 tokens. In the saved model
    every other token's embedding is that row, and training counts the log(number of other tokens)
    that this costs, so the training loss is exactly the saved model's loss over the full
    vocabulary, at a sixth of the cost of the output layer;
  * small models, a short context, and a high learning rate with warm-up and cosine decay.

The draft is one block only 32 wide. At these sizes a forward pass is mostly the 50257-row output
layer (its cost grows with the width) and per-operation overhead (it grows with the depth), so a
narrow, shallow draft costs a fraction of the target's step (measured in docs/trained_pair.md) and still lands
between the target and a unigram model on held-out code.

The run is a fixed number of steps (TARGET_STEPS, DRAFT_STEPS: about 10 minutes on 2 idle CPU
cores; --steps 300 makes a quick first pair), so the same seed gives the same pair on a fast
machine and a slow one, up to floating-point rounding (tolerance: REPRODUCIBLE_WITHIN). It says
when it should end, and again whenever the machine's pace moves that by more than a quarter
(FinishEstimate). --minutes is only a cap: a run it cuts short says so, in
its output and its README. At the end the run's losses are set beside those of the documented
default run (offline/reference_run.json).

Writing is atomic: the pair is built in a temporary folder beside DIR and renamed into place, so an
interrupted run (Ctrl-C, a crash, a full disk) leaves DIR as it was, never half written.
"""

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import sysconfig
import tempfile
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.config import GPT2Config
from gpt2.loading import CONV1D_SUFFIXES
from gpt2.speed.machine_load import busy_note, load_average
from gpt2.model import GPT2
from gpt2.tokenizer import EOT_ID, decode, encode, get_tokenizer

from .random_weights import save_checkpoint

GPT2_VOCAB_SIZE = 50257
# The default sizes, trained for TARGET_STEPS and DRAFT_STEPS (docs/trained_pair.md: what they reach).
# The draft is narrow so that its step is cheap next to the target's (docs/trained_pair.md: its c).
TARGET_CONFIG = GPT2Config(n_layer=3, n_head=2, n_embd=128, n_positions=256)
DRAFT_CONFIG = GPT2Config(n_layer=1, n_head=1, n_embd=32, n_positions=256)
KEPT_VOCAB = 8192  # the corpus's most frequent tokens get their own row; the rest share one
# Steps per model by default: about 10 minutes on 2 CPU cores in all (docs/trained_pair.md). The
# draft's training step costs about half the target's, so it gets more steps for less time.
TARGET_STEPS = 1800
DRAFT_STEPS = 1400
DRAFT_SHARE = 0.3  # of a --minutes cap: the target may use the rest, the draft what is left after it
# Two runs of the same settings on different machines (other CPU kernels, thread counts) round
# differently, and training amplifies rounding. An allowance (nats/token) for the comparison with
# the documented run, not a measurement: what was measured is in docs/trained_pair.md.
REPRODUCIBLE_WITHIN = 0.02
# The documented default run: its train_pair.json, copied here (docs/trained_pair.md says how).
REFERENCE_RUN = Path(__file__).resolve().parent / "reference_run.json"
# After this many steps a model's pace is known well enough to project its finish (pace_note); the
# projection then follows the pace of the last PACE_STEPS steps (FinishEstimate).
PACE_STEPS = 20
# The projection is printed again when the finish it gives moves by more than this share of the time
# that was left when it was last printed: a shared machine's pace changes as other jobs come and go.
REPRINT_SHARE = 0.25
# A pace this many times slower than the reference run's is worth a line of advice.
SLOW_FACTOR = 1.5
HELD_OUT_EVERY = 25  # every 25th file of the corpus is held out for evaluation
MARKER = "train_pair.json"  # written last: a folder with it holds a complete pair


class TrainPairError(Exception):
    """Bad input (corpus, output folder, arguments). The message says what to do."""


@dataclass
class TrainSettings:
    target_steps: int = TARGET_STEPS
    draft_steps: int = DRAFT_STEPS
    steps: int | None = None  # every model this many steps instead (--steps; tests, offline.train_drafter)
    minutes: float | None = None  # an optional cap on the training time of both models together
    batch_size: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    seed: int = 0


# ------------------------------------------------------------------------------------------------
# The corpus
# ------------------------------------------------------------------------------------------------

def stdlib_files() -> list[Path]:
    """The standard library's .py files, without its tests and without installed packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1]))


TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst"}


def corpus_files(paths: list[str] | None) -> list[Path]:
    """The files to train on: the given files, the text files under the given folders, or the
    standard library's sources."""
    if not paths:
        files = stdlib_files()
        if not files:
            raise TrainPairError(
                f"Found no .py files under the standard library folder "
                f"{sysconfig.get_paths()['stdlib']}; pass your own text with --text PATH.")
        return files
    files = []
    for text in paths:
        path = Path(text).expanduser()
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
            if not found:
                raise TrainPairError(f"--text {path}: the folder holds no {'/'.join(sorted(TEXT_SUFFIXES))} files.")
            files += found
        else:
            raise TrainPairError(f"--text {path}: no such file or folder.")
    return files


def tokenize_files(files: list[Path]) -> list[list[int]]:
    """Each file's GPT-2 tokens, followed by <|endoftext|>. Empty files are dropped."""
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise TrainPairError(f"Cannot read {path}: {e}") from None
    docs = get_tokenizer().encode_ordinary_batch(texts)
    return [doc + [EOT_ID] for doc in docs if doc]


def split_documents(docs: list[list[int]]) -> tuple[list[int], list[int]]:
    """(train tokens, held-out tokens): every HELD_OUT_EVERY-th document is held out; with too
    few documents, the last 5% of the tokens."""
    if len(docs) >= 2 * HELD_OUT_EVERY:
        train = [t for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY // 2 for t in d]
        held_out = [t for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2 for t in d]
        return train, held_out
    tokens = [t for d in docs for t in d]
    cut = len(tokens) - max(1, len(tokens) // 20)
    return tokens[:cut], tokens[cut:]


# ------------------------------------------------------------------------------------------------
# The kept vocabulary: the corpus's frequent tokens, plus one row shared by all others
# ------------------------------------------------------------------------------------------------

@dataclass
class Vocabulary:
    """kept: the GPT-2 ids with their own row, most frequent first; row len(kept) is "other"."""

    kept: list[int]

    @property
    def other_row(self) -> int:
        return len(self.kept)

    @property
    def n_other(self) -> int:
        """How many GPT-2 tokens share the "other" row."""
        return GPT2_VOCAB_SIZE - len(self.kept)

    def compact_ids(self) -> torch.Tensor:
        """[50257] GPT-2 id -> row in the compact vocabulary."""
        table = torch.full((GPT2_VOCAB_SIZE,), self.other_row, dtype=torch.long)
        table[torch.tensor(self.kept)] = torch.arange(len(self.kept))
        return table


def kept_vocabulary(train_tokens: list[int], size: int = KEPT_VOCAB) -> Vocabulary:
    counts = Counter(train_tokens)
    counts[EOT_ID] += 1  # always kept: it separates documents
    return Vocabulary([t for t, _ in counts.most_common(min(size, GPT2_VOCAB_SIZE - 1))])


def compact_loss(logits: torch.Tensor, targets: torch.Tensor, vocab: Vocabulary) -> torch.Tensor:
    """Mean negative log-likelihood, in nats, that the saved full-vocabulary model gives.

    logits [..., len(kept) + 1] over the compact vocabulary, targets [...] compact rows. In the
    saved model each of the n_other tokens has the "other" row's logit, so together they hold
    exp(logit) * n_other of the mass (add log(n_other) to that logit), and one of them, the target,
    gets a 1/n_other share of it (add log(n_other) to its loss).
    """
    log_n_other = math.log(vocab.n_other)
    logits = logits.clone()
    logits[..., vocab.other_row] += log_n_other
    nll = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none")
    return (nll + (targets.flatten() == vocab.other_row) * log_n_other).mean()


def unigram_loss(train_tokens: list[int], held_out: list[int]) -> float:
    """Held-out loss (nats per token) of the train tokens' frequencies, add-one smoothed over
    GPT-2's whole vocabulary: the baseline a language model must beat."""
    counts = torch.bincount(torch.tensor(train_tokens), minlength=GPT2_VOCAB_SIZE).double() + 1
    log_p = counts.log() - counts.sum().log()
    return -log_p[torch.tensor(held_out)].mean().item()


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------

def init_weights(model: GPT2) -> None:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer)."""
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            nn.init.normal_(p, std=0.02 / math.sqrt(2 * model.config.n_layer))
        elif p.dim() == 2:
            nn.init.normal_(p, std=0.02)
        elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            nn.init.ones_(p)
        else:
            nn.init.zeros_(p)


def learning_rate(settings: TrainSettings, step: int, progress: float) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to a tenth as progress goes 0 -> 1
    (progress: the share of the steps done, or of a --minutes cap used, whichever is larger)."""
    peak = settings.learning_rate
    if step < settings.warmup_steps:
        return peak * (step + 1) / settings.warmup_steps
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def capped_steps(steps: int, seconds: float | None):
    """Yield (step, progress) for steps 0 .. steps - 1, stopping early when `seconds` (an optional
    cap) have passed; a cap that runs out before the first step still gives that one. progress is
    the share of the run done, of the steps or of the cap, whichever is larger (learning_rate's)."""
    start, step = time.perf_counter(), 0
    while True:
        elapsed = time.perf_counter() - start
        progress = max(step / steps, elapsed / seconds if seconds else 0.0)
        if progress >= 1 and step > 0:
            return
        yield step, progress
        step += 1


def train_one(name: str, config: GPT2Config, vocab: Vocabulary, train: torch.Tensor,
              settings: TrainSettings, steps: int, generator: torch.Generator,
              seconds: float | None = None) -> tuple[GPT2, dict]:
    """Train one model over the compact vocabulary (train: compact rows [N]) for `steps` steps, or
    fewer if `seconds` (a cap) runs out first. Returns the model (compact vocabulary) and a log."""
    from tqdm.auto import tqdm

    model = GPT2(config.with_(vocab_size=len(vocab.kept) + 1))
    init_weights(model)
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=settings.learning_rate, betas=(0.9, 0.95))
    T, B = config.n_positions, settings.batch_size
    if len(train) < T + 2:
        raise TrainPairError(
            f"The training text has {len(train)} tokens, fewer than one window of "
            f"{T + 1}: give more text with --text.")
    bar = tqdm(total=steps, desc=f"training the {name}", unit="step", leave=True, dynamic_ncols=True,
               disable=os.environ.get("TRAIN_PAIR_PROGRESS", "1") == "0")
    start, cpu_start = time.perf_counter(), time.process_time()
    smoothed = None
    estimate, step_start = FinishEstimate(steps), start
    for step, progress in capped_steps(steps, seconds):
        set_learning_rate(optimizer, learning_rate(settings, step, progress))
        window = random_windows(train, B, T, generator)  # [B, T + 1]
        logits = model(window[:, :-1])  # [B, T, kept + 1]
        loss = compact_loss(logits, window[:, 1:], vocab)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smoothed = loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * loss.item()
        bar.update(1)
        bar.set_postfix(step=step + 1, loss=f"{smoothed:.3f}", refresh=False)
        now = time.perf_counter()
        left = estimate.step_done(now - step_start)
        step_start = now
        if left is not None and steps >= 2 * PACE_STEPS:
            tqdm.write(pace_note(name, config, B, PACE_STEPS, now - start, steps) if step + 1 == PACE_STEPS
                       else f"{name}: the pace changed: about {minutes(left)} left ({step + 1} of {steps} "
                            f"steps; the last {PACE_STEPS} took {estimate.pace():.2f} s each, the median)")
    bar.close()
    model.eval()
    step += 1  # steps done
    return model, {"steps": step, "planned_steps": steps, "cut_short": step < steps,
                   "seconds": round(time.perf_counter() - start, 1),
                   "cpu_seconds": round(time.process_time() - cpu_start, 1),
                   "tokens_seen": step * B * T, "final_train_loss": round(smoothed, 4)}


@torch.no_grad()
def held_out_loss(model: GPT2, tokens: torch.Tensor, vocab: Vocabulary | None = None,
                  max_windows: int = 64) -> float:
    """Mean loss (nats per token) over non-overlapping windows of the held-out tokens. tokens are
    compact rows (with vocab) for a compact model, or GPT-2 ids for a saved model (vocab None)."""
    T = model.config.n_positions
    n = min(max_windows, (len(tokens) - 1) // T)
    if n == 0:  # shorter than one window: one short window
        windows = [tokens]
    else:
        windows = [tokens[i * T:i * T + T + 1] for i in range(n)]
    total, count = 0.0, 0
    for window in windows:
        logits = model(window[None, :-1])
        targets = window[None, 1:]
        if vocab is None:
            loss = F.cross_entropy(logits[0].float(), targets[0])
        else:
            loss = compact_loss(logits, targets, vocab)
        total += loss.item() * targets.numel()
        count += targets.numel()
    return total / count


# ------------------------------------------------------------------------------------------------
# Saving in the hub layout
# ------------------------------------------------------------------------------------------------

def full_vocabulary_state(model: GPT2, vocab: Vocabulary) -> tuple[dict, GPT2Config]:
    """The compact model as a GPT-2 over all 50257 tokens, in the hub's key layout: each kept
    token gets its row, every other token the shared "other" row; linear weights [in, out]."""
    compact = model.wte.weight.detach()
    wte = compact[vocab.compact_ids()]  # [50257, n_embd]
    state = {}
    for name, tensor in model.state_dict().items():
        tensor = wte if name == "wte.weight" else tensor.detach()
        state[name] = tensor.t() if name.endswith(CONV1D_SUFFIXES) else tensor
    return state, model.config.with_(vocab_size=GPT2_VOCAB_SIZE)


def check_output_folder(out: Path, overwrite: bool) -> None:
    """Refuse a folder that holds something else, or a pair unless overwrite is set."""
    if out.exists() and not out.is_dir():
        raise TrainPairError(f"--out {out} is a file; give a folder (it will be created).")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if (out / MARKER).is_file():
        if overwrite:
            return
        raise TrainPairError(
            f"{out} already holds a trained pair (see {out / 'README.md'}). Pass --overwrite to "
            f"replace it, or choose another --out folder.")
    held = sorted(p.name for p in out.iterdir())
    raise TrainPairError(
        f"{out} already holds other files ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}), "
        f"not a pair made by offline.train_pair. Choose a new or empty --out folder; nothing was written.")


def same_pair_there(out: Path, settings: TrainSettings, texts, target_config: GPT2Config,
                    draft_config: GPT2Config) -> dict | None:
    """What out/train_pair.json says, if out holds a complete pair trained from these texts with
    these settings and shapes (running the same command again need not train again); else None."""
    try:
        info = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    shape = ("n_layer", "n_head", "n_embd", "n_positions")
    same = (isinstance(info, dict) and info.get("settings") == asdict(settings)
            and info.get("texts") == (list(texts) if texts else None)
            and all(isinstance(info.get(role), dict) and [info[role].get(k) for k in shape] == [getattr(config, k) for k in shape]
                    for role, config in (("target", target_config), ("draft", draft_config))))
    return info if same and not info["target"].get("cut_short") and not info["draft"].get("cut_short") else None


def write_pair_atomically(out: Path, write) -> None:
    """Call write(tmp_folder) to fill a temporary folder beside `out`, then rename it to `out`.
    If anything fails or is interrupted before the rename, `out` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    old = None
    try:
        write(tmp)
        if out.exists():  # empty, or a pair the user asked to replace
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
    except BaseException:
        if old is not None and not out.exists():
            os.replace(old, out)  # put the previous pair back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def sample_text(model: GPT2, prompt: str, n_tokens: int, seed: int) -> str:
    """n_tokens sampled at temperature 1 after the prompt (plain sampling, no KV cache needed)."""
    generator = torch.Generator().manual_seed(seed)
    ids = encode(prompt)
    n_tokens = min(n_tokens, model.config.n_positions - len(ids))
    cache = model.new_kv_cache(max_len=len(ids) + n_tokens)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), cache, num_last_logits=1)[0, -1]
        for _ in range(n_tokens):
            ids.append(int(torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator)))
            logits = model(torch.tensor([ids[-1:]]), cache)[0, -1]
    return decode(ids)


README_TEMPLATE = """# A small trained draft/target pair

Made by `python -m offline.train_pair {command}` on {date}.

| model | path | layers x width | parameters | held-out loss (nats/token) |
|---|---|---|---|---|
| target p | `target/` | {t_layers} x {t_width} | {t_params:.1f}M | {t_loss:.3f} |
| draft q | `draft/` | {d_layers} x {d_width} | {d_params:.1f}M | {d_loss:.3f} |
| unigram baseline | | | | {unigram:.3f} |

Trained on {corpus} ({n_files} files, {n_train:,} tokens); held out for the losses above:
{n_held_files} of those files ({n_held:,} tokens). GPT-2's tokenizer and vocabulary; the
{n_kept:,} most frequent tokens of the corpus have their own embedding, the other {n_other:,}
share one. Target: {t_steps} steps{t_cut} in {t_seconds:.0f} s; draft: {d_steps} steps{d_cut} in
{d_seconds:.0f} s (batch {batch} x {context} tokens, seed {seed}).

Machine: {cpu} ({cores} logical cores, torch's {capability} kernels), torch {torch} with {threads}
threads, Python {python}. 1-minute load average {load_start} at the start of training, {load_end}
at the end (above {cores}: the machine was shared, and the times above are longer than on an idle
machine). The steps, and so the losses, do not depend on the machine's speed{cap_note}.

Use them like any GPT-2 checkpoint:

    python spec_decoding_generate.py --target {out}/target --draft {out}/draft --temperature 1

A sample from the target at temperature 1:

```
{sample}
```
"""


def cut_note(log: dict) -> str:
    return f" (of {log['planned_steps']}: cut short by --minutes)" if log["cut_short"] else ""


def write_readme(folder: Path, info: dict) -> None:
    t, d, m = info["target"], info["draft"], info["machine"]
    text = README_TEMPLATE.format(
        command=info["command"], date=info["date"], out=info["out"],
        t_layers=t["n_layer"], t_width=t["n_embd"], t_params=t["parameters"] / 1e6,
        t_loss=t["held_out_loss"], d_layers=d["n_layer"], d_width=d["n_embd"],
        d_params=d["parameters"] / 1e6, d_loss=d["held_out_loss"], unigram=info["unigram_loss"],
        corpus=info["corpus"], n_files=info["files"], n_train=info["train_tokens"],
        n_held_files=info["held_out_files"], n_held=info["held_out_tokens"],
        n_kept=info["kept_vocabulary"], n_other=GPT2_VOCAB_SIZE - info["kept_vocabulary"],
        t_steps=t["steps"], t_seconds=t["seconds"], d_steps=d["steps"], d_seconds=d["seconds"],
        batch=info["settings"]["batch_size"], context=t["n_positions"], seed=info["settings"]["seed"],
        sample=info["sample"].replace("```", "'''"),
        t_cut=cut_note(t), d_cut=cut_note(d), cpu=m["cpu"], cores=m["cores"], capability=m["cpu_capability"],
        torch=m["torch"], threads=m["torch_threads"], python=m["python"],
        load_start=m["load_average_start"], load_end=m["load_average_end"],
        cap_note=(": --minutes cut this run short, so this pair is not the default one"
                  if t["cut_short"] or d["cut_short"] else ""))
    (folder / "README.md").write_text(text)


# ------------------------------------------------------------------------------------------------
# The whole recipe
# ------------------------------------------------------------------------------------------------

def train_pair(out, texts: list[str] | None = None, settings: TrainSettings | None = None,
               target_config: GPT2Config | None = None, draft_config: GPT2Config | None = None,
               overwrite: bool = False, command: str = "", log=print) -> dict:
    """Train the pair and save it to out/target and out/draft. Returns what README.md reports.
    The configs default to TARGET_CONFIG and DRAFT_CONFIG (their vocab_size is ignored)."""
    settings = settings or TrainSettings()
    target_config = target_config or TARGET_CONFIG
    draft_config = draft_config or DRAFT_CONFIG
    if target_config.n_positions != draft_config.n_positions:
        raise TrainPairError("the target and the draft must have the same n_positions")
    out = Path(out).expanduser().resolve()
    if not overwrite and (kept := same_pair_there(out, settings, texts, target_config, draft_config)):
        log(f"{out} already holds a pair trained with these settings (see {out / 'README.md'}): kept as it "
            f"is (the same settings and seed train the same pair). Pass --overwrite to train it again.")
        return kept
    check_output_folder(out, overwrite)
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)

    files = corpus_files(texts)
    corpus = ("the Python standard library's sources" if not texts else ", ".join(texts))
    log(f"Reading {len(files)} files ({corpus})...")
    docs = tokenize_files(files)
    if not docs or sum(map(len, docs)) < 2 * target_config.n_positions:
        raise TrainPairError(
            f"The corpus is empty or too small ({sum(map(len, docs))} tokens in {len(files)} files): "
            f"give at least a few thousand tokens of text with --text PATH.")
    train_ids, held_ids = split_documents(docs)
    vocab = kept_vocabulary(train_ids)
    to_compact = vocab.compact_ids()
    train = to_compact[torch.tensor(train_ids)]
    held = to_compact[torch.tensor(held_ids)]
    log(f"{len(train_ids):,} training tokens, {len(held_ids):,} held out; "
        f"{len(vocab.kept):,} kept tokens cover {float((train != vocab.other_row).float().mean()):.1%} of the text")

    cap = settings.minutes * 60 if settings.minutes else None
    models, info = {}, {"machine": machine()}
    start = time.perf_counter()
    for name, config, steps in (("target", target_config, settings.steps or settings.target_steps),
                                ("draft", draft_config, settings.steps or settings.draft_steps)):
        seconds = None  # no cap: exactly `steps` steps
        if cap is not None:  # the target may use its share of the cap, the draft what is left
            seconds = cap * (1 - DRAFT_SHARE) if name == "target" else cap - (time.perf_counter() - start)
        model, log_ = train_one(name, config, vocab, train, settings, steps, generator,
                                seconds if seconds is None else max(seconds, 1e-3))
        loss = held_out_loss(model, held, vocab)
        log(f"{name}: {log_['steps']} steps in {log_['seconds']:.0f} s, held-out loss {loss:.3f} nats/token")
        if log_["cut_short"]:
            log(f"note: --minutes {settings.minutes:g} cut the {name}'s training short: {log_['steps']} "
                f"of {steps} steps. Its losses are not those of a full run, and depend on this "
                f"machine's speed.")
        models[name] = model
        info[name] = {**asdict(config), "parameters": sum(p.numel() for p in model.parameters()
                                                            if p is not model.wte.weight)
                      + GPT2_VOCAB_SIZE * config.n_embd, "held_out_loss": round(loss, 4), **log_}
    unigram = unigram_loss(train_ids, held_ids)
    log(f"unigram baseline: {unigram:.3f} nats/token")
    sample = sample_text(full_model(models["target"], vocab), "import os\n\n\ndef ", 80, settings.seed)

    info["machine"]["load_average_end"] = None if (load := load_average()) is None else round(load, 2)
    info.update({
        "command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "out": str(out), "corpus": corpus, "files": len(files),
        "held_out_files": len(docs) // HELD_OUT_EVERY if len(docs) >= 2 * HELD_OUT_EVERY else 0,
        "train_tokens": len(train_ids), "held_out_tokens": len(held_ids),
        "kept_vocabulary": len(vocab.kept), "unigram_loss": round(unigram, 4),
        "settings": asdict(settings), "sample": sample, "torch": torch.__version__,
        "texts": list(texts) if texts else None,
    })

    def write(folder: Path):
        for name, model in models.items():
            state, config = full_vocabulary_state(model, vocab)
            save_checkpoint(folder / name, state, config)
        write_readme(folder, info)
        (folder / MARKER).write_text(json.dumps(info, indent=2))  # last: marks a complete pair

    write_pair_atomically(out, write)
    log(f"Saved {out}/target and {out}/draft (see {out}/README.md)")
    log(compare_with_reference(info, target_config, draft_config))
    return info


class FinishEstimate:
    """The time a model's training has left, from the pace of its last `window` steps (their
    median), and when to say it: after the first `window` steps, and again whenever the finish it
    projects moves by more than reprint_share of the time that was left when it was last said
    (until the last `window` steps). A projection from the first steps alone holds only while the
    machine's load stays as it was; on a shared machine it does not. Fed step durations, it reads
    no clock, so its logic is tested on made-up durations."""

    def __init__(self, steps: int, window: int = PACE_STEPS, reprint_share: float = REPRINT_SHARE):
        self.steps, self.window, self.reprint_share = steps, window, reprint_share
        self.recent: deque[float] = deque(maxlen=window)  # seconds of the last `window` steps
        self.done, self.elapsed = 0, 0.0
        self.said_end = self.said_left = None  # the projected finish (seconds from the start) last said

    def pace(self) -> float:
        """Seconds per step: the median of the last `window` steps (one slow step, a burst of
        another job, does not move it; a lasting change does once it fills half the window)."""
        return statistics.median(self.recent)

    def step_done(self, seconds: float) -> float | None:
        """Count a step that took `seconds`. Returns the seconds left when the estimate is to be
        said (the first time, or it moved by more than reprint_share), else None."""
        self.recent.append(seconds)
        self.done += 1
        self.elapsed += seconds
        if self.done < self.window or (self.said_end is not None and self.steps - self.done < self.window):
            return None  # too early to know the pace; too late to be worth a line (the bar shows it)
        left = self.pace() * (self.steps - self.done)
        end = self.elapsed + left
        if self.said_end is not None and abs(end - self.said_end) <= self.reprint_share * self.said_left:
            return None
        self.said_end, self.said_left = end, left
        return left


def pace_note(name: str, config: GPT2Config, batch_size: int, steps_done: int, seconds: float, steps: int,
              reference_path: Path = REFERENCE_RUN) -> str:
    """One line projecting when a model's training ends, from its first steps' pace: beside the
    documented default run's time for the same model (reference_run.json), and, when this run is
    SLOW_FACTOR times slower or more, why that may be and what to try."""
    projected = seconds / steps_done * steps
    line = f"{name}: {steps_done} steps in {seconds:.0f} s, so the {steps} steps should take about {minutes(projected)}"
    ref = json.loads(reference_path.read_text()) if reference_path.is_file() else None
    same = ref is not None and ref["settings"]["batch_size"] == batch_size and all(
        ref[name][k] == getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "n_positions"))
    if not same:
        return line
    ref_per_step = ref[name]["seconds"] / ref[name]["steps"]
    machine = ref["machine"]
    line += (f" (the reference run: {minutes(ref_per_step * steps)} on {machine['cpu']}, "
             f"{machine['torch_threads']} threads)")
    slower = seconds / steps_done / ref_per_step
    if slower >= SLOW_FACTOR:
        threads = torch.get_num_threads()
        quiet = "a slower CPU, or other programs on it" + (
            f"; with {threads} threads, try --threads 1" if threads > 1 else "")  # advice it can take
        line += (f".\nnote: {slower:.1f}x slower than the reference run: "
                 + (busy_note("--threads 1") or quiet).removeprefix("note: "))
    return line


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def machine() -> dict:
    """The machine a run trained on: CPU, cores, torch threads, versions, and how busy it was."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    load = load_average()
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "torch": torch.__version__, "load_average_start": None if load is None else round(load, 2)}


def compare_with_reference(info: dict, target_config: GPT2Config, draft_config: GPT2Config,
                           reference_path: Path = REFERENCE_RUN) -> str:
    """A few lines setting this run's held-out losses beside the documented default run's
    (reference_run.json), and saying whether the two should agree: only with the same settings,
    sizes and corpus, and then within REPRODUCIBLE_WITHIN."""
    if not reference_path.is_file():
        return f"(No documented default run to compare with: {reference_path} is missing.)"
    ref = json.loads(reference_path.read_text())
    lines = [f"The documented default run ({ref['date']}, {ref['machine']['cpu']}, "
             f"{ref['machine']['torch_threads']} threads): held-out loss target "
             f"{ref['target']['held_out_loss']:.3f}, draft {ref['draft']['held_out_loss']:.3f} nats/token."]
    gaps = {name: info[name]["held_out_loss"] - ref[name]["held_out_loss"] for name in ("target", "draft")}
    lines.append(f"This run: target {info['target']['held_out_loss']:.3f} ({gaps['target']:+.3f}), "
                 f"draft {info['draft']['held_out_loss']:.3f} ({gaps['draft']:+.3f}).")
    differs = [key for key, value in asdict(TrainSettings()).items()
               if key != "minutes" and info["settings"][key] != ref["settings"][key]]
    differs += [f"the {name}'s size" for name, config in (("target", target_config), ("draft", draft_config))
                if (config.n_layer, config.n_embd, config.n_positions)
                != tuple(ref[name][k] for k in ("n_layer", "n_embd", "n_positions"))]
    if info["texts"] != ref["texts"] or (info["train_tokens"], info["held_out_tokens"]) != (
            ref["train_tokens"], ref["held_out_tokens"]):
        differs.append(f"the corpus ({info['train_tokens']:,} training tokens here, {ref['train_tokens']:,} "
                       f"there: {ref['corpus'] if ref['texts'] else 'Python ' + ref['machine']['python'] + chr(39) + 's standard library'})")
    if any(info[name]["cut_short"] for name in ("target", "draft")):
        differs.append("the steps (--minutes cut this run short)")
    if differs:
        lines.append(f"Not comparable: this run differs in {', '.join(differs)}.")
    elif max(map(abs, gaps.values())) <= REPRODUCIBLE_WITHIN:
        lines.append(f"Same settings and corpus: within the {REPRODUCIBLE_WITHIN} nats that rounding "
                     f"on another machine explains.")
    else:
        lines.append(f"Same settings and corpus, but more than {REPRODUCIBLE_WITHIN} nats apart: more "
                     f"than rounding (another torch version, or a changed recipe?).")
    return "\n".join(lines)


def full_model(model: GPT2, vocab: Vocabulary) -> GPT2:
    """The compact model as a full-vocabulary GPT2 (what gets saved), for sampling."""
    state, config = full_vocabulary_state(model, vocab)
    full = GPT2(config)
    full.load_state_dict({k: v.t() if k.endswith(CONV1D_SUFFIXES) else v for k, v in state.items()})
    return full.eval()


def evaluate_pair(folder, texts: list[str], log=print) -> dict:
    """Losses (nats per token) of a saved pair, and of the unigram model of its training text, on
    other text: e.g. this project's own modules, which are in no training corpus."""
    from gpt2.loading import load_gpt2

    folder = Path(folder).expanduser()
    if not (folder / MARKER).is_file():
        raise TrainPairError(f"{folder} holds no pair made by offline.train_pair ({MARKER} is missing).")
    info = json.loads((folder / MARKER).read_text())
    trained_on = info.get("texts") or None
    train_ids, _ = split_documents(tokenize_files(corpus_files(trained_on)))
    ids = [t for doc in tokenize_files(corpus_files(texts)) for t in doc]
    if len(ids) < 2:
        raise TrainPairError("the evaluation text is empty")
    result = {"tokens": len(ids), "unigram": unigram_loss(train_ids, ids)}
    for name in ("target", "draft"):
        result[name] = held_out_loss(load_gpt2(folder / name), torch.tensor(ids), max_windows=10**6)
    log(f"{len(ids):,} tokens of {', '.join(texts)}: target {result['target']:.3f}, "
        f"draft {result['draft']:.3f}, unigram {result['unigram']:.3f} nats/token")
    return result


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def random_windows(ids: torch.Tensor, batch_size: int, length: int, generator) -> torch.Tensor:
    """batch_size windows of length + 1 consecutive tokens from ids [N] at random offsets,
    [batch_size, length + 1]: inputs are [:, :-1], next-token targets [:, 1:]."""
    offsets = torch.randint(0, len(ids) - length - 1, (batch_size,), generator=generator)
    return torch.stack([ids[o:o + length + 1] for o in offsets.tolist()])


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def run_command(train, out) -> int:
    """Run train() (which writes `out` atomically) as the training commands do: `kill PID` stops it
    like Ctrl-C; the exit code is 0, 2 after an error it explains, or 130 when interrupted (then
    nothing was written)."""
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        train()
    except TrainPairError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nInterrupted: nothing was written to {out}.", file=sys.stderr)
        return 130
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline.train_pair",
        description="Train a small target and draft GPT-2 (GPT-2's tokenizer) on text every machine "
                    "has, for real speculative decoding offline.")
    parser.add_argument("--out", help="folder to create (holds target/ and draft/)")
    parser.add_argument("--evaluate", metavar="DIR",
                        help="instead of training: score the pair in DIR on the --text files")
    parser.add_argument("--steps", type=int,
                        help=f"train each model this many steps (default: the target {TARGET_STEPS}, "
                             f"the draft {DRAFT_STEPS}, about 10 minutes on the 2-core Intel Xeon "
                             f"of the reference run; the run projects its own finish)")
    parser.add_argument("--minutes", type=float,
                        help="an optional cap on the training time of both models together; a run "
                             "it cuts short says so (and is not the default pair)")
    parser.add_argument("--text", nargs="+", metavar="PATH",
                        help="text files or folders to train on (default: the Python standard library's sources)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads for PyTorch (default: its own choice, one per core); on a "
                             "busy machine 1 is often faster")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a pair already in --out (anything else there is never replaced)")
    args = parser.parse_args(argv)
    if args.evaluate:
        if not args.text:
            parser.error("--evaluate needs --text PATH ... (the text to score the pair on)")
        try:
            evaluate_pair(args.evaluate, args.text)
        except TrainPairError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if not args.out:
        parser.error("--out DIR is required (the folder to create)")
    if (args.minutes is not None and args.minutes <= 0) or (args.steps is not None and args.steps < 1):
        parser.error("--minutes must be > 0 and --steps >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := busy_note("--threads 1"):
        print(note, flush=True)
    settings = TrainSettings(steps=args.steps, minutes=args.minutes, seed=args.seed)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: train_pair(args.out, args.text, settings, overwrite=args.overwrite,
                                          command=command), args.out)


if __name__ == "__main__":
    sys.exit(main())
