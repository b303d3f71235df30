"""How much faster is speculative decoding than the target alone? Measure it over a grid.

    python benchmark.py                       # draft gpt2, target gpt2-large (from the hub)
    python benchmark.py --draft DIR --target DIR --gammas 1 2 4 --max-gens 50 100
    python benchmark.py --make-standins checkpoints/standins-pair --max-gens 50 100 200 --repeats 1

For each cell of the grid gamma x max_gen x temperature, every prompt (one per line of --prompts)
is generated --repeats times by the target alone (spec_decoding.autoregressive_generate, the
baseline) and speculatively (speculative_sampling_greedy at temperature 0, speculative_sampling
with a seeded generator otherwise). The baseline of a (temperature, max_gen, prompt, repeat) is
timed right before the speculative runs of every gamma, so both see the same machine state.
Generation never stops early at <|endoftext|>: every run makes max_gen tokens.

A run's speed-up is baseline seconds / speculative seconds; a cell reports the median over its
runs (prompts x repeats) with the quartiles and min/max. Before the grid, the script measures on
warm KV caches what the theory needs: c = draft step / target step, and the target's cost of
verifying gamma + 1 tokens relative to one step. spec_decoding.theory.predicted_speedup then
gives Leviathan et al.'s predicted speed-up from the measured acceptance, shown beside the
measured one.

Acceptance, two ways: acceptance_rate is GenerationStats' accepted / drafted draft tokens (every
drafted position counts, also those after the first rejection, which the target never judged).
alpha is accepted / (accepted + rejected): the chance that a draft token the target judged was
accepted, the alpha of the theory. For gamma = 1 they are equal; the prediction uses alpha.

Output in --out (default runs/benchmark): results.csv (one row per cell), results.json (cells
with their runs, costs, environment), summary.md (the table printed at the end) and PNG plots.
On a CPU that other programs keep busy, --threads 1 times more steadily than one thread per core
(threads that wait for each other slow every step down when a core is taken).
Offline? Pass local folders (config.json + model.safetensors) with --draft/--target, or make
random-weight stand-ins of the real shapes with --make-standins DIR (their speed is the real
models' speed; their text and acceptance are not).
"""

import argparse
import csv
import datetime
import json
import math
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gpt2 import GPT2Config, CheckpointError, encode, load_gpt2
from benchmarks.common import timed
from gpt2.device import resolve_device
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.theory import predicted_speedup

ROOT = Path(__file__).resolve().parent
DEFAULT_PROMPTS = ROOT / "prompts" / "default.txt"
RESULT_FILES = ("results.json", "results.csv", "summary.md")
STANDIN_MARKER = "standins.json"  # written beside DIR/target and DIR/draft by --make-standins
CSV_COLUMNS = [
    "gamma", "max_gen", "temperature", "runs", "speedup_median", "speedup_q1", "speedup_q3",
    "speedup_min", "speedup_max", "predicted_speedup", "target_tokens_per_s", "spec_tokens_per_s",
    "acceptance_rate", "alpha", "tokens_per_target_call", "generated_tokens", "target_calls",
    "draft_calls", "acceptance_by_position", "tokens_match_baseline", "hf_speedup_median",
]


# ---------------------------------------------------------------- command line

def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def non_negative_int(text):
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return int(text)


