"""Batched speculative decoding against batched autoregressive decoding, by batch size.

Run through benchmark.py (it loads the models, makes stand-ins, reads the prompts):

    python benchmark.py --make-standins checkpoints/standins-pair --batch 1 2 4 8 16 \
        --gammas 1 2 4 --max-gens 32 --threads 2 --dtype float32 --out runs/batched

For each batch size B the prompts file is cycled to B prompts (different lengths). Batched
autoregressive decoding (the baseline) and batched speculative decoding at every gamma run back
to back on the same B prompts, so a busy machine slows them alike; the summed tokens/s of each is
reported (median over --repeats), with the speed-up (the median of each repeat's ratio of two
runs made back to back) and the acceptance alpha. At B = 1 the single-sequence generators run
too: batching support should cost nothing there.

Predicted: spec_decoding.policies.costs.BatchCostModel, measured before the grid (calibrate_batch_costs),
with the alpha measured in the same cell: speed-up = E(alpha, gamma) / (gamma c(B) +
verify_cost(B, gamma)). The crossover is the smallest batch at which the best gamma's speed-up is
<= 1, measured and predicted.
"""

import statistics
import time
from dataclasses import asdict

import torch

from gpt2.speed.device import synchronize
from spec_decoding import (autoregressive_generate, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy)
from spec_decoding.algorithms.batched import batched_autoregressive_generate, batched_speculative_sampling
from spec_decoding.calibration import calibrate_batch_costs
from spec_decoding.policies.costs import BatchCostModel
from spec_decoding.policies.theory import crossover_batch_size

from .common import markdown_table


