"""Does speculative decoding deliver the speed-up its per-call costs promise, on this CPU?

    python -m benchmarks.speculative_speed --out runs/speculative_speed
    python -m benchmarks.speculative_speed --quick        # a fast smoke run on small shapes

The pair: a gpt2-large-shaped target and a draft made of its first --draft-layers blocks
(offline.random_weights.save_agreeing_pair; the target's later blocks are damped so that the two
often, but not always, agree). Random weights: the timings are those of the real shapes, the
acceptance rate is whatever this pair gives (printed; tune it with --damping).

It measures, in one run, interleaved so that machine noise hits everything alike:
1. Per-call costs with a warm KV cache at a realistic context: a draft step (1 token), a target
   step (1 token), a target verification of gamma + 1 tokens.
2. For each gamma, greedy (speculative_sampling_greedy) and temperature 1 (speculative_sampling)
   against the baseline autoregressive_generate on the same prompts: measured speed-up,
   acceptance rate, tokens per target call, and the ideal speed-up the measured costs and counts
   allow, ideal_time = draft_calls * t_draft + target_calls * t_verify(gamma + 1). The claim under
   test: measured >= 90% of ideal. "No wasted work": the forward passes actually run (counted by
   hooks) equal the counts in the stats, and target calls per token = 1 / tokens per target call.
3. transformers' assisted generation on the same two checkpoints (greedy, num_assistant_tokens =
   gamma, constant schedule, no confidence cut-off): its time, and whether its tokens equal ours.
4. The same with gpt2.speed.kernels.ENABLED = False (the plain face: F.linear -> MKL) for one gamma: how
   verification cost and the speed-up collapse under MKL's small-M kernels on this CPU.

Writes <out>/results.json and <out>/results.md and prints the table.
"""

import argparse
from pathlib import Path

import torch
from tqdm import tqdm

import gpt2.speed.kernels
from gpt2 import OFFICIAL_CONFIGS
from gpt2.speed import load_accelerated
from gpt2.speed.accelerator import FORMAT_NAMES
from gpt2.speed.compiled import COMPILE_FLAGS
from spec_decoding import SamplingParams, autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.calibration import calibrate_costs
from spec_decoding.policies.theory import predicted_speedup

from .common import (DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table, median, random_prompt,
                     standin_pair, timed, transformers_missing, write_results)


class ForwardCounter:
    """Counts the forward passes a model really runs (a forward hook), to check the stats."""

    def __init__(self, model):
        self.count = 0
        model.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        self.count += 1


def set_onednn(on: bool):
    gpt2.speed.kernels.ENABLED = on  # read at call time by the attached kernels (False: plain F.linear)


# ---------------------------------------------------------------------------------------------
# 1. Per-call costs
# ---------------------------------------------------------------------------------------------

def per_call_costs(target, draft, context_len, gammas, repeats, modes=("onednn", "mkl")):
    """Median seconds of each kind of call with the KV caches holding context_len positions:
    {mode: {"draft_step": s, "target_step": s, "verify": {gamma: s}}}. Each repeat runs one short
    calibrate_costs (spec_decoding/policies/costs.py, the one place per-call costs are timed) per mode,
    the modes taking turns so that machine noise hits both alike."""
    calibrations = {mode: [] for mode in modes}
    try:
        for _ in tqdm(range(repeats), desc="  per-call costs", leave=False):
            for mode in modes:
                set_onednn(mode == "onednn")
                calibrations[mode].append(calibrate_costs(target, draft, max(gammas), context_len,
                                                          budget_s=0.0, min_rounds=1))
    finally:
        set_onednn(True)
    return {mode: {"draft_step": median([c.draft_step_s for c in runs]),
                   "target_step": median([c.target_step_s for c in runs]),
                   "verify": {g: median([c.target_score_s[g] for c in runs]) for g in gammas}}
            for mode, runs in calibrations.items()}


# ---------------------------------------------------------------------------------------------
# 2.-4. Generation runs
# ---------------------------------------------------------------------------------------------

def hf_generate(hf_target, prompt, new_tokens, assistant=None, gamma=None):
    ids = torch.tensor([prompt])
    kwargs = {}
    if assistant is not None:
        cfg = assistant.generation_config
        cfg.num_assistant_tokens = gamma  # draft tokens per round
        cfg.num_assistant_tokens_schedule = "constant"  # don't adapt gamma between rounds
        cfg.assistant_confidence_threshold = 0.0  # don't stop drafting early on low confidence
        kwargs["assistant_model"] = assistant
    out = hf_target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=50256, **kwargs)
    return out[0, len(prompt):].tolist()


