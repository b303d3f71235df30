"""How much faster is speculative decoding than the target alone? Measure it over a grid.

    python benchmark.py                       # draft gpt2, target gpt2-large (from the hub)
    python benchmark.py --draft DIR --target DIR --gammas 1 2 4 --max-gens 50 100
    python benchmark.py --make-standins checkpoints/standins-pair --max-gens 50 100 200 --repeats 1
    python benchmark.py --drafters model ngram layerskip:6 --gammas 2 4   # drafters side by side
    python benchmark.py --gammas 3 9 --trees 3,1,1 2,2,1   # token trees beside chains
    python benchmark.py --drafters model medusa:DIR --gammas 4 --trees 2,1   # each tree drafter's trees

For each cell of the grid gamma x max_gen x temperature, every prompt (one per line of --prompts)
is generated --repeats times by the target alone (spec_decoding.autoregressive_generate, the
baseline) and speculatively (speculative_sampling_greedy at temperature 0, speculative_sampling
with a seeded generator otherwise). The baseline of a (temperature, max_gen, prompt, repeat) is
timed right before the speculative runs of every gamma, so both see the same machine state.
Generation never stops early at <|endoftext|>: every run makes max_gen tokens. --drafters makes
the drafter a grid axis too (spec_decoding/drafters/drafter.py): model (--draft), ngram[:N] (prompt
lookup with n-grams of up to N tokens, default 3), layerskip:K (the target's first K blocks), medusa:DIR / eagle:DIR (feature drafters,
docs/feature_drafters.md); every
drafter runs right after the same baseline.

A run's speed-up is baseline seconds / speculative seconds; a cell reports the median over its
runs (prompts x repeats) with the quartiles and min/max. Before the grid, the script measures on
warm KV caches what the theory needs: c = draft step / target step (per drafter), and the target's cost of
verifying gamma + 1 tokens relative to one step. spec_decoding.policies.theory.predicted_speedup then
gives Leviathan et al.'s predicted speed-up from the measured acceptance, shown beside the
measured one.

Acceptance, two ways: acceptance_rate is GenerationStats' accepted / drafted draft tokens (every
drafted position counts, also those after the first rejection, which the target never judged).
alpha is accepted / (accepted + rejected): the chance that a draft token the target judged was
accepted, the alpha of the theory. For gamma = 1 they are equal; the prediction uses alpha.

Loops: a small model's greedy text often repeats itself (runs of spaces, a line again and again),
which the draft predicts as well as the target, so its acceptance and speed-up measure the loop,
not the drafter. Every run's text is measured (spec_decoding/presentation/loops.py), and every table and plot
marks a cell some of whose runs looped: "output looped: acceptance inflated". The best gamma is
given per temperature (greedy and sampled cells are different experiments).

--trees B1,B2,... adds token trees (spec_decoding.algorithms.tree) to the grid beside the gammas, drafted by
every drafter in --drafters that drafts trees (a draft model scores the tree level by level; Medusa
heads build it with their propose_tree; spec_decoding.cli.DRAFTER_KINDS says which kinds do): each
(drafter, tree) is timed like a gamma, the target's cost of verifying all the tree's nodes in one
forward is measured, and the cells go to a table of their own ("tree_cells" in results.json, rows
with a tree in the CSV, each naming its drafter), beside the same drafter's chain of as many draft
tokens (or else as deep as the tree). A tree's prediction is Leviathan's speed-up with the measured tokens per round:
tokens per target call / (depth * c + verify cost of its nodes), c being the drafter's own draft
step (spec_decoding.policies.theory.predicted_tree_speedup says why depth * c fits both kinds).

Output in --out (default runs/benchmark): results.csv (one row per cell), results.json (cells
with their runs, costs, environment), summary.md (the table printed at the end) and PNG plots.
On a CPU that other programs keep busy, --threads 1 times more steadily than one thread per core
(threads that wait for each other slow every step down when a core is taken).
Offline? Pass local folders (config.json + model.safetensors) with --draft/--target: for real
acceptance, the small pair trained here by `python -m offline.train_pair --out runs/trained_pair`
(--target runs/trained_pair/target --draft runs/trained_pair/draft); for the real models' costs,
random-weight stand-ins of the real shapes with --make-standins DIR (their speed is the real
models' speed; their text and acceptance are not: they accept almost everything).
"""

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while the libraries below import: a quiet exit, not their traceback
    # os._exit, not sys.exit: the signal may land inside torch's C++ import code, where a Python
    # exception aborts the process; nothing is open yet that needs closing.
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))

import argparse
import csv
import datetime
import itertools
import json
import platform
import shlex
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gpt2 import GPT2Config, CheckpointError, load_gpt2
from gpt2.speed import load_accelerated, speed_line
from gpt2.speed.compiled import COMPILE_FLAGS
from benchmarks.common import gamma_order, read_prompts, timed
from gpt2.speed.device import dtype_note, note_once, resolve_device, resolve_dtype
from gpt2.loading import TRAIN_PAIR_COMMAND, check_local_checkpoint, peek_config
from gpt2.speed.machine_load import busy_note, load_average
from spec_decoding import (HeuristicGamma, SamplingParams, autoregressive_generate, speculative_sampling,
                           tree_speculative_sampling)
from spec_decoding.algorithms.batched import MAX_BATCH_SIZE
from spec_decoding.drafters.token_tree import branching_label, parse_branching, tree_size
from spec_decoding.algorithms.decoding import check_drafter
from spec_decoding import cli
from spec_decoding.policies.costs import CostModel
from spec_decoding.policies.gamma import DEFAULT_GAMMA_MAX
from spec_decoding.presentation.loops import LOOP_MARK, loop_share, looped
from spec_decoding.policies.theory import predicted_speedup, predicted_tree_speedup
from spec_decoding.calibration import calibrate_costs

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here on, Ctrl-C is KeyboardInterrupt again

