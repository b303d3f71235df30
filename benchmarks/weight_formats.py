"""A decoding step, verification and speculative decoding in each weight format, side by side.

    python -m benchmarks.weight_formats --checkpoints /tmp/standins --out runs/weight_formats
    python -m benchmarks.weight_formats --quick       # gpt2-shaped pair, few repeats (smoke run)

Loads a gpt2-large-shaped random stand-in target and a draft made of its first 6 blocks
(benchmarks.common.standin_pair; timings do not depend on the weight values) in each format:

  fp32   load_accelerated(path, dtype="float32")       (oneDNN fp32)
  bf16   load_accelerated(path, dtype="bfloat16")      (pre-packed oneDNN bf16, gpt2/speed/fast_linear.py;
                                                 what dtype="auto" picks on a CPU with bf16)
  int8   load_accelerated(path, dtype="float32", quantize="int8")  (weight-only int8, gpt2/speed/fast_linear.py)
  fp16w  load_accelerated(path, quantize="fp16")       (float16 weights, float32 math: fbgemm)
  fp16   load_accelerated(path, dtype="float16")       (a float16 model: F.linear, no fast path)
  auto   load_accelerated(path)                        (dtype "auto": the format gpt2.speed.kernels measures
                                                 fastest on this machine, said in one line)
  int8+bf16, and "<format>-plain": the same model run with GPT2_FAST_LINEAR=0

and measures, interleaving the formats round by round (medians; the machine may be shared):
  1. one decoding step (1 token, KV cache holding --context positions) and its weight GB/s,
  2. verifying 5 tokens in one forward, as a multiple of that format's step,
  3. greedy decoding of --new-tokens tokens: plain autoregressive and speculative (gamma
     --gamma, the draft in the same format), tokens/s, tokens per target call, and whether the
     speculative output equals the same-format target's greedy output (it must),
  4. with fp32 among the formats, how far each format's greedy output agrees with fp32's: the
     tokens before the first difference, and the share of positions where the format's argmax
     equals fp32's, both models reading fp32's greedy text (no drift after a first difference).

With --attention it also times attention over a cache of 32..1000 positions in bfloat16 and
float16, as is and with the float32 cache a half-precision model keeps on CPU (gpt2/model.py).

With --breakdown it also says where a step's time goes, per format (interleaved with the steps):
  linears   the model's own linear layers and head alone, called in order on one row each
            (the weights must be read: (weight bytes) / (read bandwidth) is the floor),
  other ops a step of a model with the same number of blocks but tiny widths (n_embd 64, vocab
            256), loaded the same way, minus its own linears alone: the cost of the ~450 other
            small ops (Python, dispatch, thread wake-ups) that does not depend on the weights,
  rest      step - linears - other ops: attention over the cache, LayerNorms, GELU, cache
            writes at full width.
The stand-in pair agrees far more than GPT-2 Small/Large do on real text, so the speculative
speed-ups show what the costs allow, not what real models reach.
"""

import argparse
from pathlib import Path

import torch

import gpt2.speed.kernels
from gpt2 import GPT2Config
from gpt2.speed import load_accelerated
from offline.random_weights import save_random_checkpoint
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

from .common import (BYTES_PER_GB, DEFAULT_CHECKPOINTS, add_output_options, has_checkpoint, machine_info, markdown_table,
                     measure_read_bandwidth, median, random_prompt, standin_pair, timed,
                     weight_bytes_per_token, write_results)

FORMATS = {"fp32": {"dtype": "float32"}, "bf16": {"dtype": "bfloat16"},
           "int8": {"dtype": "float32", "quantize": "int8"}, "fp16w": {"dtype": "float32", "quantize": "fp16"},
           "fp16": {"dtype": "float16"},
           "int8+bf16": {"dtype": "bfloat16", "quantize": "int8"},
           "w8a8": {"dtype": "float32", "quantize": "w8a8"},
           "auto": {"dtype": "auto"}}  # what gpt2.speed.kernels measures fastest here (one of the above)
# "<format>-plain": the same loaded model with GPT2_FAST_LINEAR=0 (no extra memory). For int8 that
# is the plain oneDNN path on the dequantized weights, i.e. what a plain bf16/fp32 model costs.
FORMATS.update({f"{name}-plain": kwargs for name, kwargs in list(FORMATS.items()) if name != "fp32"})


