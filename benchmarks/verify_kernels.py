"""What some kernel candidates buy: a step and verify(5) of one model with the kernels gpt2.speed.kernels
chooses among all candidates, against its choice without the named ones, interleaved.

    python -m benchmarks.verify_kernels --checkpoints /tmp/standins --formats fp32 int8 \\
        --without onednn-packed int8-bf16 --threads 1
    python -m benchmarks.verify_kernels --quick       # gpt2-shaped pair, few rounds (smoke run)

Per weight format, loads a gpt2-large-shaped random stand-in target and its 6-block draft
(benchmarks.common.standin_pair) with the kernels measured fastest among all candidates ("all"),
then a second model on the same weight values with the kernels measured fastest without the
--without paths ("without"), and times the two faces round by round:
  1. one decoding step (1 token after --context cached positions) and one verification of 5
     tokens, wall and this process's CPU time (the steadier figure on a shared machine), medians;
  2. greedy decoding of --new-tokens tokens, plain and speculative (gamma 4, the draft on the
     same face): whether speculative equals plain greedy on each face (it must, up to near-ties
     where the 1-row and many-row kernels round apart), and whether the two faces' plain greedy
     tokens agree.
Both choices are measured (or read) through gpt2.speed.kernels.rows_choice, so they land in the
kernel cache (GPT2_KERNEL_CACHE) like any other.
"""

import argparse
import math
import time
from pathlib import Path

import torch

import gpt2.speed.kernels as kernels
from gpt2.speed import FastGPT2, load_accelerated
from gpt2.speed.fast_linear import int8_per_channel
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

from .common import (DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table, median, random_prompt,
                     standin_pair, write_results)
from .weight_formats import FORMATS


def faces(model, fmt: str, without: list[str]) -> dict[str, object]:
    """{"all": the model as loaded, "without": a model on the same weight values whose kernels take,
    wherever the loaded choice took a path of `without`, the path measured fastest for those rows
    without them} (so the two faces differ only where the named paths won, and timing noise in the
    other choices cannot tell them apart)."""
    loaded_choice = {(layer.out_features, layer.in_features): layer.kernel.paths() for layer in kernels.attached(model)}

    def chooser(group_fmt, sample, paths, int8):
        kept = [p for p in paths if p not in without] or paths[:1]
        shape, dtype = tuple(sample[0].shape), sample[0].dtype
        fallback, _ = kernels.rows_choice(group_fmt, shape, dtype, kept, lambda: sample, int8)
        loaded = loaded_choice[shape]
        at = lambda choice, rows: next(p for m, p in choice if m >= rows)
        return [(rows, at(loaded, rows) if at(loaded, rows) not in without else at(fallback, rows))
                for rows in (*kernels.ROW_LIMITS, math.inf)]

    other = FastGPT2.holding(model.to_plain())  # the same values, every layer plain until attached
    int8 = ({w: int8_per_channel(w) for w in kernels.linear_weights(other)}  # gives back (q, scale)
            if model.format == "int8" else None)
    said = kernels.attach_kernels(other, int8=int8, fp16=model.format == "fp16", choose=chooser)
    other.format = model.format
    print(f"  {fmt} without {', '.join(without)}: {'; '.join(said)}", flush=True)
    return {"all": model, "without": other}


@torch.inference_mode()
def forward_times(model, cache, context_len, tokens) -> tuple[float, float]:
    """(wall s, CPU s) of one forward of len(tokens) new tokens after context_len cached positions."""
    wall, cpu = time.perf_counter(), time.process_time()
    model(torch.tensor([tokens]), cache, len(tokens))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    cache.truncate(context_len)
    return wall, cpu


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    p.add_argument("--target-model", default="gpt2-large")
    p.add_argument("--draft-layers", type=int, default=6)
    p.add_argument("--formats", nargs="+", default=["fp32", "int8"], choices=list(FORMATS))
    p.add_argument("--without", nargs="+", default=["onednn-packed", "int8-bf16"], choices=list(kernels.PATHS))
    p.add_argument("--context", type=int, default=160)
    p.add_argument("--steps", type=int, default=10, help="timed rounds of step / verify-5 per face")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    add_output_options(p, "verify_kernels", "gpt2-shaped pair, 2-block draft, 3 rounds, 8 tokens")
    args = p.parse_args(argv)
    if args.quick:
        args.target_model, args.draft_layers, args.steps, args.new_tokens = "gpt2", 2, 3, 8
    torch.set_num_threads(args.threads)
    target_dir, draft_dir = standin_pair(args.checkpoints, args.target_model, args.draft_layers,
                                         damping=0.04, embedding_std=0.1)
    rows, results = [], {}
    for fmt in args.formats:
        print(f"loading the {fmt} pair ...", flush=True)
        target, draft = load_accelerated(target_dir, **FORMATS[fmt]), load_accelerated(draft_dir, **FORMATS[fmt])
        target_faces, draft_faces = faces(target, fmt, args.without), faces(draft, fmt, args.without)
        prompt, five = random_prompt(args.context, seed=0), random_prompt(5, seed=1)
        cache = target.new_kv_cache(max_len=args.context + 8)
        with torch.inference_mode():
            target(torch.tensor([prompt]), cache, 1)
        times = {(face, what): [] for face in target_faces for what in ("step", "verify")}
        for r in range(args.steps + 1):
            for face, model in target_faces.items():
                step = forward_times(model, cache, args.context, five[:1])
                verify = forward_times(model, cache, args.context, five)
                if r:  # one warm-up round
                    times[face, "step"].append(step)
                    times[face, "verify"].append(verify)
        greedy, spec_equal = {}, {}
        gen_prompt = random_prompt(32, seed=100)
        for face in target_faces:
            face_target, face_draft = target_faces[face], draft_faces[face]
            greedy[face] = autoregressive_generate(face_target, gen_prompt, args.new_tokens).tokens
            spec = speculative_sampling_greedy(face_target, face_draft, gen_prompt, args.new_tokens, gamma=4).tokens
            spec_equal[face] = spec == greedy[face]
        for face in target_faces:
            med = {what: [median([t[i] for t in times[face, what]]) for i in (0, 1)] for what in ("step", "verify")}
            results[f"{fmt}/{face}"] = {"times": {f"{k[1]}": v for k, v in times.items() if k[0] == face},
                                        "spec_equals_greedy": spec_equal[face]}
            rows.append([fmt, face if face == "all" else f"without {', '.join(args.without)}",
                         f"{med['step'][0] * 1e3:.0f} ({med['step'][1] * 1e3:.0f})",
                         f"{med['verify'][0] * 1e3:.0f} ({med['verify'][1] * 1e3:.0f})",
                         f"{med['verify'][0] / med['step'][0]:.2f} ({med['verify'][1] / med['step'][1]:.2f})",
                         "yes" if spec_equal[face] else "NO",
                         "yes" if greedy[face] == greedy["all"] else "NO"])
        del target, draft, target_faces, draft_faces, cache
    table = markdown_table(["format", "kernels", "step ms (CPU ms)", "verify(5) ms (CPU ms)", "verify(5) / step (CPU)",
                            f"speculative = greedy ({args.new_tokens} tokens)", "greedy = the all face's"], rows)
    md = (f"{args.target_model}-shaped random stand-in target, {args.threads} threads, context {args.context}, "
          f"{args.steps} interleaved rounds (medians).\n\n{table}\n")
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                             "results": results}, md)


if __name__ == "__main__":
    main()