ROOT = Path(__file__).resolve().parent
DEFAULT_PROMPTS = ROOT / "prompts" / "default.txt"
RESULT_FILES = ("results.json", "results.csv", "summary.md")
STANDIN_MARKER = "standins.json"  # written beside DIR/target and DIR/draft by --make-standins
CSV_COLUMNS = [
    "drafter", "gamma", "max_gen", "temperature", "runs", "speedup_median", "speedup_q1", "speedup_q3",
    "speedup_min", "speedup_max", "predicted_speedup", "target_tokens_per_s", "spec_tokens_per_s",
    "acceptance_rate", "alpha", "tokens_per_target_call", "generated_tokens", "target_calls",
    "draft_calls", "acceptance_by_position", "tokens_match_baseline", "hf_speedup_median",
    "tree", "nodes_per_target_call", "cost_model_speedup", "mean_gamma", "plain_rounds", "looped_runs",
]


# ---------------------------------------------------------------- command line

def fixed_gammas(gammas) -> list[int]:
    return [g for g in gammas if isinstance(g, int)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"Offline (no hub): train a small real pair first, {TRAIN_PAIR_COMMAND}\n"
                                       f"(about 10 minutes on 2 CPU cores), then --target runs/trained_pair/target "
                                       f"--draft runs/trained_pair/draft;\nor time random-weight stand-ins of the "
                                       f"real shapes with --make-standins DIR.")
    p.add_argument("--draft", default="gpt2", help="hub name/repo or local folder (default gpt2), for the model drafter")
    p.add_argument("--drafters", type=cli.drafter_spec, nargs="+", default=["model"], metavar="D",
                   help="what drafts; several make a grid axis (default model): " + cli.spec_help())
    p.add_argument("--target", default="gpt2-large", help="hub name/repo or local folder (default gpt2-large)")
    p.add_argument("--gammas", type=cli.gamma_value, nargs="+", default=[1, 2, 4, 8], metavar="G",
                   help="draft tokens per round (default 1 2 4 8), or a policy choosing them each "
                        "round: auto (from the measured costs and acceptance), heuristic (transformers')")
    p.add_argument("--gamma-max", type=cli.positive_int, default=DEFAULT_GAMMA_MAX,
                   help=f"the most tokens auto and heuristic draft per round (default {DEFAULT_GAMMA_MAX})")
    p.add_argument("--trees", type=cli.branching, nargs="+", default=[], metavar="B1,B2,...",
                   help="token trees to time beside the gammas, e.g. 2,2,1 3,1,1 (children per depth), "
                        f"with every drafter in --drafters that drafts trees ({cli.tree_drafters()})")
    p.add_argument("--max-gens", type=cli.positive_int, nargs="+", default=[50, 100, 200, 500], metavar="N",
                   help="new tokens per generation (default 50 100 200 500)")
    p.add_argument("--temperatures", type=cli.temperature, nargs="+", default=[0.0], metavar="T",
                   help="0 = greedy (default), > 0 = speculative sampling")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="text file, one prompt per line")
    p.add_argument("--repeats", type=cli.positive_int, default=1, help="timed runs per prompt and cell")
    p.add_argument("--warmup", type=cli.non_negative_int, default=1, help="untimed warm-up rounds first")
    p.add_argument("--seed", type=int, default=0, help="seeds the sampling generators (temperature > 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto (default): per model, the format measured fastest on this CPU for its "
                        "shapes (float32, float16 weights or bfloat16; python -m gpt2.speed.kernel_report); "
                        "bfloat16/float16 on a GPU")
    p.add_argument("--quantize", choices=["int8", "fp16", "w8a8"], help="formats made at load time: int8 (weights per channel), fp16 (float16 weights, float32 math), w8a8 (int8's weights, inputs rounded to int8 in blocks)")
    p.add_argument("--draft-quantize", choices=["int8", "fp16", "w8a8"], help="the draft's format, as --quantize")
    p.add_argument("--compile", choices=list(COMPILE_FLAGS), default="off",
                   help="the compiled decode path (gpt2/speed/compiled.py; CPU or CUDA): on; graph, the step as one "
                   "CUDA graph (gpt2/speed/cuda_graph.py; a GPU); fused: on a CPU every block in one call to C "
                   "(gpt2/speed/native_step.py; int8 and w8a8 weights), on a GPU the graph with five Triton kernels "
                   "a block (gpt2/speed/fused_step.py); auto (the faster here: fused, else compiled, on a CPU, "
                   "graph on a GPU, only where it measures faster); or off (default)")
    p.add_argument("--threads", type=cli.positive_int, help="CPU threads for torch (default: its own choice)")
    p.add_argument("--plain", action="store_true",
                   help="time the models as gpt2/model.py is written (float32, nn.Linear); without it the "
                        "models take gpt2.speed's step (said in the load line)")
    p.add_argument("--out", type=Path, default=Path("runs/benchmark"), help="output folder (default runs/benchmark)")
    p.add_argument("--force", action="store_true", help="overwrite results already in --out")
    p.add_argument("--make-standins", type=Path, metavar="DIR",
                   help="write a random-weight gpt2-large-shaped target and a draft made of its "
                        "first 4 blocks into DIR/target and DIR/draft (reused if there), benchmark them")
    p.add_argument("--compare-hf", action="store_true",
                   help="also time transformers' assisted generation (temperature 0) on the same pair")
    p.add_argument("--batch", type=cli.positive_int, nargs="+", metavar="B",
                   help="batched decoding instead of the grid: for each batch size B, B prompts at once "
                        "(the prompts file cycled), batched autoregressive vs batched speculative at each "
                        "fixed gamma, the first --max-gens and --temperatures (benchmarks/batched_speed.py)")
    args = p.parse_args(argv)
    if args.batch and (args.drafters != ["model"] or args.trees or args.compare_hf
                       or not all(isinstance(g, int) for g in args.gammas)):
        p.error("--batch runs the model drafter with fixed gammas only: drop --drafters, --trees, "
                "--compare-hf and the gamma policies (auto, heuristic)")
    if args.batch and max(args.batch) > MAX_BATCH_SIZE:
        p.error(f"--batch {max(args.batch)}: the largest batch is {MAX_BATCH_SIZE} "
                f"(spec_decoding.algorithms.batched.MAX_BATCH_SIZE)")
    args.drafters = list(dict.fromkeys(args.drafters))  # keep the order given, drop repeats
    args.gammas = sorted(set(args.gammas), key=gamma_order)
    args.trees = sorted(set(args.trees), key=lambda b: (tree_size(b), b))
    if args.trees and not any(cli.drafts_trees(name) for name in args.drafters):
        p.error(f"--trees needs a drafter that drafts token trees, and none of --drafters "
                f"{' '.join(args.drafters)} does: add one of {cli.tree_drafters()} to --drafters")
    args.max_gens = sorted(set(args.max_gens))
    args.temperatures = sorted(set(args.temperatures))
    if not args.prompts.is_file():
        p.error(f"--prompts {args.prompts}: no such file")
    if args.plain and (args.quantize or args.draft_quantize or args.compile != "off"):
        p.error("--plain times gpt2/model.py as written (float32, nn.Linear); --quantize, --draft-quantize "
                "and --compile are speed options: leave them out, or drop --plain")
    existing = ", ".join(f for f in RESULT_FILES if (args.out / f).exists())
    if existing and not args.force:
        p.error(f"{args.out} already holds results ({existing}); not overwriting them. "
                f"Pass --force to overwrite, or choose another --out.")
    if args.compare_hf:
        from benchmarks.hf_assisted import transformers_missing_message
        if message := transformers_missing_message():
            p.error(message)
    return args