class fast_kernels:
    """with fast_kernels(on): run an accelerated model on its kernels, or (off) every FastLinear on
    F.linear over its values (gpt2.speed.fast_model.ENABLED, what GPT2_FAST_LINEAR=0 sets)."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.saved, gpt2.speed.fast_model.ENABLED = gpt2.speed.fast_model.ENABLED, self.on

    def __exit__(self, *exc):
        gpt2.speed.fast_model.ENABLED = self.saved


def format_bytes(model, fmt) -> int:
    """Weight bytes a step reads: the int8 formats (w8a8 too) read 1 byte per linear/head weight, fp16w 2."""
    total = weight_bytes_per_token(model)
    quantize = {"fp16": "fp16w"}.get(getattr(model, "quantize", None), getattr(model, "quantize", None))
    stored = {"int8": 1, "w8a8": 1, "fp16w": 2}.get(quantize if fmt == "auto" else fmt.split("+")[0])
    if stored and not fmt.endswith("-plain"):
        for w in gpt2.speed.kernels.linear_weights(model):
            total -= w.numel() * (w.dtype.itemsize - stored)  # (a StoredWeight: its dtype as decoded)
    return total


@torch.inference_mode()
def forward_seconds(model, cache, context_len, tokens):
    """One forward of len(tokens) new tokens after context_len cached positions, with the logits
    of all of them (a verification needs every one); rolls back."""
    _, seconds = timed(None, model, torch.tensor([tokens]), cache, len(tokens))
    cache.truncate(context_len)
    return seconds


@torch.inference_mode()
def linears_alone_seconds(model) -> float:
    """Every linear layer of one decoding step (4 per block, then the head), in order, one row
    each, on the kernels loading attached: the step's matrix work without anything between."""
    layers = [lin for b in model.h for lin in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    dtype = model.wpe.weight.dtype
    x = {n: torch.randn(1, 1, n, dtype=dtype) for n in {lin.in_features for lin in layers}}

    def run():
        for lin in layers:
            lin(x[lin.in_features])
        model.head(x[model.config.n_embd])

    return timed(None, run)[1]


@torch.inference_mode()
def attention_table(config, contexts=(32, 160, 500, 1000), rounds=8, calls=25) -> str:
    """Attention over a cache (F.scaled_dot_product_attention, one layer of config's shape) for 1
    and 5 new tokens, in each half precision as is and upcast to float32, in microseconds: why a
    half-precision model keeps a float32 cache on CPU (gpt2/model.py, new_kv_cache)."""
    H, D = config.n_head, config.head_dim
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for ctx in contexts:
            for T in (1, 5):
                q = torch.randn(1, H, T, D, dtype=dtype)
                kv = torch.randn(1, H, ctx + T, D, dtype=dtype)
                kv32 = kv.float()
                mask = None if T == 1 else torch.arange(ctx + T)[None, :] <= torch.arange(ctx, ctx + T)[:, None]
                variants = {"as is": lambda: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, attn_mask=mask),
                            "float32 cache": lambda: torch.nn.functional.scaled_dot_product_attention(
                                q.float(), kv32, kv32, attn_mask=mask).to(dtype)}
                times = {name: [] for name in variants}
                for _ in range(rounds):
                    for name, fn in variants.items():
                        fn()
                        times[name].append(timed(None, lambda: [fn() for _ in range(calls)])[1] / calls)
                a, f = median(times["as is"]), median(times["float32 cache"])
                rows.append([str(dtype).removeprefix("torch."), ctx, T, f"{a * 1e6:.0f}", f"{f * 1e6:.0f}", f"{a / f:.2f}"])
    return (f"Attention over the cache, one layer ({H} heads x {D}), microseconds (medians of {rounds} "
            f"interleaved rounds):\n\n"
            + markdown_table(["model dtype", "cached", "new tokens", "in the model's dtype",
                              "float32 cache (q upcast)", "ratio"], rows))