def batch_of(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """batch_size prompts: the prompts file cycled."""
    return [prompts[i % len(prompts)] for i in range(batch_size)]


def _timed(device, fn):
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - start


def run_batch_grid(target, draft, prompts, batch_sizes, gammas, max_gen: int, temperature: float = 0.0,
                   repeats: int = 1, seed: int = 0, context_len: int | None = None, log=print,
                   costs=None) -> dict:
    """Time batched AR and batched speculative decoding for every batch size and gamma. Every run
    generates max_gen tokens per row (no eos). costs: a BatchCostModel covering
    max(batch_sizes) * (max(gammas) + 1) rows (None: measured first). Returns {"cells": [...],
    "by_batch": [...], "cost_model": {...}, "crossover": {...}}."""
    device = target.wpe.weight.device
    batch_sizes, gammas = sorted(set(batch_sizes)), sorted(set(gammas))
    if context_len is None:
        context_len = int(statistics.mean(len(p) for p in prompts)) + max_gen // 2
    if costs is None:
        log(f"Measuring forward costs by rows (1 .. {max(batch_sizes) * (max(gammas) + 1)}) ...")
        costs = calibrate_batch_costs(target, draft, max(batch_sizes) * (max(gammas) + 1), context_len, repeats=5)
    for n, t, d in zip(costs.rows, costs.target_s, costs.draft_s):
        log(f"  {n:4d} rows: target {1000 * t:8.1f} ms, draft {1000 * d:7.1f} ms")

    def generator():
        return torch.Generator(device=device).manual_seed(seed) if temperature else None

    # Warm-up: a short run of each generator (the first calls of a shape set up its kernels).
    for B in sorted({1, min(2, max(batch_sizes))}):
        warm = batch_of(prompts, B)
        batched_autoregressive_generate(target, warm, 4)
        batched_speculative_sampling(target, draft, warm, 8, min(gammas),
                                     sampling=SamplingParams(temperature=temperature, generator=generator()))
    autoregressive_generate(target, prompts[0], 4)
    speculative_sampling_greedy(target, draft, prompts[0], 8, min(gammas))

    cells = []
    for repeat in range(repeats):  # every batch size once per repeat: slow spells hit all of them
        for B in batch_sizes:
            batch = batch_of(prompts, B)
            ar, ar_s = _timed(device, lambda: batched_autoregressive_generate(
                target, batch, max_gen, SamplingParams(temperature, generator=generator())))
            row = {"batch": B, "repeat": repeat, "ar_tokens": ar.tokens_generated, "ar_seconds": ar_s}
            if B == 1:  # the single-sequence generators on the same prompt
                single, single_s = _timed(device, lambda: autoregressive_generate(
                    target, batch[0], max_gen, SamplingParams(temperature, generator=generator())))
                row.update(single_ar_seconds=single_s, single_ar_tokens=len(single.tokens))
            for gamma in gammas:
                spec, spec_s = _timed(device, lambda: batched_speculative_sampling(
                    target, draft, batch, max_gen, gamma, SamplingParams(temperature, generator=generator())))
                cell = dict(row, gamma=gamma, spec_tokens=spec.tokens_generated, spec_seconds=spec_s,
                            alpha=spec.alpha, target_forwards=spec.target_forwards,
                            draft_forwards=spec.draft_forwards)
                if B == 1:
                    sampling = SamplingParams(temperature, generator=generator())
                    one, one_s = _timed(device, lambda: speculative_sampling(target, draft, batch[0], max_gen, gamma,
                                                                             sampling))
                    cell.update(single_spec_seconds=one_s, single_spec_tokens=len(one.tokens))
                cells.append(cell)
            log(f"repeat {repeat} B={B:3d}: AR {ar.tokens_generated / ar_s:7.2f} tok/s; speculative "
                + ", ".join(f"g={c['gamma']} {c['spec_tokens'] / c['spec_seconds']:7.2f} tok/s (alpha {c['alpha']:.2f})"
                            for c in cells if c["batch"] == B and c["repeat"] == repeat))

    def med(runs, tokens, seconds):
        """Median over the repeats of tokens/s."""
        return statistics.median(r[tokens] / r[seconds] for r in runs)

    by_batch = []
    for B in batch_sizes:
        per_gamma = []
        for gamma in gammas:
            runs = [c for c in cells if c["batch"] == B and c["gamma"] == gamma]
            alpha = statistics.mean(c["alpha"] for c in runs if c["alpha"] is not None)
            per_gamma.append({
                "gamma": gamma, "ar_tokens_per_s": med(runs, "ar_tokens", "ar_seconds"),
                "spec_tokens_per_s": med(runs, "spec_tokens", "spec_seconds"), "alpha": alpha,
                # each repeat's ratio of two runs made back to back, then the median
                "speedup_measured": statistics.median((c["spec_tokens"] / c["spec_seconds"])
                                                      / (c["ar_tokens"] / c["ar_seconds"]) for c in runs),
                "speedup_predicted": costs.predicted_speedup(alpha, gamma, B),
                "c": costs.c(B), "verify_cost": costs.verify_cost(B, gamma)})
        best = max(per_gamma, key=lambda r: r["speedup_measured"])
        best_predicted = max(per_gamma, key=lambda r: r["speedup_predicted"])
        entry = {"batch": B, "best_gamma": best["gamma"], **{k: v for k, v in best.items() if k != "gamma"},
                 "best_gamma_predicted": best_predicted["gamma"],
                 "best_speedup_predicted": best_predicted["speedup_predicted"], "by_gamma": per_gamma}
        if B == 1:
            same = [c for c in cells if c["batch"] == 1 and c["gamma"] == best["gamma"]]
            entry["single_ar_tokens_per_s"] = med(same, "single_ar_tokens", "single_ar_seconds")
            entry["single_spec_tokens_per_s"] = med(same, "single_spec_tokens", "single_spec_seconds")
            entry["batched_over_single_ar"] = statistics.median(
                (c["ar_tokens"] / c["ar_seconds"]) / (c["single_ar_tokens"] / c["single_ar_seconds"]) for c in same)
            entry["batched_over_single_spec"] = statistics.median(
                (c["spec_tokens"] / c["spec_seconds"]) / (c["single_spec_tokens"] / c["single_spec_seconds"])
                for c in same)
        by_batch.append(entry)
    crossover = {
        "measured": crossover_batch_size({e["batch"]: e["speedup_measured"] for e in by_batch}),
        "predicted": crossover_batch_size({e["batch"]: e["best_speedup_predicted"] for e in by_batch}),
    }
    return {"cells": cells, "by_batch": by_batch, "crossover": crossover,
            "cost_model": asdict(costs),
            "settings": {"batch_sizes": batch_sizes, "gammas": gammas, "max_gen": max_gen,
                         "temperature": temperature, "repeats": repeats, "threads": torch.get_num_threads()}}


def batch_summary_markdown(results: dict) -> str:
    rows = []
    for e in results["by_batch"]:
        rows.append([e["batch"], f"{e['ar_tokens_per_s']:.2f}", e["best_gamma"], f"{e['spec_tokens_per_s']:.2f}",
                     f"{e['alpha']:.2f}", f"{e['speedup_measured']:.2f}", f"{e['speedup_predicted']:.2f}",
                     f"{e['c']:.3f}", f"{e['verify_cost']:.2f}",
                     f"{e['best_speedup_predicted']:.2f} (g={e['best_gamma_predicted']})"])
    table = markdown_table(["B", "AR tok/s (sum)", "best gamma", "speculative tok/s (sum)", "alpha",
                            "speed-up measured", "predicted (same gamma)", "c(B)", "verify cost(B, gamma)",
                            "predicted best"], rows)
    one = next((e for e in results["by_batch"] if e["batch"] == 1), None)
    lines = [table, ""]
    if one is not None:
        lines.append(f"B = 1 against the single-sequence generators: AR {one['ar_tokens_per_s']:.2f} tok/s "
                     f"batched vs {one['single_ar_tokens_per_s']:.2f} single "
                     f"(median ratio {one['batched_over_single_ar']:.3f}); speculative "
                     f"(gamma {one['best_gamma']}) {one['spec_tokens_per_s']:.2f} batched vs "
                     f"{one['single_spec_tokens_per_s']:.2f} single "
                     f"(median ratio {one['batched_over_single_spec']:.3f}).")
    c = results["crossover"]

    def say(b):
        return f"B = {b}" if b is not None else "none within the batch sizes run"
    lines.append(f"Crossover (smallest batch where speculation stops paying): measured {say(c['measured'])}, "
                 f"predicted {say(c['predicted'])}.")
    lines += ["", predicted_by_alpha_markdown(results)]
    return "\n".join(lines) + "\n"


ALPHAS = (0.5, 0.6, 0.75, 0.9)  # what real draft/target pairs reach; random stand-ins agree far more


def predicted_by_alpha_markdown(results: dict, alphas=ALPHAS) -> str:
    """The cost model's best-gamma speed-up by batch size at other acceptance rates: where the
    crossover would sit for a pair that disagrees more than the one measured."""
    costs = BatchCostModel(**results["cost_model"])
    batch_sizes, gammas = results["settings"]["batch_sizes"], results["settings"]["gammas"]
    rows, crossovers = [], []
    for alpha in alphas:
        speedups = {B: max(costs.predicted_speedup(alpha, g, B) for g in gammas) for B in batch_sizes}
        rows.append([alpha] + [f"{speedups[B]:.2f}" for B in batch_sizes])
        crossovers.append(crossover_batch_size(speedups))
    rows = [r + [f"B = {c}" if c else "beyond"] for r, c in zip(rows, crossovers)]
    return ("Predicted best-gamma speed-up at other alphas (same measured costs):\n\n"
            + markdown_table(["alpha"] + [f"B={B}" for B in batch_sizes] + ["crossover"], rows))