# ---------------------------------------------------------------- setup

def make_standins(directory: Path, seed: int) -> tuple[Path, Path]:
    """A gpt2-large-shaped target and a draft of its first 4 blocks (save_agreeing_pair). Damping
    0.35 with embeddings of std 0.3 makes them agree about as often as real GPT-2 pairs
    (docs/performance.md has the measured rate)."""
    from offline.random_weights import save_agreeing_pair

    recipe = {"what": "random-weight stand-ins: they time like the real models; text and acceptance are not real",
              "target": "gpt2-large shape (36 blocks, width 1280)",
              "draft": "the target's first 4 blocks; the target's later blocks damped (save_agreeing_pair)",
              "damping": 0.35, "embedding_std": 0.3, "seed": seed}
    target_dir, draft_dir = directory / "target", directory / "draft"
    marker = directory / STANDIN_MARKER
    if marker.is_file() and json.loads(marker.read_text()) == recipe and all(
            (d / f).is_file() for d in (target_dir, draft_dir) for f in ("config.json", "model.safetensors")):
        print(f"Reusing the stand-in pair in {directory} (delete it to make a new one).")
        return target_dir, draft_dir
    print(f"Writing a random-weight stand-in pair of the gpt2-large shape to {directory} ...", flush=True)
    marker.unlink(missing_ok=True)
    save_agreeing_pair(target_dir, draft_dir, GPT2Config.from_name("gpt2-large"), draft_n_layer=4,
                       damping=recipe["damping"], embedding_std=recipe["embedding_std"], seed=seed)
    marker.write_text(json.dumps(recipe, indent=2))
    return target_dir, draft_dir


def is_standin(name_or_path: str) -> bool:
    return (Path(name_or_path).parent / STANDIN_MARKER).is_file()


def load_model(role: str, name_or_path: str, device, dtype, quantize=None, compile="off", plain: bool = False):
    """The model as gpt2/model.py reads it (load_gpt2, --plain), or with gpt2.speed's step taken
    (load_accelerated: the format and kernels that run it fastest here; the default)."""
    try:
        if plain:
            return load_gpt2(name_or_path, device=device, dtype="float32" if dtype == "auto" else dtype)
        return load_accelerated(name_or_path, device=device, dtype=dtype, quantize=quantize,
                                compile=COMPILE_FLAGS[compile])
    except CheckpointError as e:
        sys.exit(f"error: could not load the {role} model {name_or_path!r}:\n{e}\n\n"
                 f"Offline? Pass local folders holding config.json + model.safetensors with "
                 f"--draft DIR --target DIR, or benchmark random-weight stand-ins of the real "
                 f"shapes with --make-standins DIR.")


def clamp_max_gens(max_gens: list[int], prompts: list[list[int]], n_positions: int) -> list[int]:
    """max_gens with every value cut to what the context window leaves after the longest prompt, so
    that every run makes max_gen tokens; says so when it cuts."""
    room = n_positions - max(len(p) for p in prompts)
    if room < 1 or max(max_gens) <= room:
        return max_gens  # room < 1: check_prompts_fit says what is wrong
    print(f"note: --max-gens {' '.join(str(m) for m in max_gens if m > room)}: the models' context "
          f"window of {n_positions} tokens leaves room for {room} new tokens after the longest "
          f"prompt ({n_positions - room} tokens); clamped to {room}.", flush=True)
    return sorted({min(m, room) for m in max_gens})


def check_prompts_fit(prompts: list[list[int]], vocab_size: int, n_positions: int) -> None:
    if longest := max((len(p) for p in prompts if len(p) >= n_positions), default=0):
        sys.exit(f"error: a prompt has {longest} tokens; the models' context window holds "
                 f"{n_positions}, so prompts must be shorter. Shorten it in the prompts file.")
    if any(max(ids) >= vocab_size for ids in prompts):
        sys.exit(f"error: the models' vocabulary has {vocab_size} tokens, too few for GPT-2's "
                 f"tokenizer, which the text prompts are encoded with")


# ---------------------------------------------------------------- measuring

def make_drafters(names, target, draft) -> dict:
    """name -> Drafter for the --drafters given (draft: the loaded --draft model, or None)."""
    drafters = {}
    for name in names:
        try:
            drafters[name] = cli.make_drafter(name, target, draft)
        except ValueError as e:
            sys.exit(f"error: --drafters {name}: {e}")
    return drafters