def skeleton_checkpoint(root: Path, n_layer: int) -> Path:
    """A model with n_layer blocks of tiny width: its step costs what the ops cost, not the weights."""
    folder = Path(root) / f"skeleton-{n_layer}-layers"
    if not has_checkpoint(folder):
        save_random_checkpoint(folder, GPT2Config(n_layer=n_layer, n_head=4, n_embd=64,
                                                  vocab_size=256, n_positions=1024))
    return folder


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    p.add_argument("--target-model", default="gpt2-large")
    p.add_argument("--draft-layers", type=int, default=6)
    p.add_argument("--formats", nargs="+", default=["fp32", "bf16", "int8"], choices=list(FORMATS))
    p.add_argument("--context", type=int, default=160, help="cached positions for the step timings")
    p.add_argument("--steps", type=int, default=15, help="timed rounds of step / verify-5")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2, help="timed generation rounds (prompts)")
    p.add_argument("--gen-warmup", type=int, default=1, help="untimed generation rounds first")
    p.add_argument("--threads", type=int, default=2)
    add_output_options(p, "weight_formats", "gpt2-shaped pair, 2-block draft, few repeats")
    p.add_argument("--attention", action="store_true",
                   help="also time attention over the cache in bf16/fp16 as is and with a float32 cache")
    p.add_argument("--breakdown", action="store_true",
                   help="also time each format's linears alone and its other ops (where a step goes)")
    args = p.parse_args(argv)
    if args.quick:
        args.target_model, args.draft_layers, args.steps, args.new_tokens, args.repeats = "gpt2", 2, 3, 16, 1
    torch.set_num_threads(args.threads)

    target_dir, draft_dir = standin_pair(args.checkpoints, args.target_model, args.draft_layers,
                                         damping=0.04, embedding_std=0.1)
    targets, drafts = {}, {}
    for fmt in args.formats:
        same = next((f for f in targets if FORMATS[f] == FORMATS[fmt]), None)  # "-plain" shares
        if same is None:
            print(f"loading the {fmt} pair ...", flush=True)
        targets[fmt] = targets[same] if same else load_accelerated(target_dir, **FORMATS[fmt])
        drafts[fmt] = drafts[same] if same else load_accelerated(draft_dir, **FORMATS[fmt])
    skeletons = {}
    if args.breakdown:
        skeleton_dir = skeleton_checkpoint(args.checkpoints, targets[args.formats[0]].config.n_layer)
        skeletons = {fmt: load_accelerated(skeleton_dir, **FORMATS[fmt]) for fmt in args.formats}

    # 1-2. Step and verify-5, formats interleaved.
    prompt = random_prompt(args.context, seed=0)
    caches, skeleton_caches = {}, {}
    for fmt, model in targets.items():
        caches[fmt] = model.new_kv_cache(max_len=args.context + 8)
        with torch.inference_mode(), fast_kernels(not fmt.endswith("-plain")):
            model(torch.tensor([prompt]), caches[fmt], 1)
            if fmt in skeletons:
                skeleton_caches[fmt] = skeletons[fmt].new_kv_cache(max_len=args.context + 8)
                skeletons[fmt](torch.tensor([[t % 256 for t in prompt]]), skeleton_caches[fmt], 1)
    step, verify, linears, other_ops = ({f: [] for f in targets} for _ in range(4))
    five = random_prompt(5, seed=1)
    for r in range(args.steps + 2):
        for fmt, model in targets.items():
            with fast_kernels(not fmt.endswith("-plain")):
                s = forward_seconds(model, caches[fmt], args.context, five[:1])
                v = forward_seconds(model, caches[fmt], args.context, five)
                if fmt in skeletons:
                    lin = linears_alone_seconds(model)
                    other = (forward_seconds(skeletons[fmt], skeleton_caches[fmt], args.context, [1])
                          - linears_alone_seconds(skeletons[fmt]))
            if r >= 2:  # two warm-up rounds
                step[fmt].append(s)
                verify[fmt].append(v)
                if fmt in skeletons:
                    linears[fmt].append(lin)
                    other_ops[fmt].append(other)
        print(f"  step/verify round {r + 1}/{args.steps + 2}", flush=True)
    del caches, skeleton_caches
    for fmt in targets:  # printed now: the generation below can take long on a busy machine
        print(f"  {fmt}: step {median(step[fmt]) * 1e3:.0f} ms, verify-5 {median(verify[fmt]) * 1e3:.0f} ms, "
              f"steps {[round(t * 1e3) for t in step[fmt]]}, verify {[round(t * 1e3) for t in verify[fmt]]}",
              flush=True)

    # 3. Greedy generation: autoregressive and speculative, formats interleaved.
    ar, spec, same, alpha, per_call, prefix, argmax = ({f: [] for f in targets} for _ in range(7))
    greedy = {}  # format -> this round's greedy tokens
    for r in range(args.repeats + args.gen_warmup):
        gen_prompt = random_prompt(32, seed=100 + r)
        for fmt in targets:
            with fast_kernels(not fmt.endswith("-plain")):
                a, ta = timed(None, autoregressive_generate, targets[fmt], gen_prompt, args.new_tokens)
                s, ts = timed(None, speculative_sampling_greedy, targets[fmt], drafts[fmt], gen_prompt,
                              args.new_tokens, args.gamma)
            if r >= args.gen_warmup:
                ar[fmt].append(ta)
                spec[fmt].append(ts)
                same[fmt].append(a.tokens == s.tokens)
                alpha[fmt].append(s.stats.alpha)
                per_call[fmt].append(s.stats.tokens_per_target_call)
                greedy[fmt] = a.tokens
        if r >= args.gen_warmup and "fp32" in targets:
            for fmt in targets:
                prefix[fmt].append(first_difference(greedy[fmt], greedy["fp32"]) / args.new_tokens)
                argmax[fmt].append(argmax_agreement(targets[fmt], targets["fp32"], gen_prompt + greedy["fp32"]))
        print(f"  generation round {r + 1}/{args.repeats + args.gen_warmup}", flush=True)

    base = median(step["fp32"]) if "fp32" in step else None
    results, rows = {}, []
    for fmt in targets:
        st, ve = median(step[fmt]), median(verify[fmt])
        nbytes = format_bytes(targets[fmt], fmt)
        ar_tps, spec_tps = args.new_tokens / median(ar[fmt]), args.new_tokens / median(spec[fmt])
        results[fmt] = {"load": FORMATS[fmt], "step_s": step[fmt], "verify5_s": verify[fmt],
                        "step_median_s": st, "verify5_median_s": ve, "weight_bytes": nbytes,
                        "ar_s": ar[fmt], "spec_s": spec[fmt], "spec_equals_ar": same[fmt],
                        "alpha": alpha[fmt], "tokens_per_target_call": per_call[fmt],
                        "greedy_prefix_equal_to_fp32": prefix[fmt], "argmax_agreement_with_fp32": argmax[fmt]}
        rows.append([fmt, f"{st * 1e3:.0f}", f"{st / base:.2f}" if base else "",
                     f"{nbytes / st / BYTES_PER_GB:.1f}", f"{ve / st:.2f}", f"{ar_tps:.1f}",
                     f"{spec_tps:.1f}", f"{spec_tps / ar_tps:.2f}", f"{median(alpha[fmt]):.2f}",
                     f"{median(per_call[fmt]):.2f}", "yes" if all(same[fmt]) else "NO",
                     f"{median(prefix[fmt]):.0%}" if prefix[fmt] else "", f"{median(argmax[fmt]):.1%}" if argmax[fmt] else ""])
    table = markdown_table(["format", "step ms", "vs fp32", "GB/s", "verify-5 / step", "AR tok/s",
                            f"spec tok/s (gamma {args.gamma})", "spec / AR", "alpha", "tokens / target call",
                            "spec == AR", "greedy = fp32 (prefix)", "argmax = fp32"], rows)
    md = (f"{args.target_model}-shaped random stand-in target, {args.draft_layers}-block draft "
          f"(same format), {args.threads} threads, step at context {args.context}, "
          f"{args.steps} interleaved rounds, {args.repeats} generation rounds of {args.new_tokens} "
          f"tokens (medians). Stand-in acceptance is far above real GPT-2's.\n\n{table}\n")
    bandwidth = measure_read_bandwidth() if skeletons else None  # the breakdown's floor
    if skeletons:
        md += "\n" + step_breakdown_table(targets, step, linears, other_ops, bandwidth) + "\n"
        for fmt in targets:
            results[fmt].update(linears_s=linears[fmt], other_ops_s=other_ops[fmt])
    if args.attention:
        md += "\n" + attention_table(targets[args.formats[0]].config) + "\n"
    print("\n" + md)
    write_results(args.out, {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
                             "read_bandwidth": bandwidth, "formats": results}, md)


