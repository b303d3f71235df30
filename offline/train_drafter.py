"""Train a feature drafter (Medusa heads or an EAGLE-style drafter) for a target, offline.

    python -m offline.train_drafter --target DIR --kind medusa|eagle --out DIR
        [--steps N] [--minutes M] [--text PATH ...] [--seed 0] [--heads 4] [--shared-readout]
        [--unroll K] [--draft-vocab N]

The target is frozen: each step runs it on a batch of windows of the corpus (by default the Python
standard library's sources, as offline.train_pair; the same corpus discovery, imported) and keeps its
features (the residual stream before ln_f, GPT2.forward(return_features=True)) and the tokens.
Only the drafter learns, from what the target computed:

  * Medusa: head k reads the feature at position t and predicts token t + 1 + k.
    loss = sum_k 0.8^k CE_k (Cai et al. 2024: the far heads are less reliable, weighted less).
  * EAGLE: reads [wte(t_{i+1}) ; f_i + noise] and predicts f_{i+1}.
    loss = SmoothL1(f'_{i+1}, f_{i+1}) + 0.1 CE(ln_f(f'_{i+1}) @ wte.T, t_{i+2}) (Li et al. 2024).
    The noise (Gaussian, 5% of the features' RMS) stands in for the errors of the drafter's own
    predicted features, which it reads during a round. --unroll K trains on those errors
    themselves (EAGLE-3's training-time test): the loss of drafting steps 1..K, each reading the
    step before's predictions, with the attention a round has (training_time_test_mask).

Works on any GPT-2 folder the project loads (the trained pair's target, real GPT-2). The output
folder (model.safetensors, config.json, README.md: spec_decoding/drafters/feature_files.py) is written
atomically: an interrupted run leaves nothing half-written. For Medusa the README and config.json
also hold each head's measured top-1..top-4 accuracy on held-out text, which shapes its token tree.
"""

import argparse
import os
import random
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2 import GPT2, load_gpt2
# The corpus and the atomic write are train_pair's: one corpus discovery for every offline tool.
from .train_pair import (TrainPairError, TrainSettings, capped_steps, corpus_files, learning_rate,
                         split_documents, random_windows, run_command, set_learning_rate, tokenize_files,
                         write_pair_atomically)
from spec_decoding.drafters.eagle import EagleNet
from spec_decoding.drafters.feature_files import KINDS, save_feature_drafter, target_fingerprint
from spec_decoding.drafters.medusa import MedusaHeads

MEDUSA_DECAY = 0.8  # lambda_k = 0.8^k
MEDUSA_STEPS = 600  # default training steps (batch 4 x 128 tokens)
EAGLE_STEPS = 4000
EAGLE_CE_WEIGHT = 0.1
EAGLE_NOISE = 0.05  # input-feature noise, relative to the features' RMS
CONTEXT = 128  # tokens per training window (or the target's n_positions - 2 if smaller)
TOP_B = 4  # head accuracies are measured for top-1 .. top-4
EVAL_WINDOWS = 32  # held-out windows the loss before and after is measured on (--eval-windows)
# A fixed number of steps by default, as offline.train_pair: the same drafter on every machine,
# however busy (a time budget would give a loaded machine a less trained one). --minutes caps it.
DEFAULT_STEPS = {"medusa": MEDUSA_STEPS, "eagle": EAGLE_STEPS}


class TrainDrafterError(TrainPairError):
    """Bad input (target, corpus, output folder, arguments). The message says what to do."""


def load_target(folder) -> GPT2:
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise TrainDrafterError(f"--target {folder}: no GPT-2 folder there (config.json missing). Give the "
                                f"target's folder, e.g. runs/pair/target from python -m offline.train_pair.")
    target = load_gpt2(path, dtype="float32")
    target.requires_grad_(False)
    return target.eval()