def measure_costs(target, drafters: dict, gammas, gamma_max, context_len, trees=()) -> tuple[dict, dict]:
    """(costs for the tables and results.json, {drafter name: CostModel}).

    Each drafter's CostModel (spec_decoding/policies/costs.py, the one place per-call costs are timed) is
    what gamma="auto" chooses from and what prices every run's rounds for the cost-model speedup;
    c and the verification costs of the tables are read from them (verification from the first
    drafter's, whose target timings are as good as any). Token trees add the target scoring each
    tree, timed by the first drafter's CostModel beside its target steps (the target's cost: the
    same whichever drafter built the tree)."""
    gamma_max = max([gamma_max, *gammas])
    first_name = next(iter(drafters))  # top-level c: the first drafter's (notebook 4 reads it)
    cost_models = {name: calibrate_costs(target, drafter, gamma_max, context_len, min_rounds=4,
                                         trees=trees if name == first_name else ())
                   for name, drafter in drafters.items()}
    by_drafter = {name: {"c": cm.c, "draft_step_ms": 1000 * cm.draft_step_s} for name, cm in cost_models.items()}
    first = cost_models[first_name]
    costs = {"verify_cost_by_gamma": {gamma: first.verify_cost(gamma) for gamma in gammas},
             "verify_cost_by_tree": {branching_label(b): first.tree_verify_cost(b) for b in trees},
             "context_len": context_len, "target_step_ms": 1000 * first.target_step_s,
             "drafters": by_drafter, "c": by_drafter[first_name]["c"],
             "draft_step_ms": by_drafter[first_name]["draft_step_ms"],
             "cost_models": {name: asdict(cm) for name, cm in cost_models.items()},
             "break_even_alpha": {name: cm.break_even_alpha() for name, cm in cost_models.items()}}
    return costs, cost_models


def speculate(target, drafter, prompt, max_gen, gamma, temperature, generator, args=None, cost_model=None):
    """gamma: draft tokens per round (a chain), a policy name (auto, heuristic: bounded by
    args.gamma_max; auto uses cost_model), or a branching tuple (a token tree)."""
    if isinstance(gamma, tuple):
        return tree_speculative_sampling(target, drafter, prompt, max_gen, gamma,
                                         sampling=SamplingParams(temperature=temperature, generator=generator))
    if gamma == "auto":
        gamma = cost_model.up_to(args.gamma_max)  # AutoGamma decides from these costs
    elif gamma == "heuristic":
        gamma = HeuristicGamma(args.gamma_max)
    return speculative_sampling(target, drafter, prompt, max_gen, gamma,
                                SamplingParams(temperature=temperature, generator=generator))