def make_jobs(target, draft, hf_target, hf_draft, gammas, new_tokens, with_hf):
    """name -> fn(prompt, seed) returning (tokens, stats or None). Each name is one timed run."""
    jobs = {"baseline greedy": lambda p, s: _ours(autoregressive_generate(target, p, new_tokens))}
    for g in gammas:
        jobs[f"spec greedy g={g}"] = lambda p, s, g=g: _ours(
            speculative_sampling_greedy(target, draft, p, new_tokens, g))
        jobs[f"spec T=1 g={g}"] = lambda p, s, g=g: _ours(speculative_sampling(
            target, draft, p, new_tokens, g, SamplingParams(1.0, generator=torch.Generator().manual_seed(s))))
    if with_hf:
        jobs["HF greedy"] = lambda p, s: (hf_generate(hf_target, p, new_tokens), None)
        for g in gammas:
            jobs[f"HF assisted g={g}"] = lambda p, s, g=g: (
                hf_generate(hf_target, p, new_tokens, hf_draft, g), None)
    return jobs


def _ours(result):
    return result.tokens, result.stats


def run_interleaved(jobs, prompts, counters, desc):
    """Run every job on every prompt, rotating the job order per prompt. Returns
    {name: [ {seconds, tokens, stats, forwards}, ... one per prompt ]}."""
    names = list(jobs)
    runs = {n: [] for n in names}
    bar = tqdm(total=len(prompts) * len(names), desc=desc, leave=False)
    for r, prompt in enumerate(prompts):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for c in counters.values():
                c.count = 0
            (tokens, stats), seconds = timed(None, jobs[name], prompt, 1000 + r)
            runs[name].append({"seconds": seconds, "tokens": tokens, "stats": stats,
                               "forwards": {k: c.count for k, c in counters.items()}})
            bar.update()
    bar.close()
    return runs


def summarize(runs, costs, gammas, kinds=("greedy", "T=1")):
    """Per (kind, gamma): measured and ideal speed-up, acceptance, tokens per target call, and the
    no-wasted-work checks."""
    base = runs["baseline greedy"]
    t_base = median([r["seconds"] for r in base])
    n_base = sum(len(r["tokens"]) for r in base)
    t_step, t_draft = costs["target_step"], costs["draft_step"]
    rows = []
    for kind in kinds:
        for g in gammas:
            name = f"spec {kind} g={g}"
            if name not in runs:
                continue
            rs = runs[name]
            st = [r["stats"] for r in rs]
            tokens = sum(s.tokens_generated for s in st)
            target_calls = sum(s.target_calls for s in st)
            draft_calls = sum(s.draft_calls for s in st)
            drafted, accepted = sum(s.tokens_drafted for s in st), sum(s.tokens_accepted for s in st)
            rejected = sum(s.rejections for s in st)
            acceptance = accepted / drafted if drafted else 0.0
            alpha = accepted / (accepted + rejected) if accepted + rejected else 0.0  # theory's alpha
            tpc = tokens / target_calls
            t_spec = median([r["seconds"] for r in rs])
            # Ideal time per run: the measured counts at the measured per-call costs, nothing else.
            ideal = median([s.draft_calls * t_draft + s.target_calls * costs["verify"][g] for s in st])
            ideal_from_steps = median([s.tokens_generated * t_step for s in st]) / ideal
            measured = t_base / t_spec
            forwards_ok = all(r["forwards"]["target"] == r["stats"].target_calls
                              and r["forwards"]["draft"] == r["stats"].draft_calls for r in rs)
            rows.append({
                "kind": kind, "gamma": g, "runs": len(rs), "tokens": tokens,
                "baseline_seconds_median": t_base, "spec_seconds_median": t_spec,
                "measured_speedup": measured, "acceptance_rate": acceptance, "alpha": alpha,
                "tokens_per_target_call": tpc, "target_calls": target_calls, "draft_calls": draft_calls,
                "target_calls_per_token": target_calls / tokens, "inverse_tokens_per_target_call": 1 / tpc,
                "forward_counts_match_stats": forwards_ok,
                "ideal_seconds_median": ideal, "ideal_speedup": t_base / ideal,
                "ideal_speedup_vs_target_steps": ideal_from_steps,
                "measured_over_ideal": measured / (t_base / ideal),
                "theory_speedup": predicted_speedup(alpha, g, t_draft / t_step, costs["verify"][g] / t_step),
                "baseline_tokens": n_base,
            })
    return rows