def first_difference(tokens, reference) -> int:
    """How many tokens agree before the first difference."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


@torch.inference_mode()
def argmax_agreement(model, reference, ids) -> float:
    """The share of positions of `ids` where model's next-token argmax equals reference's."""
    x = torch.tensor([ids])
    return (model(x).argmax(-1) == reference(x).argmax(-1)).float().mean().item()


def step_breakdown_table(targets, step, linears, other_ops, bandwidth) -> str:
    """Where one decoding step goes, per format (medians of interleaved rounds), in ms."""
    gbs = bandwidth["gb_per_s_median"]
    rows = []
    for fmt, model in targets.items():
        st, lin, sk = median(step[fmt]), median(linears[fmt]), median(other_ops[fmt])
        nbytes = format_bytes(model, fmt)
        floor = nbytes / BYTES_PER_GB / gbs
        rows.append([fmt, f"{st * 1e3:.0f}", f"{lin * 1e3:.0f} ({lin / st:.0%})",
                     f"{nbytes / lin / BYTES_PER_GB:.1f}", f"{floor * 1e3:.0f}",
                     f"{sk * 1e3:.1f} ({sk / st:.0%})", f"{(st - lin - sk) * 1e3:.0f} ({(st - lin - sk) / st:.0%})"])
    return (f"Where a step goes (read bandwidth here: {gbs:.1f} GB/s, x.sum() over 1 GiB):\n\n"
            + markdown_table(["format", "step ms", "linears alone ms", "linears GB/s",
                              "bytes / bandwidth ms", "other ops ms (no weights)", "rest ms"], rows))


if __name__ == "__main__":
    main()