def temperature_value(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a temperature >= 0 (0 means greedy)")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", default="gpt2", help="hub name/repo or local folder (default gpt2)")
    p.add_argument("--target", default="gpt2-large", help="hub name/repo or local folder (default gpt2-large)")
    p.add_argument("--gammas", type=positive_int, nargs="+", default=[1, 2, 4, 8], metavar="G",
                   help="draft tokens per round (default 1 2 4 8)")
    p.add_argument("--max-gens", type=positive_int, nargs="+", default=[50, 100, 200, 500], metavar="N",
                   help="new tokens per generation (default 50 100 200 500)")
    p.add_argument("--temperatures", type=temperature_value, nargs="+", default=[0.0], metavar="T",
                   help="0 = greedy (default), > 0 = speculative sampling")
    p.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="text file, one prompt per line")
    p.add_argument("--repeats", type=positive_int, default=1, help="timed runs per prompt and cell")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed warm-up rounds first")
    p.add_argument("--seed", type=int, default=0, help="seeds the sampling generators (temperature > 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--quantize", choices=["int8"], help="int8: weight-only int8 target (made at load time)")
    p.add_argument("--draft-quantize", choices=["int8"], help="int8: weight-only int8 draft")
    p.add_argument("--threads", type=positive_int, help="CPU threads for torch (default: its own choice)")
    p.add_argument("--out", type=Path, default=Path("runs/benchmark"), help="output folder (default runs/benchmark)")
    p.add_argument("--force", action="store_true", help="overwrite results already in --out")
    p.add_argument("--make-standins", type=Path, metavar="DIR",
                   help="write a random-weight gpt2-large-shaped target and a draft made of its "
                        "first 4 blocks into DIR/target and DIR/draft (reused if there), benchmark them")
    p.add_argument("--compare-hf", action="store_true",
                   help="also time transformers' assisted generation (temperature 0) on the same pair")
    args = p.parse_args(argv)
    args.gammas = sorted(set(args.gammas))
    args.max_gens = sorted(set(args.max_gens))
    args.temperatures = sorted(set(args.temperatures))
    if not args.prompts.is_file():
        p.error(f"--prompts {args.prompts}: no such file")
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
    0.35 with embeddings of std 0.3 makes them agree on ~75% of tokens, near real GPT-2 pairs."""
    from gpt2.random_weights import save_agreeing_pair

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


def load_model(role: str, name_or_path: str, device, dtype, quantize=None):
    try:
        return load_gpt2(name_or_path, device=device, dtype=dtype, quantize=quantize)
    except CheckpointError as e:
        sys.exit(f"error: could not load the {role} model {name_or_path!r}:\n{e}\n\n"
                 f"Offline? Pass local folders holding config.json + model.safetensors with "
                 f"--draft DIR --target DIR, or benchmark random-weight stand-ins of the real "
                 f"shapes with --make-standins DIR.")


def read_prompts(path: Path) -> list[list[int]]:
    """The prompts of a text file, one per line, as token ids (before any model is loaded, so a
    missing file or tokenizer fails fast)."""
    try:
        texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as e:
        sys.exit(f"error: cannot read the prompts file: {e}")
    if not texts:
        sys.exit(f"error: {path} holds no prompts (one per line)")
    try:
        return [encode(t) for t in texts]
    except RuntimeError as e:  # tiktoken could not get its BPE files; the message says what to do
        sys.exit(f"error: {e}")


def check_prompts_fit(prompts: list[list[int]], vocab_size: int, n_positions: int) -> None:
    if longest := max((len(p) for p in prompts if len(p) >= n_positions), default=0):
        sys.exit(f"error: a prompt has {longest} tokens; the models' context window holds "
                 f"{n_positions}, so prompts must be shorter. Shorten it in the prompts file.")
    if any(max(ids) >= vocab_size for ids in prompts):
        sys.exit(f"error: the models' vocabulary has {vocab_size} tokens, too few for GPT-2's "
                 f"tokenizer, which the text prompts are encoded with")


# ---------------------------------------------------------------- measuring

@torch.inference_mode()
def measure_costs(target, draft, gammas, context_len, device, budget_s=3.0) -> dict:
    """Time one forward on a warm KV cache holding context_len tokens (rolled back after each, so
    every timing sees the same context): the target and the draft on 1 new token, the target on
    gamma + 1 tokens (verification). The shapes take turns, round after round, so a busy machine
    slows them alike; each cost is a median over the rounds."""
    g = torch.Generator().manual_seed(0)
    context = torch.randint(target.config.vocab_size, (1, context_len), generator=g).to(device)
    caches = {}
    for name, model in (("target", target), ("draft", draft)):
        caches[name] = model.new_kv_cache(max_len=context_len + max(gammas) + 1)
        model(context, caches[name], num_last_logits=1)
    models = {"target": target, "draft": draft}
    shapes = [("target", 1), ("draft", 1)] + [("target", gamma + 1) for gamma in gammas]
    times = {shape: [] for shape in shapes}
    start, rounds = time.perf_counter(), 0
    while rounds < 5 or (time.perf_counter() - start < budget_s and rounds < 30):
        for name, n_new in shapes:
            new = torch.randint(target.config.vocab_size, (1, n_new), generator=g).to(device)
            caches[name].truncate(context_len)
            _, seconds = timed(device, models[name], new, caches[name], num_last_logits=n_new)
            times[(name, n_new)].append(seconds)
        rounds += 1
    median = {shape: float(np.median(t[1:])) for shape, t in times.items()}  # round 1 warms up
    step = median[("target", 1)]
    return {"c": median[("draft", 1)] / step,
            "verify_cost_by_gamma": {gamma: median[("target", gamma + 1)] / step for gamma in gammas},
            "context_len": context_len, "rounds": rounds,
            "target_step_ms": 1000 * step, "draft_step_ms": 1000 * median[("draft", 1)]}


def speculate(target, draft, prompt, max_gen, gamma, temperature, generator):
    if temperature == 0:
        return speculative_sampling_greedy(target, draft, prompt, max_gen, gamma)
    return speculative_sampling(target, draft, prompt, max_gen, gamma, temperature, generator=generator)


def seeded(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def warm_up(target, draft, prompts, args, device) -> None:
    """Untimed runs of every shape the grid uses (first calls allocate and pick kernels)."""
    n = min(16, args.max_gens[0])
    for i in range(args.warmup):
        for t in args.temperatures:
            autoregressive_generate(target, prompts[0], n, temperature=t, generator=seeded(i, device))
            for gamma in args.gammas:
                speculate(target, draft, prompts[0], n, gamma, t, seeded(i, device))


def run_grid(target, draft, prompts, args, device) -> list[dict]:
    """One record per speculative run; each (temperature, max_gen, repeat, prompt) times the
    target alone first, then speculative decoding with every gamma."""
    records = []
    total = len(args.temperatures) * args.repeats * len(prompts) * (1 + len(args.gammas)) * sum(args.max_gens)
    bar = tqdm(total=total, unit="tok", desc="benchmark", dynamic_ncols=True)
    for temperature in args.temperatures:
        for max_gen in args.max_gens:
            for repeat in range(args.repeats):
                for p, prompt in enumerate(prompts):
                    where = f"T={temperature:g} max_gen={max_gen} prompt {p + 1}/{len(prompts)} rep {repeat + 1}"
                    seed = args.seed + 1000 * repeat + p
                    bar.set_description(f"{where}: target alone")
                    base, base_s = timed(device, autoregressive_generate, target, prompt, max_gen,
                                         temperature=temperature, generator=seeded(seed, device))
                    bar.update(max_gen)
                    for gamma in args.gammas:
                        bar.set_description(f"{where}: gamma={gamma}")
                        spec, spec_s = timed(device, speculate, target, draft, prompt, max_gen, gamma,
                                             temperature, seeded(seed, device))
                        bar.update(max_gen)
                        s = spec.stats
                        records.append({
                            "temperature": temperature, "max_gen": max_gen, "gamma": gamma,
                            "repeat": repeat, "prompt_index": p, "prompt_tokens": len(prompt),
                            "baseline_seconds": base_s, "spec_seconds": spec_s, "speedup": base_s / spec_s,
                            "baseline_tokens": len(base.tokens), "generated_tokens": s.tokens_generated,
                            "target_calls": s.target_calls, "draft_calls": s.draft_calls,
                            "tokens_drafted": s.tokens_drafted, "tokens_accepted": s.tokens_accepted,
                            "rejections": s.tokens_rejected,
                            "drafted_by_position": s.drafted_by_position,
                            "accepted_by_position": s.accepted_by_position,
                            "tokens_match_baseline": spec.tokens == base.tokens if temperature == 0 else None,
                        })
    bar.close()
    return records


# ---------------------------------------------------------------- summarizing

def summarize_cell(runs: list[dict], costs: dict) -> dict:
    first = runs[0]
    gamma = first["gamma"]
    speedups = np.array([r["speedup"] for r in runs])

    def total(key):
        return sum(r[key] for r in runs)

    accepted, drafted, rejected = total("tokens_accepted"), total("tokens_drafted"), total("rejections")
    alpha = accepted / (accepted + rejected) if accepted + rejected else None
    drafted_at = [sum(r["drafted_by_position"][i] for r in runs) for i in range(gamma)]
    accepted_at = [sum(r["accepted_by_position"][i] for r in runs) for i in range(gamma)]
    by_position = [a / d if d else None for a, d in zip(accepted_at, drafted_at)]
    verify = costs["verify_cost_by_gamma"][gamma]
    return {
        "gamma": gamma, "max_gen": first["max_gen"], "temperature": first["temperature"], "runs": len(runs),
        "speedup_median": float(np.median(speedups)),
        "speedup_q1": float(np.percentile(speedups, 25)), "speedup_q3": float(np.percentile(speedups, 75)),
        "speedup_min": float(speedups.min()), "speedup_max": float(speedups.max()),
        "predicted_speedup": predicted_speedup(alpha, gamma, costs["c"], verify) if alpha is not None else None,
        "target_tokens_per_s": total("baseline_tokens") / total("baseline_seconds"),
        "spec_tokens_per_s": total("generated_tokens") / total("spec_seconds"),
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": alpha,
        "tokens_per_target_call": total("generated_tokens") / total("target_calls"),
        "generated_tokens": total("generated_tokens"),
        "target_calls": total("target_calls"), "draft_calls": total("draft_calls"),
        "acceptance_by_position": by_position,
        "tokens_match_baseline": all(r["tokens_match_baseline"] for r in runs) if first["temperature"] == 0 else None,
        "run_records": runs,
    }


def best_gammas(cells: list[dict]) -> tuple[int, int | None]:
    """The gamma with the best mean (over the cells) measured and predicted speed-up."""
    def best(key):
        by_gamma = {}
        for cell in cells:
            if cell[key] is not None:
                by_gamma.setdefault(cell["gamma"], []).append(cell[key])
        return max(by_gamma, key=lambda g: np.mean(by_gamma[g])) if by_gamma else None
    return best("speedup_median"), best("predicted_speedup")


def environment(args, device, dtype, standins: bool) -> dict:
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
        "quantize": args.quantize, "draft_quantize": args.draft_quantize,
        "standins": standins, "prompts_file": str(args.prompts), "repeats": args.repeats,
        "warmup": args.warmup, "seed": args.seed, "git_commit": commit,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name] + sys.argv[1:]),
    }


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def summary_markdown(results: dict) -> str:
    """The terminal summary (markdown tables): one row per gamma, averaged over max_gen."""
    cells, costs, env = results["cells"], results["costs"], results["environment"]
    lines = [f"Draft {env['draft']} -> target {env['target']}"
             + (" (random-weight stand-ins)" if env["standins"] else "")
             + f", {env['device']} ({env['device_name']}), {env['dtype']}, {env['threads']} thread{'s' * (env['threads'] != 1)}", ""]
    for t in sorted({c["temperature"] for c in cells}):
        rows = [c for c in cells if c["temperature"] == t]
        max_gens = sorted({c["max_gen"] for c in rows})
        hf = any(c.get("hf_speedup_median") is not None for c in rows)
        lines += [f"Temperature {t:g} ({'greedy' if t == 0 else 'sampling'}); averages over "
                  f"max_gen {', '.join(map(str, max_gens))}; target alone: "
                  f"{np.mean([c['target_tokens_per_s'] for c in rows]):.1f} tokens/s", "",
                  "| Gamma | Avg Speedup | Predicted | Avg Tokens/s | Acceptance | alpha | Tokens/target call "
                  "| Tests | Same tokens |" + (" HF assisted speedup |" if hf else ""),
                  "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|" + ("---:|" if hf else "")]
        for g in sorted({c["gamma"] for c in rows}):
            gc = [c for c in rows if c["gamma"] == g]

            def avg(key):
                values = [c[key] for c in gc if c.get(key) is not None]
                return float(np.mean(values)) if values else None
            same = "n/a" if t else ("yes" if all(c["tokens_match_baseline"] for c in gc) else "**NO**")
            lines.append(
                f"| {g} | {avg('speedup_median'):.2f}x ({min(c['speedup_min'] for c in gc):.2f}-"
                f"{max(c['speedup_max'] for c in gc):.2f}) | {fmt(avg('predicted_speedup'))}x | "
                f"{avg('spec_tokens_per_s'):.1f} | {fmt(avg('acceptance_rate'))} | {fmt(avg('alpha'))} | "
                f"{avg('tokens_per_target_call'):.2f} | {sum(c['runs'] for c in gc)} | {same} |"
                + (f" {fmt(avg('hf_speedup_median'))}x |" if hf else ""))
        lines += ["", "Median speed-up by gamma (rows) and max_gen (columns):", "",
                  "| gamma | " + " | ".join(map(str, max_gens)) + " |", "|---:|" + "---:|" * len(max_gens)]
        for g in sorted({c["gamma"] for c in rows}):
            by_mg = {c["max_gen"]: c["speedup_median"] for c in rows if c["gamma"] == g}
            lines.append(f"| {g} | " + " | ".join(f"{by_mg[m]:.2f}" for m in max_gens) + " |")
        lines.append("")
    verify = ", ".join(f"{g + 1} tokens {v:.2f}" for g, v in costs["verify_cost_by_gamma"].items())
    lines += [f"Measured costs (warm KV cache, {costs['context_len']} tokens of context): target step "
              f"{costs['target_step_ms']:.1f} ms, draft step {costs['draft_step_ms']:.1f} ms, "
              f"c = {costs['c']:.3f}; verifying, relative to one target step: {verify}.",
              f"Best gamma: measured {results['best_gamma_measured']}, predicted {results['best_gamma_predicted']}."]
    if bad := [c for c in cells if c["tokens_match_baseline"] is False]:
        lines.append("WARNING: greedy speculative tokens differ from the baseline's in cells "
                     + ", ".join(f"(gamma {c['gamma']}, max_gen {c['max_gen']})" for c in bad))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- output

def write_outputs(results: dict, out: Path) -> list[Path]:
    from benchmarks.plots import make_plots

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for cell in results["cells"]:
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
    try:
        device = resolve_device(args.device)
    except ValueError as e:
        sys.exit(f"error: {e}")
    dtype = getattr(torch, args.dtype)
    prompts = read_prompts(args.prompts)
    if args.make_standins:
        args.target, args.draft = make_standins(args.make_standins, args.seed)
    standins = is_standin(args.target) and is_standin(args.draft)
    print(f"Loading draft {args.draft} and target {args.target} on {device} ({args.dtype}) ...", flush=True)
    draft = load_model("draft", str(args.draft), device, dtype, args.draft_quantize)
    target = load_model("target", str(args.target), device, dtype, args.quantize)
    check_prompts_fit(prompts, min(target.config.vocab_size, draft.config.vocab_size),
                      min(target.config.n_positions, draft.config.n_positions))

    print(f"Warming up ({args.warmup} round(s)) ...", flush=True)
    warm_up(target, draft, prompts, args, device)
    n_positions = min(target.config.n_positions, draft.config.n_positions)
    context_len = min(int(np.mean([len(p) for p in prompts])) + max(args.max_gens) // 2,
                      n_positions - max(args.gammas) - 1)
    costs = measure_costs(target, draft, args.gammas, context_len, device)
    print(f"c = {costs['c']:.3f} (draft step / target step); verify cost by gamma: "
          + ", ".join(f"{g}: {v:.2f}" for g, v in costs["verify_cost_by_gamma"].items()), flush=True)

    records = run_grid(target, draft, prompts, args, device)
    cells = [summarize_cell([r for r in records if (r["temperature"], r["max_gen"], r["gamma"]) == key], costs)
             for key in sorted({(r["temperature"], r["max_gen"], r["gamma"]) for r in records})]
    hf = None
    if args.compare_hf:
        from benchmarks.hf_assisted import compare_assisted_generation
        del target, draft  # make room for transformers' copies
        hf = compare_assisted_generation(str(args.target), str(args.draft), prompts, args.gammas,
                                         args.max_gens, device, dtype, args.repeats, args.warmup)
        for cell in cells:
            match = [h for h in hf["cells"] if cell["temperature"] == 0
                     and (h["gamma"], h["max_gen"]) == (cell["gamma"], cell["max_gen"])]
            cell["hf_speedup_median"] = match[0]["speedup_median"] if match else None
    measured, predicted = best_gammas(cells)
    results = {"cells": cells, "costs": costs, "environment": environment(args, device, dtype, standins),
               "best_gamma_measured": measured, "best_gamma_predicted": predicted, "hf_assisted": hf,
               "by_temperature": {str(t): dict(zip(("best_gamma_measured", "best_gamma_predicted"),
                                                   best_gammas([c for c in cells if c["temperature"] == t])))
                                  for t in args.temperatures}}
    files = write_outputs(results, args.out)
    print("\n" + summary_markdown(results))
    print("Wrote " + ", ".join(str(f) for f in files))


if __name__ == "__main__":
    main()