def hf_summary(runs, gammas):
    """HF assisted vs HF greedy vs ours, greedy: times and token equality."""
    ours_base = runs["baseline greedy"]
    rows = []
    hf_base = runs.get("HF greedy")
    for label, rs in [("HF greedy", hf_base)] + [(f"HF assisted g={g}", runs.get(f"HF assisted g={g}")) for g in gammas]:
        if rs is None:
            continue
        g = int(label.split("=")[1]) if "=" in label else None
        ours = runs.get(f"spec greedy g={g}") if g else ours_base
        same_base = [r["tokens"] == b["tokens"] for r, b in zip(rs, ours_base)]
        same_ours = [r["tokens"] == o["tokens"] for r, o in zip(rs, ours)]
        first = [next((i for i, (a, b) in enumerate(zip(r["tokens"], b["tokens"])) if a != b), None)
                 for r, b in zip(rs, ours_base)]
        rows.append({"label": label, "gamma": g, "hf_seconds_median": median([r["seconds"] for r in rs]),
                     "ours_seconds_median": median([r["seconds"] for r in ours]),
                     "hf_speedup_vs_hf_greedy": (median([r["seconds"] for r in hf_base]) /
                                                 median([r["seconds"] for r in rs])) if hf_base else None,
                     "same_tokens_as_our_baseline": same_base, "same_tokens_as_ours": same_ours,
                     "first_mismatch_vs_our_baseline": first})
    return rows


def greedy_checks(runs, gammas):
    """Our speculative greedy output must equal the baseline's, token for token."""
    base = runs["baseline greedy"]
    return {g: [r["tokens"] == b["tokens"] for r, b in zip(runs[f"spec greedy g={g}"], base)]
            for g in gammas if f"spec greedy g={g}" in runs}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def _ms(s):
    return f"{1000 * s:.1f}"