def seeded(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def tree_drafters(drafters: dict) -> list[str]:
    """The names among `drafters` whose kind drafts token trees (cli.DRAFTER_KINDS), in order."""
    return [name for name in drafters if cli.drafts_trees(name)]


def warm_up(target, drafters, prompts, args, device, cost_models) -> None:
    """Untimed runs of every shape the grid uses (first calls allocate and pick kernels)."""
    n = min(16, args.max_gens[0])
    for i in range(args.warmup):
        for t in args.temperatures:
            autoregressive_generate(target, prompts[0], n,
                                    sampling=SamplingParams(temperature=t, generator=seeded(i, device)))
            for name, drafter in drafters.items():
                for gamma in args.gammas:
                    speculate(target, drafter, prompts[0], n, gamma, t, seeded(i, device), args,
                              cost_models[name])
            for name, branching in itertools.product(tree_drafters(drafters), args.trees):
                speculate(target, drafters[name], prompts[0], n, branching, t, seeded(i, device))


def run_grid(target, drafters, prompts, args, device, cost_models) -> list[dict]:
    """One record per speculative run; each (temperature, max_gen, repeat, prompt) times the
    target alone first, then speculative decoding with every drafter and gamma."""
    records = []
    # (drafter name, gamma or branching tuple): every drafter's chains, then every tree drafter's trees
    variants = (list(itertools.product(drafters, args.gammas))
                + list(itertools.product(tree_drafters(drafters), args.trees)))
    runs_per_baseline = 1 + len(variants)
    total = len(args.temperatures) * args.repeats * len(prompts) * runs_per_baseline * sum(args.max_gens)
    bar = tqdm(total=total, unit="tok", desc="benchmark", dynamic_ncols=True)
    for temperature in args.temperatures:
        for max_gen in args.max_gens:
            for repeat in range(args.repeats):
                for p, prompt in enumerate(prompts):
                    where = f"T={temperature:g} max_gen={max_gen} prompt {p + 1}/{len(prompts)} rep {repeat + 1}"
                    seed = args.seed + 1000 * repeat + p
                    bar.set_description(f"{where}: target alone")
                    base, base_s = timed(device, autoregressive_generate, target, prompt, max_gen,
                                         SamplingParams(temperature, generator=seeded(seed, device)))
                    bar.update(max_gen)
                    for name, gamma in variants:
                        tree = branching_label(gamma) if isinstance(gamma, tuple) else None
                        bar.set_description(f"{where}: {name} " + (f"tree={tree}" if tree else f"gamma={gamma}"))
                        spec, spec_s = timed(device, speculate, target, drafters[name], prompt, max_gen, gamma,
                                             temperature, seeded(seed, device), args, cost_models[name])
                        bar.update(max_gen)
                        s = spec.stats
                        records.append({
                            "drafter": name, "temperature": temperature, "max_gen": max_gen,
                            "gamma": len(gamma) if tree else gamma, "tree": tree,
                            "nodes_verified": s.nodes_verified,
                            "repeat": repeat, "prompt_index": p, "prompt_tokens": len(prompt),
                            "baseline_seconds": base_s, "spec_seconds": spec_s, "speedup": base_s / spec_s,
                            "baseline_tokens": len(base.tokens), "generated_tokens": s.tokens_generated,
                            "target_calls": s.target_calls, "draft_calls": s.draft_calls,
                            "tokens_drafted": s.tokens_drafted, "tokens_accepted": s.tokens_accepted,
                            "rejections": s.rejections,
                            "drafted_by_position": s.drafted_by_position,
                            "accepted_by_position": s.accepted_by_position,
                            "gamma_by_round": s.gamma_by_round,
                            "tokens_match_baseline": spec.tokens == base.tokens if temperature == 0 else None,
                            # a looping output is accepted because it repeats itself (spec_decoding/presentation/loops.py)
                            "loop_share": loop_share(spec.tokens), "looped": looped(spec.tokens),
                        })
    bar.close()
    return records


# ---------------------------------------------------------------- summarizing

def cost_model_speedup(runs: list[dict], cost_model: CostModel) -> float:
    """The speed-up the measured per-call costs give for these runs' rounds: max_gen target steps
    over the sum of round_seconds(g) of every round. No timer is involved, so a busy machine does
    not move it; it leaves out what the CostModel does not time (Python overhead, sampling, the
    prompt's forward)."""
    baseline = sum(r["baseline_tokens"] for r in runs) * cost_model.target_step_s
    return baseline / sum(cost_model.round_seconds(g) for r in runs for g in r["gamma_by_round"])


def summarize_cell(runs: list[dict], costs: dict) -> dict:
    first = runs[0]
    gamma = first["gamma"]
    speedups = np.array([r["speedup"] for r in runs])

    def total(key):
        return sum(r[key] for r in runs)

    accepted, drafted, rejected = total("tokens_accepted"), total("tokens_drafted"), total("rejections")
    alpha = accepted / (accepted + rejected) if accepted + rejected else None
    positions = len(first["drafted_by_position"])  # gamma, or gamma_max for a policy
    drafted_at = [sum(r["drafted_by_position"][i] for r in runs) for i in range(positions)]
    accepted_at = [sum(r["accepted_by_position"][i] for r in runs) for i in range(positions)]
    by_position = [a / d if d else None for a, d in zip(accepted_at, drafted_at)]
    c = costs["drafters"][first["drafter"]]["c"]
    tree = first.get("tree")
    tokens_per_call = total("generated_tokens") / total("target_calls")
    policy = tree is None and not isinstance(gamma, int)  # auto, heuristic: gamma changes by round
    if policy:
        verify, predicted = None, None
    elif tree is None:
        verify = costs["verify_cost_by_gamma"][gamma]
        predicted = predicted_speedup(alpha, gamma, c, verify) if alpha is not None else None
    else:  # Leviathan's tokens per round over the round's cost, with the measured tokens per round
        verify = costs["verify_cost_by_tree"][tree]
        # The depth the drafter reached: a drafter may build shallower trees than asked (Medusa
        # drafts at most one depth per head), and drafts no deeper than that each round.
        depth = sum(1 for d in drafted_at if d)
        predicted = predicted_tree_speedup(tokens_per_call, depth, c, verify)
    return {
        "tree": tree, "nodes_per_target_call": total("nodes_verified") / total("target_calls"),
        "verify_cost": verify,
        "drafter": first["drafter"], "gamma": gamma, "max_gen": first["max_gen"], "temperature": first["temperature"], "runs": len(runs),
        "speedup_median": float(np.median(speedups)),
        "speedup_q1": float(np.percentile(speedups, 25)), "speedup_q3": float(np.percentile(speedups, 75)),
        "speedup_min": float(speedups.min()), "speedup_max": float(speedups.max()),
        "predicted_speedup": predicted,
        "target_tokens_per_s": total("baseline_tokens") / total("baseline_seconds"),
        "spec_tokens_per_s": total("generated_tokens") / total("spec_seconds"),
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": alpha,
        "tokens_per_target_call": tokens_per_call,
        "generated_tokens": total("generated_tokens"),
        "target_calls": total("target_calls"), "draft_calls": total("draft_calls"),
        "acceptance_by_position": by_position,
        "tokens_match_baseline": all(r["tokens_match_baseline"] for r in runs) if first["temperature"] == 0 else None,
        "looped_runs": sum(r["looped"] for r in runs),
        **({} if tree else policy_columns(runs, CostModel(**costs["cost_models"][first["drafter"]]))),
        "run_records": runs,
    }


def policy_columns(runs: list[dict], cost_model: CostModel) -> dict:
    """A chain cell's mean g per round, its rounds without drafting, and its cost-model speedup."""
    rounds = [g for r in runs for g in r["gamma_by_round"]]
    return {"mean_gamma": float(np.mean(rounds)), "plain_rounds": rounds.count(0),
            "cost_model_speedup": cost_model_speedup(runs, cost_model)}


def best_gammas(cells: list[dict]) -> tuple[int, int | None]:
    """The fixed gamma with the best mean (over the cells) measured and predicted speed-up."""
    def best(key):
        by_gamma = {}
        for cell in cells:
            if cell[key] is not None and isinstance(cell["gamma"], int):
                by_gamma.setdefault(cell["gamma"], []).append(cell[key])
        return max(by_gamma, key=lambda g: np.mean(by_gamma[g])) if by_gamma else None
    return best("speedup_median"), best("predicted_speedup")


def environment(args, device, dtype, standins: bool, kernels: dict | None = None) -> dict:
    """The run's machine, versions and settings; kernels: role -> the kernels loading chose for that
    model (kernel_choices)."""
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        names = [l.split(":", 1)[1].strip() for l in cpuinfo.read_text().splitlines()
                 if l.startswith("model name")] if cpuinfo.exists() else []
        device_name = names[0] if names else (platform.processor() or platform.machine())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "device": str(device), "device_name": device_name, "dtype": str(dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "draft": str(args.draft), "target": str(args.target),
        "quantize": args.quantize, "draft_quantize": args.draft_quantize, "compile": args.compile,
        "drafters": args.drafters,
        "standins": standins, "prompts_file": str(args.prompts), "repeats": args.repeats,
        "warmup": args.warmup, "seed": args.seed, "git_commit": commit,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "kernels": kernels or {},
    }


def kernel_choices(target, draft=None) -> dict:
    """role -> what runs the model: gpt2/model.py as written (--plain), or gpt2.speed's format and
    kernels (which loading logs to the logger gpt2.speed rather than prints); here it is part of
    the run's summary."""
    return {role: speed_line(model)
            for role, model in (("target", target), ("draft", draft)) if model is not None}


def loop_flag(cells: list[dict]) -> str:
    """The mark for cells some of whose runs looped (spec_decoding/presentation/loops.py), "" for none (also for
    cells of a results file written before runs were measured for loops)."""
    looped_runs, runs = sum(c.get("looped_runs", 0) for c in cells), sum(c.get("runs", 0) for c in cells)
    return f"{LOOP_MARK} ({looped_runs}/{runs} runs)" if looped_runs else ""


def best_gamma_lines(cells: list[dict]) -> list[str]:
    """The best fixed gamma, measured and predicted, per drafter and temperature (greedy and
    sampled cells are different experiments: averaging them would hide both), marked where the
    best gamma's cells looped."""
    drafters = list(dict.fromkeys(c["drafter"] for c in cells))
    lines = []
    for name, t in itertools.product(drafters, sorted({c["temperature"] for c in cells})):
        rows = [c for c in cells if c["drafter"] == name and c["temperature"] == t]
        measured, predicted = best_gammas(rows)
        if measured is None:
            continue
        flag = loop_flag([c for c in rows if c["gamma"] == measured])
        lines.append(f"Best gamma{'' if len(drafters) == 1 else ' for ' + name} at temperature {t:g}: "
                     f"measured {measured}, predicted {predicted}" + (f"; its cells: {flag}." if flag else "."))
    return lines


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def drafter_label(name: str, env: dict) -> str:
    """model -> "model gpt2"; ngram:3 -> "ngram:3 (prompt lookup)"; layerskip:6 -> "layerskip:6 (...)"."""
    if name == "model":
        return f"model {env['draft']}"
    return f"{name} ({cli.describe_drafter(name)})"


def drafters_side_by_side(results: dict) -> list[str]:
    """One row per drafter and temperature, at the drafter's best gamma there (averaged over max_gen)."""
    cells, costs = results["cells"], results["costs"]
    lines = ["Drafters side by side, each at its best gamma (averages over max_gen):", "",
             "| Drafter | Temperature | Draft step / target step (c) | Best gamma | Speedup | alpha "
             "| Tokens/target call | Loops |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in dict.fromkeys(c["drafter"] for c in cells):
        for t in sorted({c["temperature"] for c in cells}):
            rows = [c for c in cells if c["drafter"] == name and c["temperature"] == t]
            by_gamma = {g: [c for c in rows if c["gamma"] == g]
                        for g in sorted({c["gamma"] for c in rows}, key=gamma_order)}
            mean = lambda gc, key: float(np.mean([c[key] for c in gc])) if all(c[key] is not None for c in gc) else None
            best = max(by_gamma, key=lambda g: mean(by_gamma[g], "speedup_median"))
            gc = by_gamma[best]
            lines.append(f"| {name} | {t:g} | {costs['drafters'][name]['c']:.3f} | {best} | "
                         f"{mean(gc, 'speedup_median'):.2f}x | {fmt(mean(gc, 'alpha'))} | "
                         f"{mean(gc, 'tokens_per_target_call'):.2f} | {loop_flag(gc) or 'none'} |")
    return lines


def tree_summary(tree_cells: list[dict], cells: list[dict], costs: dict) -> list[str]:
    """The token trees' table, one row per (drafter, temperature, tree), each beside the same
    drafter's chain: the gamma with as many draft tokens as the tree has nodes (equal verification
    width) when that gamma was run, else the gamma as deep as the tree (equal draft depth)."""
    lines = ["Token trees (averages over max_gen; chain = the same drafter's gamma with as many draft "
             "tokens as the tree has nodes, or else as deep as the tree, same temperature):", "",
             "| Drafter | Tree | T | Nodes | Avg Speedup | Predicted | Tokens/target call | Nodes/target call "
             "| Verify cost | Chain gamma | Chain speedup | Chain tokens/call | Same tokens | Loops |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---|"]
    for name, t, tree in dict.fromkeys((c["drafter"], c["temperature"], c["tree"]) for c in tree_cells):
        tc = [c for c in tree_cells if (c["drafter"], c["temperature"], c["tree"]) == (name, t, tree)]
        n, depth = tree_size(parse_branching(tree)), len(parse_branching(tree))
        chain, chain_gamma = [], "-"
        for gamma in (n, depth):
            chain = [c for c in cells if c["drafter"] == name and c["temperature"] == t and c["gamma"] == gamma]
            if chain:
                chain_gamma = gamma
                break

        def avg(rows, key):
            values = [c[key] for c in rows if c.get(key) is not None]
            return float(np.mean(values)) if values else None
        same = "n/a" if t else ("yes" if all(c["tokens_match_baseline"] for c in tc) else "**NO**")
        lines.append(f"| {name} | {tree} | {t:g} | {n} | {avg(tc, 'speedup_median'):.2f}x "
                     f"| {fmt(avg(tc, 'predicted_speedup'))}x "
                     f"| {avg(tc, 'tokens_per_target_call'):.2f} | {avg(tc, 'nodes_per_target_call'):.1f} "
                     f"| {costs['verify_cost_by_tree'][tree]:.2f} | {chain_gamma} | {fmt(avg(chain, 'speedup_median'))}x "
                     f"| {fmt(avg(chain, 'tokens_per_target_call'))} | {same} | {loop_flag(tc) or 'none'} |")
    return lines + [""]


def load_note(env: dict) -> str | None:
    """A line when other programs held the cores while the grid was timed (the load average, before
    and after, above the core count): each run's baseline was timed right before it, so a speed-up
    is still a fair pair, but a rough one."""
    loads, cores = env.get("load_average") or [], env.get("cores") or 1
    if not loads or max(loads) <= cores:
        return None
    return (f"Note: the machine was busy while timing (load average up to {max(loads):.1f} on {cores} cores): "
            f"take the speed-ups as rough; the spread of each cell is in results.csv (speedup_q1 .. speedup_q3). "
            f"--threads 1, or a quieter machine, steadies them.")


def summary_markdown(results: dict) -> str:
    """The terminal summary (markdown tables): per drafter, one row per gamma, averaged over max_gen."""
    cells, costs, env = results["cells"], results["costs"], results["environment"]
    drafters = list(dict.fromkeys(c["drafter"] for c in cells))
    drafted_by = "drafter " + drafter_label(drafters[0], env) if len(drafters) == 1 else f"{len(drafters)} drafters"
    lines = [f"Target {env['target']}, {drafted_by}"
             + (" (random-weight stand-ins)" if env["standins"] else "")
             + f", {env['device']} ({env['device_name']}), {env['dtype']}, {env['threads']} thread{'s' * (env['threads'] != 1)}"]
    lines += [f"Kernels ({role}): {choice}" for role, choice in env.get("kernels", {}).items()]
    if note := load_note(env):
        lines.append(note)
    lines.append("")
    if len(drafters) > 1:
        lines += drafters_side_by_side(results) + [""]
    for name, t in itertools.product(drafters, sorted({c["temperature"] for c in cells})):
        rows = [c for c in cells if c["temperature"] == t and c["drafter"] == name]
        if len(drafters) > 1 and t == min(c["temperature"] for c in cells):
            lines += [f"### Drafter {drafter_label(name, env)}", ""]
        max_gens = sorted({c["max_gen"] for c in rows})
        hf = any(c.get("hf_speedup_median") is not None for c in rows)
        lines += [f"Temperature {t:g} ({'greedy' if t == 0 else 'sampling'}); averages over "
                  f"max_gen {', '.join(map(str, max_gens))}; target alone: "
                  f"{np.mean([c['target_tokens_per_s'] for c in rows]):.1f} tokens/s", "",
                  "| Gamma | Avg Speedup | Predicted | Cost-model speedup | Avg Tokens/s | Acceptance | alpha "
                  "| Tokens/target call | Mean g (plain rounds) | Tests | Same tokens |"
                  + (" HF assisted speedup |" if hf else "") + " Loops |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|" + ("---:|" if hf else "") + "---|"]
        for g in sorted({c["gamma"] for c in rows}, key=gamma_order):
            gc = [c for c in rows if c["gamma"] == g]

            def avg(key):
                values = [c[key] for c in gc if c.get(key) is not None]
                return float(np.mean(values)) if values else None
            same = "n/a" if t else ("yes" if all(c["tokens_match_baseline"] for c in gc) else "**NO**")
            lines.append(
                f"| {g} | {avg('speedup_median'):.2f}x ({min(c['speedup_min'] for c in gc):.2f}-"
                f"{max(c['speedup_max'] for c in gc):.2f}) | {fmt(avg('predicted_speedup'))}x | "
                f"{fmt(avg('cost_model_speedup'))}x | "
                f"{avg('spec_tokens_per_s'):.1f} | {fmt(avg('acceptance_rate'))} | {fmt(avg('alpha'))} | "
                f"{avg('tokens_per_target_call'):.2f} | {fmt(avg('mean_gamma'))} "
                f"({sum(c.get('plain_rounds', 0) for c in gc)}) | {sum(c['runs'] for c in gc)} | {same} |"
                + (f" {fmt(avg('hf_speedup_median'))}x |" if hf else "") + f" {loop_flag(gc) or 'none'} |")
        lines += ["", "Median speed-up by gamma (rows) and max_gen (columns):", "",
                  "| gamma | " + " | ".join(map(str, max_gens)) + " |", "|---:|" + "---:|" * len(max_gens)]
        for g in sorted({c["gamma"] for c in rows}, key=gamma_order):
            by_mg = {c["max_gen"]: c for c in rows if c["gamma"] == g}
            lines.append(f"| {g} | " + " | ".join(f"{by_mg[m]['speedup_median']:.2f}"
                                                  + (" (looped)" if by_mg[m]["looped_runs"] else "")
                                                  for m in max_gens) + " |")
        if any(c["looped_runs"] for c in rows):
            lines += ["", f"(looped): {LOOP_MARK} (some of the cell's runs made text that is mostly a "
                          f"repeated n-gram, spec_decoding/presentation/loops.py)"]
        lines.append("")
    if tree_cells := results.get("tree_cells"):
        lines += tree_summary(tree_cells, cells, costs)
    verify = ", ".join(f"{int(g) + 1} tokens {v:.2f}" for g, v in costs["verify_cost_by_gamma"].items())  # int: read back from JSON too
    verify += "".join(f", tree {b} ({tree_size(parse_branching(b)) + 1} tokens) {v:.2f}"
                      for b, v in costs.get("verify_cost_by_tree", {}).items())
    steps = "; ".join(f"{name} {d['draft_step_ms']:.1f} ms, c = {d['c']:.3f}" for name, d in costs["drafters"].items())
    lines += [f"Measured costs (warm KV cache, {costs['context_len']} tokens of context): target step "
              f"{costs['target_step_ms']:.1f} ms; draft step (c = draft step / target step): {steps}; "
              f"verifying, relative to one target step: {verify}.",
              "Cost-model speedup: max_gen target steps over the sum, over the rounds each run made, of "
              "g draft steps + the target scoring g + 1 tokens, in the measured per-call costs "
              "(no timer: machine noise does not move it)."]
    lines += [f"Speculation pays ({name}; best gamma, Leviathan's formula with these costs) from alpha = "
              + (f"{a:.2f}." if a is not None else "never: the draft costs too much.")
              for name, a in costs.get("break_even_alpha", {}).items()]
    lines += best_gamma_lines(cells)
    if bad := [c for c in cells + results.get("tree_cells", []) if c["tokens_match_baseline"] is False]:
        lines.append("WARNING: greedy speculative tokens differ from the baseline's in cells "
                     + ", ".join(f"({c['drafter']}, {'tree ' + c['tree'] if c.get('tree') else 'gamma ' + str(c['gamma'])}, "
                                 f"max_gen {c['max_gen']})" for c in bad))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- output

def write_outputs(results: dict, out: Path) -> list[Path]:
    from benchmarks.plots import make_plots

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for cell in results["cells"] + results.get("tree_cells", []):
            row = dict(cell, acceptance_by_position=json.dumps(
                [None if a is None else round(a, 4) for a in cell["acceptance_by_position"]]))
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.md").write_text(summary_markdown(results))
    return [out / "results.csv", out / "results.json", out / "summary.md"] + make_plots(results, out)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := busy_note("--threads 1"):  # before any timing: its numbers will show it
        print(note, flush=True)
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if args.dtype != "auto":  # said once, before the loads (which would say it too)
        note_once(dtype_note(resolve_dtype(args.dtype, device), device), sys.stdout)
    prompts = read_prompts(args.prompts)
    uses_draft = any(cli.needs_draft_model(name) for name in args.drafters)
    if not args.make_standins:  # a mistyped local path fails now, not after the other model loads
        for role, name in [("target", args.target)] + ([("draft", args.draft)] if uses_draft else []):
            try:
                check_local_checkpoint(name)
            except CheckpointError as e:
                sys.exit(f"error: --{role} {name}: {e}")
    # Before any model is loaded (or stand-in written), where the configs are known cheaply.
    configs = ([GPT2Config.from_name("gpt2-large")] if args.make_standins else
               [c for c in (peek_config(args.target), peek_config(args.draft) if uses_draft else None)
                if c is not None])
    if configs:
        if len({c.vocab_size for c in configs}) == 1:  # else: a mismatched pair, named once loaded
            check_prompts_fit(prompts, configs[0].vocab_size, min(c.n_positions for c in configs))
        args.max_gens = clamp_max_gens(args.max_gens, prompts, min(c.n_positions for c in configs))
    if args.make_standins:
        args.target, args.draft = make_standins(args.make_standins, args.seed)
    standins = is_standin(args.target) and (is_standin(args.draft) or not uses_draft)
    print(f"Loading target {args.target}" + (f" and draft {args.draft}" if uses_draft else "")
          + f" on {device} ({args.dtype}) ...", flush=True)
    # dtype "auto" is decided per model, measured on its shapes here (gpt2.speed.device.auto_format).
    draft = (load_model("draft", str(args.draft), device, args.dtype, args.draft_quantize, args.compile, args.plain)
             if uses_draft else None)
    target = load_model("target", str(args.target), device, args.dtype, args.quantize, args.compile, args.plain)
    dtype = target.wpe.weight.dtype
    models = [target] + ([draft] if draft is not None else [])
    kernels = kernel_choices(target, draft)
    print("; ".join(f"{role}: {choice}" for role, choice in kernels.items()), flush=True)
    drafters = make_drafters(args.drafters, target, draft)
    try:
        for drafter in drafters.values():
            check_drafter(target, drafter)
    except ValueError as e:
        sys.exit(f"error: {e}")
    check_prompts_fit(prompts, min(m.config.vocab_size for m in models),
                      min(m.config.n_positions for m in models))
    args.max_gens = clamp_max_gens(args.max_gens, prompts,  # for configs not known before loading
                                   min(m.config.n_positions for m in models))

    if args.batch:
        return run_batched(target, draft, prompts, args, device, dtype, standins)
    n_positions = min(m.config.n_positions for m in models)
    context_len = min(int(np.mean([len(p) for p in prompts])) + max(args.max_gens) // 2,
                      n_positions - max(fixed_gammas(args.gammas) + [args.gamma_max]) - 1)
    costs, cost_models = measure_costs(target, drafters, fixed_gammas(args.gammas) or [1], args.gamma_max,
                                       context_len, trees=args.trees)
    for name, cm in cost_models.items():
        print(f"{name}: {cm}", flush=True)
    print(f"Warming up ({args.warmup} round(s)) ...", flush=True)
    warm_up(target, drafters, prompts, args, device, cost_models)
    print("c = draft step / target step: " + ", ".join(f"{name} {d['c']:.3f}" for name, d in costs["drafters"].items())
          + "; verify cost by gamma: "
          + ", ".join(f"{g}: {v:.2f}" for g, v in costs["verify_cost_by_gamma"].items())
          + "".join(f"; tree {b}: {v:.2f}" for b, v in costs["verify_cost_by_tree"].items()), flush=True)

    load_before = load_average()
    records = run_grid(target, drafters, prompts, args, device, cost_models)
    load_while_timing = [x for x in (load_before, load_average()) if x is not None]
    tree_records = [r for r in records if r["tree"] is not None]
    records = [r for r in records if r["tree"] is None]
    tree_keys = sorted({(r["drafter"], r["temperature"], r["max_gen"], r["tree"]) for r in tree_records},
                       key=lambda k: (args.drafters.index(k[0]), k[1], k[2], tree_size(parse_branching(k[3])), k[3]))
    tree_cells = [summarize_cell([r for r in tree_records
                                  if (r["drafter"], r["temperature"], r["max_gen"], r["tree"]) == key], costs)
                  for key in tree_keys]
    keys = sorted({(r["drafter"], r["temperature"], r["max_gen"], r["gamma"]) for r in records},
                  key=lambda k: (args.drafters.index(k[0]), k[1], k[2], gamma_order(k[3])))
    cells = [summarize_cell([r for r in records if (r["drafter"], r["temperature"], r["max_gen"], r["gamma"]) == key], costs)
             for key in keys]
    hf = None
    if args.compare_hf:
        from benchmarks.hf_assisted import compare_assisted_generation
        del target, draft  # make room for transformers' copies
        hf = compare_assisted_generation(str(args.target), str(args.draft), prompts, fixed_gammas(args.gammas),
                                         args.max_gens, device, dtype, args.repeats, args.warmup)
        for cell in cells:
            match = [h for h in hf["cells"] if cell["temperature"] == 0 and cell["drafter"] == "model"
                     and (h["gamma"], h["max_gen"]) == (cell["gamma"], cell["max_gen"])]
            cell["hf_speedup_median"] = match[0]["speedup_median"] if match else None
    by_drafter = {name: dict(zip(("best_gamma_measured", "best_gamma_predicted"),
                                 best_gammas([c for c in cells if c["drafter"] == name])))
                  for name in args.drafters}
    measured, predicted = by_drafter[args.drafters[0]].values()  # the first drafter's
    results = {"cells": cells, "tree_cells": tree_cells, "costs": costs,
               "environment": environment(args, device, dtype, standins, kernels) | {
                   "load_average": load_while_timing, "cores": os.cpu_count()},
               "best_gamma_measured": measured, "best_gamma_predicted": predicted, "hf_assisted": hf,
               "by_drafter": by_drafter,
               "by_temperature": {str(t): dict(zip(("best_gamma_measured", "best_gamma_predicted"),
                                                   best_gammas([c for c in cells if c["temperature"] == t
                                                                and c["drafter"] == args.drafters[0]])))
                                  for t in args.temperatures}}
    files = write_outputs(results, args.out)
    print("\n" + summary_markdown(results))
    print("Wrote " + ", ".join(str(f) for f in files))


def run_batched(target, draft, prompts, args, device, dtype, standins: bool) -> None:
    """--batch: batched AR against batched speculative decoding by batch size."""
    from benchmarks.batched_speed import batch_summary_markdown, run_batch_grid

    results = run_batch_grid(target, draft, prompts, args.batch, fixed_gammas(args.gammas), args.max_gens[0],
                             args.temperatures[0], args.repeats, args.seed)
    results["environment"] = environment(args, device, dtype, standins)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    summary = batch_summary_markdown(results)
    (args.out / "summary.md").write_text(summary)
    print("\n" + summary)
    print(f"Wrote {args.out / 'results.json'} and {args.out / 'summary.md'}")


if __name__ == "__main__":
    main()