def check_output_folder(out: Path, overwrite: bool) -> None:
    """Refuse a file, or a folder with anything in it unless it is a drafter and overwrite is set."""
    if out.exists() and not out.is_dir():
        raise TrainDrafterError(f"--out {out} is a file; give a folder (it will be created).")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if overwrite and (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return
    raise TrainDrafterError(f"{out} already holds files; choose a new or empty --out folder (or pass "
                            f"--overwrite to replace a drafter there). Nothing was written.")


def corpus_tokens(texts, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) token ids of the corpus, as train_pair splits it."""
    files = corpus_files(texts)
    docs = tokenize_files(files)
    n = sum(map(len, docs))
    if n < 4 * (context + 1):
        raise TrainDrafterError(f"The corpus is empty or too small ({n} tokens in {len(files)} files): give "
                                f"at least a few thousand tokens of text with --text PATH.")
    train, held = split_documents(docs)
    return torch.tensor(train), torch.tensor(held)


def make_drafter(kind: str, target: GPT2, num_heads: int, shared_readout: bool = False) -> torch.nn.Module:
    return MedusaHeads(target, num_heads, shared_readout) if kind == "medusa" else EagleNet(target)


@torch.no_grad()
def target_features(target: GPT2, window: torch.Tensor) -> torch.Tensor:
    """The frozen target's features [B, T, C] over window [B, T]. Its logits are not needed: the
    head runs for the last position only (at small widths the head is most of a forward)."""
    return target(window, num_last_logits=1, return_features=True)[1]


def medusa_loss(heads: MedusaHeads, target: GPT2, features, window) -> tuple[torch.Tensor, list]:
    """sum_k 0.8^k CE_k. features [B, T, C] of window[:, :T]; window [B, T + 1]. Head k (1-based)
    at position t is scored on token t + 1 + k (positions t <= T - 1 - k have one)."""
    x = target.ln_f(features)
    T = features.shape[1]
    total, per_head = 0.0, []
    for k, head in enumerate(heads.heads, start=1):
        logits = head(x[:, :T - k], target.head)  # positions 0 .. T - k - 1
        ce = F.cross_entropy(logits.flatten(0, 1).float(), window[:, k + 1:T + 1].flatten())
        total = total + MEDUSA_DECAY ** k * ce
        per_head.append(ce.item())
    return total, per_head


def training_time_test_mask(T: int, passes: int) -> torch.Tensor:
    """[passes * T, passes * T] bool, True = may attend: the attention of EAGLE's drafting steps,
    for all of a window's positions at once (EAGLE-3's "training-time test").

    Pass 0 is the drafter's first step everywhere: position i reads the real f_i, causally. Pass k
    at position i is the (k + 1)-th step of a round that began at position i - k: its input holds
    pass k - 1's prediction at position i - 1, and, as in a round, it attends to the positions fed
    real features before the round (pass 0's keys at j <= i - k), then to one key per step of the
    round so far (pass m's at position i - k + m, m = 1 .. k; the last is itself).
    """
    positions = torch.arange(T)
    mask = torch.zeros(passes * T, passes * T, dtype=torch.bool)
    for k in range(passes):
        rows = k * T + positions
        mask[k * T:(k + 1) * T, :T] = positions[None, :] <= (positions - k)[:, None]
        for m in range(1, k + 1):
            at = positions - k + m
            ok = at >= 0
            mask[rows[ok], m * T + at[ok]] = True
    return mask


def eagle_unrolled_predictions(net: EagleNet, embeddings: torch.Tensor, features: torch.Tensor,
                               passes: int) -> torch.Tensor:
    """The drafter's predicted next features [passes, B, T, C] over a window, as its drafting
    steps 1 .. passes would predict them: pass k at position i predicts f_{i+1} after k steps on
    its own predictions (positions i >= k; the rest are padding). embeddings [B, T, C]: wte of
    t_{i+1}; features [B, T, C]: the real f_i (noisy in training).

    Each pass's inputs come from the one before, without gradient (the drafter is trained on its
    own predictions as it meets them, not through them); the last forward runs all the passes
    together under training_time_test_mask, and its outputs carry the gradient.
    """
    B, T, C = features.shape
    inputs = [features]
    for k in range(1, passes):
        with torch.no_grad():
            out = net(embeddings.repeat(1, k, 1), torch.cat(inputs, dim=1), attn_mask=training_time_test_mask(T, k))
        previous = out[:, (k - 1) * T:]  # pass k - 1's predictions: at i, of f_{i+1}
        inputs.append(torch.cat([features[:, :1], previous[:, :-1]], dim=1))  # at i, of f_i (i = 0: padding)
    out = net(embeddings.repeat(1, passes, 1), torch.cat(inputs, dim=1), attn_mask=training_time_test_mask(T, passes))
    return out.view(B, passes, T, C).transpose(0, 1)


def eagle_loss(net: EagleNet, target: GPT2, features, window, generator,
               noise: float = EAGLE_NOISE, passes: int = 1) -> tuple[torch.Tensor, list]:
    """SmoothL1(predicted next feature) + 0.1 CE of its readout, with noisy input features
    (Gaussian, `noise` times the features' RMS). passes > 1: the training-time test, the mean of
    that loss over the drafter's steps 1 .. passes (training_time_test_mask)."""
    f_in = features[:, :-1]
    if noise:
        f_in = f_in + torch.randn(f_in.shape, generator=generator) * (noise * f_in.pow(2).mean().sqrt())
    embeddings = target.wte(window[:, 1:features.shape[1]])
    predicted = eagle_unrolled_predictions(net, embeddings, f_in, passes)  # [passes, B, T - 1, C]: f'_1 .. f'_{T-1}
    regression = ce = 0.0
    for k in range(passes):  # pass k is defined from position k on
        here = predicted[k, :, k:]
        regression = regression + F.smooth_l1_loss(here, features[:, k + 1:]) / passes
        logits = target.ln_f(here) @ target.wte.weight.T
        ce = ce + F.cross_entropy(logits.flatten(0, 1).float(),
                                  window[:, k + 2:features.shape[1] + 1].flatten()) / passes
    return regression + EAGLE_CE_WEIGHT * ce, [regression.item(), ce.item()]


def train(kind: str, target: GPT2, module, train_ids: torch.Tensor, settings: TrainSettings,
          context: int, generator: torch.Generator, log=print, unroll: int = 1) -> dict:
    """Train module in place for settings.steps steps, or fewer if settings.minutes (a cap) runs
    out first. Returns a log."""
    from tqdm.auto import tqdm

    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    B, T, steps = settings.batch_size, context, settings.steps
    seconds = settings.minutes * 60 if settings.minutes else None
    bar = tqdm(total=steps, desc=f"training {kind}", unit="step", dynamic_ncols=True,
               disable=os.environ.get("TRAIN_PAIR_PROGRESS", "1") == "0")
    start, cpu_start = time.perf_counter(), time.process_time()
    losses = []
    for step, progress in capped_steps(steps, seconds):
        set_learning_rate(optimizer, learning_rate(settings, step, progress))
        window = random_windows(train_ids, B, T, generator)  # [B, T + 1]
        features = target_features(target, window[:, :T])
        if kind == "medusa":
            loss, parts = medusa_loss(module, target, features, window)
        else:
            loss, parts = eagle_loss(module, target, features, window, generator, passes=unroll)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}", refresh=False)
    bar.close()
    module.eval()
    step = len(losses)  # steps done
    return {"steps": step, "planned_steps": steps, "cut_short": step < steps,
            "seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1), "tokens_seen": step * B * T,
            "losses": [round(x, 4) for x in losses]}


def held_out_windows(held: torch.Tensor, context: int, max_windows: int) -> list[torch.Tensor]:
    """Up to max_windows non-overlapping windows [1, context + 1], spread evenly over all the
    held-out tokens. Not the first ones in a row: held-out documents differ, and the first few
    windows of one file (a licence header, a table of data) are no sample of the rest."""
    size = context + 1
    available = (len(held) - 1) // size
    n = max(1, min(max_windows, available))
    starts = [round(i * (available - 1) / max(1, n - 1)) * size for i in range(n)] if available else [0]
    return [held[s:s + size][None] for s in starts]


@torch.no_grad()
def held_out_loss(kind: str, module, target: GPT2, held: torch.Tensor, context: int,
                  max_windows: int = EVAL_WINDOWS, unroll: int = 1) -> float:
    """The training loss on fixed held-out windows, without input noise: comparable before and
    after training (the training loss jumps from batch to batch)."""
    losses = []
    for window in held_out_windows(held, context, max_windows):
        features = target_features(target, window[:, :-1])
        if kind == "medusa":
            losses.append(medusa_loss(module, target, features, window)[0].item())
        else:
            losses.append(eagle_loss(module, target, features, window, None, noise=0.0, passes=unroll)[0].item())
    return round(sum(losses) / len(losses), 4)


@torch.no_grad()
def head_accuracies(heads: MedusaHeads, target: GPT2, held: torch.Tensor, context: int,
                    max_windows: int = 2 * EVAL_WINDOWS) -> list[list[float]]:
    """Held-out accuracy of each Medusa head: [k][b - 1] = how often the true token k + 1 places
    ahead is among the head's top-b (b = 1 .. TOP_B)."""
    hits = torch.zeros(heads.num_heads, TOP_B)
    counts = torch.zeros(heads.num_heads)
    for window in held_out_windows(held, context, max_windows):
        T = window.shape[1] - 1
        x = target.ln_f(target_features(target, window[:, :T]))
        for k, head in enumerate(heads.heads, start=1):
            if T - k <= 0:
                continue
            top = head(x[0, :T - k], target.head).topk(TOP_B, dim=-1).indices  # [T - k, TOP_B]
            truth = window[0, k + 1:T + 1, None]
            hits[k - 1] += (top == truth).cumsum(-1).clamp(max=1).sum(0).float()
            counts[k - 1] += T - k
    return [[round(float(a), 4) for a in row] for row in hits / counts.clamp(min=1)[:, None]]


README_TEMPLATE = """# A {kind} drafter

Made by `python -m offline.train_drafter {command}` on {date}, for the target `{target}`
({t_layers} layers, width {t_width}; fingerprint `{fingerprint}`: it loads on that target only).

{what}

Trained on {corpus} ({n_train:,} tokens, {n_held:,} held out): {steps}{cut} in {seconds:.0f} s
({cpu_seconds:.0f} s CPU), batch {batch} x {context} tokens, learning rate {lr}, seed {seed}.
Loss on held-out text: {before:.3f} untrained, {after:.3f} trained (training loss: first 20 steps
{first:.3f}, last 20 steps {last:.3f}).
{accuracies}
Use it:

    python spec_decoding_generate.py --target {target} --drafter {kind}:{out}
"""


def write_readme(folder: Path, info: dict) -> None:
    readout = ("the target's own wte, shared (only the blocks are trained)" if info.get("shared_readout")
               else "an untied copy of the target's wte")
    what = (f"{info['num_heads']} Medusa heads (x + SiLU(W1 x), then {readout}); "
            f"loss sum_k 0.8^k CE_k." if info["kind"] == "medusa" else
            "One GPT-2 block over W_in [wte(t_i+1) ; f_i], predicting the target's next feature, read "
            "out through the target's ln_f and head; loss SmoothL1 + 0.1 CE, input-feature noise 5% of RMS"
            + (f"; training-time test: the loss is the mean over drafting steps 1..{info['unroll']}, each "
               "on its own predicted features" if info.get("unroll", 1) > 1 else "")
            + (f"; a draft vocabulary of the corpus's {info['draft_vocab']} most frequent tokens." if
               info.get("draft_vocab") else "."))
    accuracies = ""
    if info["kind"] == "medusa":
        rows = "\n".join(f"| {k} | token t+{k + 1} | " + " | ".join(f"{a:.1%}" for a in acc) + " |"
                         for k, acc in enumerate(info["head_accuracies"], start=1))
        accuracies = ("\nHeld-out accuracy of each head (the true token among its top-b):\n\n"
                      "| head | predicts | top-1 | top-2 | top-3 | top-4 |\n|---|---|---|---|---|---|\n"
                      + rows + "\n")
    losses = info["losses"]
    text = README_TEMPLATE.format(
        kind=info["kind"], command=info["command"], date=info["date"], target=info["target_dir"],
        t_layers=info["target_config"]["n_layer"], t_width=info["target_config"]["n_embd"],
        fingerprint=info["fingerprint"], what=what, corpus=info["corpus"], n_train=info["train_tokens"],
        n_held=info["held_out_tokens"], steps=f"{info['steps']} step{'s' * (info['steps'] != 1)}", seconds=info["seconds"],
        cut=(f" (cut short by --minutes {info['settings']['minutes']:g}: {info['planned_steps']} planned)"
             if info["cut_short"] else ""),
        cpu_seconds=info["cpu_seconds"], batch=info["settings"]["batch_size"], context=info["context"],
        lr=info["settings"]["learning_rate"], seed=info["settings"]["seed"],
        first=sum(losses[:20]) / max(1, len(losses[:20])), last=sum(losses[-20:]) / max(1, len(losses[-20:])),
        accuracies=accuracies, out=info["out"], before=info["held_out_loss"]["before"],
        after=info["held_out_loss"]["after"])
    (folder / "README.md").write_text(text)


def train_drafter(target_dir, kind: str, out, texts: list[str] | None = None,
                  settings: TrainSettings | None = None, num_heads: int = 4, draft_vocab: int | None = None,
                  overwrite: bool = False, command: str = "", log=print, shared_readout: bool = False,
                  unroll: int = 1, eval_windows: int = EVAL_WINDOWS):
    """Train a `kind` drafter for the target in target_dir and save it to `out`. Returns (the
    trained module: MedusaHeads or EagleNet, the info written to its README and config.json).
    eval_windows: held-out windows the loss before and after is measured on (Medusa's head
    accuracies on twice as many)."""
    if kind not in KINDS:
        raise TrainDrafterError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if draft_vocab is not None and kind != "eagle":
        raise TrainDrafterError("--draft-vocab is for --kind eagle only")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 1:
        raise TrainDrafterError(f"--unroll must be a whole number >= 1 (drafting steps trained on), got {unroll!r}")
    if unroll > 1 and kind != "eagle":
        raise TrainDrafterError("--unroll is for --kind eagle only (Medusa's heads do not read their own guesses)")
    if isinstance(eval_windows, bool) or not isinstance(eval_windows, int) or eval_windows < 1:
        raise TrainDrafterError(f"--eval-windows must be a whole number >= 1, got {eval_windows!r}")
    if shared_readout and kind != "medusa":
        raise TrainDrafterError("--shared-readout is for --kind medusa only (EAGLE always reads out "
                                "through the target's head)")
    settings = settings or TrainSettings(batch_size=4, learning_rate=1e-3, warmup_steps=20)
    if settings.steps is None:
        settings = replace(settings, steps=DEFAULT_STEPS[kind])
    out = Path(out).expanduser().resolve()
    check_output_folder(out, overwrite)
    target = load_target(target_dir)
    V = target.config.vocab_size
    if draft_vocab is not None and not 1 <= draft_vocab <= V:
        raise TrainDrafterError(f"--draft-vocab must be between 1 and the vocabulary size {V}, got {draft_vocab}")
    context = min(CONTEXT, target.config.n_positions - 2)
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)  # the drafter's initialisation
    generator = torch.Generator().manual_seed(settings.seed)
    train_ids, held = corpus_tokens(texts, context)
    if int(train_ids.max()) >= V:
        raise TrainDrafterError(f"the corpus has token ids up to {int(train_ids.max())} but the target's "
                                f"vocabulary has {V}: it needs GPT-2's tokenizer")
    corpus = "the Python standard library's sources" if not texts else ", ".join(map(str, texts))
    log(f"{len(train_ids):,} training tokens ({corpus}), {len(held):,} held out")
    module = make_drafter(kind, target, num_heads, shared_readout)
    loss_before = held_out_loss(kind, module, target, held, context, eval_windows, unroll)
    info = train(kind, target, module, train_ids, settings, context, generator, log, unroll)
    info["held_out_loss"] = {"before": loss_before,
                             "after": held_out_loss(kind, module, target, held, context, eval_windows, unroll)}
    log(f"held-out loss {loss_before:.3f} -> {info['held_out_loss']['after']:.3f}")
    extra, config = {}, {}
    if kind == "medusa":
        info["head_accuracies"] = head_accuracies(module, target, held, context, 2 * eval_windows)
        config = {"num_heads": num_heads, "shared_readout": shared_readout,
                  "head_accuracies": info["head_accuracies"]}
        log("head accuracies (top-1): " + ", ".join(f"{a[0]:.1%}" for a in info["head_accuracies"]))
    else:
        config = {"unroll": unroll}
        if draft_vocab is not None:
            counts = torch.bincount(train_ids, minlength=V)
            extra["draft_vocab"] = counts.topk(draft_vocab).indices.sort().values
            config["draft_vocab"] = draft_vocab
    info.update({
        "kind": kind, "num_heads": num_heads if kind == "medusa" else None, "draft_vocab": draft_vocab,
        "shared_readout": shared_readout, "unroll": unroll,
        "command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "target_dir": str(target_dir), "target_config": asdict(target.config), "out": str(out),
        "corpus": corpus, "texts": list(texts) if texts else None, "train_tokens": len(train_ids),
        "held_out_tokens": len(held), "context": context, "settings": asdict(settings), "torch": torch.__version__,
    })
    info["fingerprint"] = target_fingerprint(target)

    def write(folder: Path):
        save_feature_drafter(folder, kind, module, target, {**config, "training": {
            k: v for k, v in info.items() if k not in ("losses", "target_config")}}, extra)
        write_readme(folder, info)

    write_pair_atomically(out, write)
    log(f"Saved {out} (see {out}/README.md)")
    return module, info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m offline.train_drafter",
        description="Train Medusa heads or an EAGLE-style drafter on a frozen target's features.")
    parser.add_argument("--target", required=True, help="the target's folder (a GPT-2 checkpoint)")
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--out", required=True, help="folder to create")
    parser.add_argument("--steps", type=int, help=f"training steps (default: medusa {MEDUSA_STEPS}, "
                                                   f"eagle {EAGLE_STEPS}: minutes each on a 2-core CPU, docs/feature_drafters.md)")
    parser.add_argument("--minutes", type=float, help="stop after this many minutes if the steps are not done "
                                                      "(the README says so)")
    parser.add_argument("--text", nargs="+", metavar="PATH",
                        help="text files or folders (default: the Python standard library's sources)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heads", type=int, default=4, help="--kind medusa: number of heads (default 4)")
    parser.add_argument("--shared-readout", action="store_true",
                        help="--kind medusa: read every head out through the target's own head instead of "
                             "an untied copy each (cheaper to run and to train; only the blocks learn)")
    parser.add_argument("--unroll", type=int, default=1, metavar="K",
                        help="--kind eagle: train drafting steps 1..K, each on its own predicted features "
                             "(EAGLE-3's training-time test; default 1: the first step, on real features)")
    parser.add_argument("--draft-vocab", type=int, metavar="N",
                        help="--kind eagle: draft over the corpus's N most frequent tokens only")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--eval-windows", type=int, default=EVAL_WINDOWS, metavar="N",
                        help=f"held-out windows of {CONTEXT} tokens the loss before and after training is measured "
                             f"on (Medusa's head accuracies on 2N; default {EVAL_WINDOWS})")
    parser.add_argument("--overwrite", action="store_true", help="replace a drafter already in --out")
    args = parser.parse_args(argv)
    if (args.minutes is not None and args.minutes <= 0) or (args.steps is not None and args.steps < 1) \
            or args.heads < 1 or args.batch_size < 1:
        parser.error("--minutes must be > 0, --steps, --heads and --batch-size >= 1")
    settings = TrainSettings(minutes=args.minutes, steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                             learning_rate=args.learning_rate, warmup_steps=20)
    command = " ".join(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: train_drafter(args.target, args.kind, args.out, args.text, settings, args.heads,
                                             args.draft_vocab, args.overwrite, command,
                                             shared_readout=args.shared_readout, unroll=args.unroll,
                                             eval_windows=args.eval_windows), args.out)


if __name__ == "__main__":
    sys.exit(main())