def report(res) -> str:
    a = res["settings"]
    fmt, path = a.get("format", "float32"), a.get("compile", "off")
    md = [f"# Speculative decoding speed (batch 1, {fmt}{'' if path == 'off' else ', compile ' + path}, CPU)\n",
          f"Target: random {a['target_model']} shape; draft: its first {a['draft_layers']} blocks "
          f"(save_agreeing_pair, damping {a['damping']}, embedding_std {a['embedding_std']}). "
          f"Prompt {a['prompt_len']} random tokens, {a['new_tokens']} new tokens, "
          f"{a['repeats']} prompts, all runs interleaved; medians. "
          f"Machine: {res['machine']['cpu']}, {res['machine']['torch_threads']} threads.\n",
          f"## Per-call costs (KV cache warm, context {res['cost_context']})\n"]
    rows = []
    for mode, c in res["costs"].items():
        label = ("the format's kernels" if fmt != "float32" else "oneDNN (default)") if mode == "onednn" \
            else "MKL (kernels.ENABLED=False)"
        rows.append([label, _ms(c["draft_step"]), _ms(c["target_step"]),
                     f"{c['draft_step'] / c['target_step']:.3f}"]
                    + [f"{_ms(c['verify'][g])} ({c['verify'][g] / c['target_step']:.2f}x)" for g in res["gammas"]])
    md.append(markdown_table(["linears", "draft step ms", "target step ms", "c = draft/target"]
                             + [f"verify {g + 1} tokens ms (x step)" for g in res["gammas"]], rows))

    def spec_table(rows):
        return markdown_table(
            ["sampling", "gamma", "acceptance", "tokens / target call", "baseline s", "spec s",
             "measured speed-up", "ideal speed-up", "measured / ideal", "ideal (vs n x t_step)",
             "theory (Leviathan, measured costs)", "target calls / token = 1/tpc", "forwards = stats"],
            [[r["kind"], r["gamma"], f"{r['acceptance_rate']:.3f}", f"{r['tokens_per_target_call']:.2f}",
              f"{r['baseline_seconds_median']:.2f}", f"{r['spec_seconds_median']:.2f}",
              f"{r['measured_speedup']:.2f}x", f"{r['ideal_speedup']:.2f}x",
              f"**{100 * r['measured_over_ideal']:.0f}%**", f"{r['ideal_speedup_vs_target_steps']:.2f}x",
              f"{r['theory_speedup']:.2f}x",
              f"{r['target_calls_per_token']:.4f} = {r['inverse_tokens_per_target_call']:.4f}",
              "yes" if r["forward_counts_match_stats"] else "NO"] for r in rows])

    md.append(f"\n## Speculative vs autoregressive ({'oneDNN, the default' if fmt == 'float32' else fmt})\n")
    md.append(spec_table(res["summary"]))
    md.append("\nideal_time = draft_calls x t_draft + target_calls x t_verify(gamma+1) (measured counts, "
              "per-call costs above); ideal speed-up = baseline time / ideal time. "
              "The T=1 rows use the greedy baseline's time (sampling adds no forward passes).\n")
    checks = res["greedy_equals_baseline"]
    md.append("Our speculative greedy output equals the baseline's: "
              + ", ".join(f"g={g}: {sum(v)}/{len(v)} prompts" for g, v in checks.items()) + "\n")
    if res.get("hf"):
        md.append("## Greedy: ours vs transformers' assisted generation (same checkpoints)\n")
        md.append(markdown_table(
            ["run", "HF s", "ours s (same gamma / baseline)", "HF speed-up vs HF greedy",
             "HF tokens = our baseline", "HF tokens = our spec", "first mismatch at"],
            [[r["label"], f"{r['hf_seconds_median']:.2f}", f"{r['ours_seconds_median']:.2f}",
              f"{r['hf_speedup_vs_hf_greedy']:.2f}x" if r["hf_speedup_vs_hf_greedy"] else "",
              f"{sum(r['same_tokens_as_our_baseline'])}/{len(r['same_tokens_as_our_baseline'])}",
              f"{sum(r['same_tokens_as_ours'])}/{len(r['same_tokens_as_ours'])}",
              ", ".join(str(f) for f in r["first_mismatch_vs_our_baseline"])] for r in res["hf"]]))
    if res.get("mkl_summary"):
        md.append("\n## The same with MKL (gpt2.speed.kernels.ENABLED = False)\n")
        md.append(spec_table(res["mkl_summary"]))
        md.append("\n(ideal uses the MKL per-call costs above)\n")
    return "\n".join(md) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    p.add_argument("--target-model", default="gpt2-large", choices=list(OFFICIAL_CONFIGS))
    p.add_argument("--draft-layers", type=int, default=4,
                   help="draft = the target's first K blocks (4 of 36: c ~ 0.18, near gpt2-small's share)")
    p.add_argument("--damping", type=float, default=0.04,
                   help="scale of the target's later blocks' outputs: lower = more agreement")
    p.add_argument("--embedding-std", type=float, default=0.1,
                   help="std of the random embeddings (1.0 makes both models just repeat the last token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="prompts; every run once per prompt")
    p.add_argument("--cost-repeats", type=int, default=10)
    p.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--mkl-gamma", type=int, default=4, help="gamma for the MKL comparison (0: skip)")
    p.add_argument("--mkl-repeats", type=int, default=2)
    p.add_argument("--format", default="float32", choices=list(FORMAT_NAMES),
                   help="both models' weight format (default float32, as transformers runs them; another "
                        "needs --no-hf --mkl-gamma 0, which compare float32 runs)")
    p.add_argument("--compile", choices=list(COMPILE_FLAGS), default="off",
                   help="both models' decode path, as the scripts' --compile (e.g. fused on a CPU)")
    add_output_options(p, "speculative_speed", "gpt2-shaped target, 2-block draft, 16 tokens, 1 prompt")
    args = p.parse_args(argv)
    if args.format != "float32" and not (args.no_hf and args.mkl_gamma == 0):
        p.error(f"--format {args.format}: pass --no-hf --mkl-gamma 0 too (transformers and the MKL comparison "
                f"run float32 weights)")
    if not args.no_hf and (missing := transformers_missing("the comparison with transformers' assisted generation")):
        p.error(missing + ", or pass --no-hf")
    if args.quick:
        args.target_model, args.draft_layers, args.new_tokens = "gpt2", 2, 16
        args.repeats, args.cost_repeats, args.mkl_repeats, args.gammas = 1, 3, 1, [2, 4]
        args.mkl_gamma = 2

    print("Preparing the pair ...", flush=True)
    target_dir, draft_dir = standin_pair(args.checkpoints, args.target_model, args.draft_layers,
                                         args.damping, args.embedding_std, args.seed)
    # float32 by default, as transformers runs them (dtype "auto" would pick bfloat16 at this size on a CPU with bf16)
    target, draft = (load_accelerated(folder, format=args.format, compile=COMPILE_FLAGS[args.compile])
                     for folder in (target_dir, draft_dir))
    counters = {"target": ForwardCounter(target), "draft": ForwardCounter(draft)}
    hf_target = hf_draft = None
    if not args.no_hf:
        from transformers import GPT2LMHeadModel
        hf_target = GPT2LMHeadModel.from_pretrained(target_dir).eval()
        hf_draft = GPT2LMHeadModel.from_pretrained(draft_dir).eval()

    context = args.prompt_len + args.new_tokens // 2
    print(f"Per-call costs at context {context} ...", flush=True)
    modes = ("onednn", "mkl") if args.mkl_gamma else ("onednn",)
    costs = per_call_costs(target, draft, context, args.gammas, args.cost_repeats, modes)
    for mode, c in costs.items():
        print(f"  {mode:6s}: draft {_ms(c['draft_step'])} ms, target {_ms(c['target_step'])} ms, "
              + ", ".join(f"verify {g + 1}: {_ms(t)} ms" for g, t in c["verify"].items()))

    jobs = make_jobs(target, draft, hf_target, hf_draft, args.gammas, args.new_tokens, not args.no_hf)
    print("Warm-up ...", flush=True)
    warm = make_jobs(target, draft, hf_target, hf_draft, args.gammas, 8, not args.no_hf)
    for fn in warm.values():
        fn(random_prompt(args.prompt_len, seed=999), 0)

    prompts = [random_prompt(args.prompt_len, seed=r + 1) for r in range(args.repeats)]
    print(f"Generation runs: {len(jobs)} kinds x {len(prompts)} prompts, interleaved ...", flush=True)
    runs = run_interleaved(jobs, prompts, counters, "  runs (oneDNN)")
    summary = summarize(runs, costs["onednn"], args.gammas)

    res = {"machine": machine_info(), "settings": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items()},
           "target_dir": str(target_dir), "draft_dir": str(draft_dir), "gammas": args.gammas,
           "cost_context": context, "costs": costs, "summary": summary,
           "greedy_equals_baseline": greedy_checks(runs, args.gammas),
           "hf": hf_summary(runs, args.gammas) if not args.no_hf else None}

    if args.mkl_gamma:
        print(f"MKL comparison (kernels.ENABLED=False), gamma={args.mkl_gamma} ...", flush=True)
        g = args.mkl_gamma
        mkl_jobs = {k: v for k, v in jobs.items() if k in ("baseline greedy", f"spec greedy g={g}")}
        if f"spec greedy g={g}" not in mkl_jobs:
            mkl_jobs[f"spec greedy g={g}"] = lambda p, s: _ours(
                speculative_sampling_greedy(target, draft, p, args.new_tokens, g))
        if g not in costs["mkl"]["verify"]:
            costs = {**costs, "mkl": per_call_costs(target, draft, context, [g], args.cost_repeats, ("mkl",))["mkl"]}
        set_onednn(False)
        try:
            mkl_runs = run_interleaved(mkl_jobs, prompts[:args.mkl_repeats], counters, "  runs (MKL)")
        finally:
            set_onednn(True)
        res["mkl_summary"] = summarize(mkl_runs, costs["mkl"], [g], kinds=("greedy",))
        res["mkl_runs_seconds"] = {k: [r["seconds"] for r in v] for k, v in mkl_runs.items()}

    res["runs_seconds"] = {k: [r["seconds"] for r in v] for k, v in runs.items()}
    res["runs_stats"] = {k: [r["stats"].to_dict() for r in v if r["stats"] is not None]
                         for k, v in runs.items()}
    md = report(res)
    print("\n" + md)
    write_results(args.out, res, md)


if __name__ == "__main__":
    main()
