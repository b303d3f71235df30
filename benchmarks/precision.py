"""How far each weight format's greedy decoding stays from float32's, and whether greedy speculative
decoding in it equals its own plain greedy decoding.

    python -m benchmarks.precision --pair runs/standins/target runs/standins/draft
    python -m benchmarks.precision --pair T D --formats float32 int8 --prompts 8 --tokens 200
    python -m benchmarks.precision --quick          # a tiny random pair, a few tokens

Per format of the target (and the draft, loaded alike), on --prompts random prompts of 16 tokens,
--tokens greedy tokens each:

  ties / 1k steps   decode steps whose two largest logits are exactly equal, per 1,000 steps (a
                    tie float32 would break by its last bits; any rounding difference between a
                    step and a verification then decides it)
  same as float32   greedy tokens until the first one that differs from float32's greedy text
                    (mean and least over the prompts; all of them if none differs): the first
                    position of the format's text where float32's argmax, on the same prefix, is
                    another token
  KL to float32     mean KL(p_float32 || p_format) of the next-token distributions along the
                    format's greedy text, in nats (gpt2.speed.kernels.fidelity)
  spec != plain     prompts whose greedy speculative output (gamma 4, the draft in the same
                    format) parts from the target's own plain greedy output, per 1,000 tokens
  step ms           the median decode step of the target (a noisy figure on a shared machine)

Formats: float32, fp16 (float16 weights, float32 math), int8 (int8 weights, float32 sums and
outputs: what gpt2.speed.kernels defines), bfloat16 (the whole model in bfloat16), and
int8-bf16out: the same int8 weights on the library's int8 products (_weight_int8pack_mm for a step,
oneDNN's bfloat16 matmul for a verification), which round activations and every output to bfloat16.
"""

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import random_prompt
from gpt2 import load_gpt2
from gpt2.speed import FastGPT2, load_accelerated
from gpt2.speed import kernels
from gpt2.speed.fast_linear import int8_per_channel
from spec_decoding import speculative_sampling_greedy
from spec_decoding.caches import forward_new_tokens, new_cache

FORMATS = {"float32": dict(dtype="float32"), "fp16": dict(dtype="float32", quantize="fp16"),
           "int8": dict(dtype="float32", quantize="int8"), "bfloat16": dict(dtype="bfloat16"),
           "int8-bf16out": dict(dtype="float32", quantize="int8")}
# int8-bf16out: the library's int8 kernels, a step on one and a verification on the other.
BF16OUT_CHOICE = [(1, "int8pack"), (math.inf, "int8-bf16")]
PROMPT_TOKENS = 16


def load(folder: Path, fmt: str):
    """The model at folder in a format of FORMATS (int8-bf16out: int8 weights re-attached to the
    library's bfloat16-output kernels). float32 runs plain PyTorch: the reference, in one copy of
    the weights (a kernel that packs a second float32 copy would double its memory)."""
    if fmt == "float32":
        return load_gpt2(folder)
    if fmt != "int8-bf16out":
        return load_accelerated(folder, **FORMATS[fmt])
    # the int8 values as a plain model, then the library's kernels on them
    model = FastGPT2.holding(load_accelerated(folder, **FORMATS[fmt]).to_plain())
    int8 = {w: int8_per_channel(w) for w in kernels.linear_weights(model)}  # gives back (q, scale)
    int8_paths = kernels.CANDIDATES["int8"]
    kernels.CANDIDATES["int8"] = tuple(path for _, path in BF16OUT_CHOICE)  # every layer, small ones too
    try:
        kernels.attach_kernels(model, int8=int8, choose=lambda *a: BF16OUT_CHOICE)
    finally:
        kernels.CANDIDATES["int8"] = int8_paths
    used = {path for layer in kernels.attached(model) for _, path in layer.kernel.paths()}
    if not used <= {path for _, path in BF16OUT_CHOICE}:
        raise RuntimeError(f"int8-bf16out runs on {used}, not the library's int8 kernels")
    return model


@torch.inference_mode()
def greedy_run(model, prompt: list[int], n: int) -> dict:
    """Plain greedy decoding with the KV cache: {"tokens": n new tokens, "ties": decode steps whose
    top-2 logits are exactly equal, "step_s": [seconds per decode step]}."""
    tokens, cache = list(prompt), new_cache(model, len(prompt), n)
    ties, step_s = 0, []
    for i in range(n):
        t0 = time.perf_counter()
        logits = forward_new_tokens(model, cache, tokens)[-1].float()
        if i:  # the first call is the prompt's prefill
            step_s.append(time.perf_counter() - t0)
        top2 = logits.topk(2).values
        ties += bool(top2[0] == top2[1])
        tokens.append(int(logits.argmax()))
    return {"tokens": tokens[len(prompt):], "ties": ties, "step_s": step_s}


@torch.inference_mode()
def teacher_forced_logits(model, prompt: list[int], text: list[int]) -> torch.Tensor:
    """Logits [len(text), vocab] float32 predicting each token of text after prompt, in one forward."""
    ids = torch.tensor([prompt + text[:-1]])
    return model(ids)[0, len(prompt) - 1:].float()


def first_difference(tokens: list[int], reference: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def measure_pair(target_dir: Path, draft_dir: Path, formats: list[str], prompts: int, n: int,
                 gamma: int = 4) -> list[dict]:
    """One row per format, as in the module's docstring. Each format's greedy text is read by float32
    afterwards in one forward per prompt: float32's greedy text equals it up to the first position
    where float32's argmax on the same prefix differs, so no float32 decoding is needed."""
    vocab = load_gpt2(target_dir).config.vocab_size
    prompt_ids = [random_prompt(PROMPT_TOKENS, seed, vocab) for seed in range(prompts)]
    rows, texts = [], {}  # texts: format -> [(its greedy tokens, its logits along them)] per prompt
    for fmt in formats:
        target, draft = load(target_dir, fmt), load(draft_dir, fmt)
        runs, parted = [], 0
        for i, p in enumerate(prompt_ids):  # each prompt's figures said as it ends (a long run can be cut)
            runs.append(greedy_run(target, p, n))
            parted += speculative_sampling_greedy(target, draft, p, n, gamma=gamma).tokens != runs[-1]["tokens"]
            print(f"  {fmt}: prompt {i + 1} of {len(prompt_ids)}: {sum(r['ties'] for r in runs)} exact ties in "
                  f"{sum(len(r['tokens']) for r in runs)} steps so far; speculative parted from plain greedy on "
                  f"{parted} of {i + 1} prompts", flush=True)
        texts[fmt] = [(r["tokens"], teacher_forced_logits(target, p, r["tokens"])) for p, r in zip(prompt_ids, runs)]
        del target, draft
        steps = sum(len(r["tokens"]) for r in runs)
        rows.append({"format": fmt, "steps": steps, "ties_per_1k": 1000 * sum(r["ties"] for r in runs) / steps,
                     "ties": sum(r["ties"] for r in runs), "parted": parted, "parted_per_1k": 1000 * parted / steps,
                     "prompts": prompts, "step_ms": 1000 * statistics.median(s for r in runs for s in r["step_s"])})
    reference = load(target_dir, "float32")
    for row in rows:
        same, kls = [], []
        for p, (tokens, format_logits) in zip(prompt_ids, texts[row["format"]]):
            float32_logits = teacher_forced_logits(reference, p, tokens)
            same.append(first_difference(tokens, float32_logits.argmax(-1).tolist()))
            kls.append(kernels.fidelity(float32_logits, format_logits)["kl"])
        row |= {"same_mean": statistics.mean(same), "same_min": min(same), "kl": statistics.mean(kls)}
        print(format_row(row), flush=True)
    return rows


HEADER = ("| format | greedy steps | exact top-2 ties (per 1k steps) | tokens equal to float32's (mean, least) "
          "| KL to float32 (nats) | spec != plain (prompts; per 1k tokens) | step ms (median) |\n"
          "|---|---:|---:|---:|---:|---:|---:|")


def format_row(r: dict) -> str:
    return (f"| {r['format']} | {r['steps']} | {r['ties']} ({r['ties_per_1k']:.1f}) | {r['same_mean']:.0f}, "
            f"{r['same_min']} | {r['kl']:.2g} | {r['parted']} of {r['prompts']} ({r['parted_per_1k']:.1f}) | "
            f"{r['step_ms']:.1f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", nargs=2, type=Path, metavar=("TARGET", "DRAFT"),
                        help="checkpoint folders of a target and its draft (offline.random_weights --draft-layers, "
                             "or offline.train_pair)")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS),
                        help="formats to decode in (float32 reads each one's text as the reference)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200, help="greedy tokens per prompt")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a tiny random pair in a temporary folder, 2 prompts x 8 tokens")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        import tempfile
        from offline.random_weights import SIZES, save_agreeing_pair
        folder = Path(tempfile.mkdtemp())
        save_agreeing_pair(folder / "target", folder / "draft", SIZES["tiny"], 2)
        args.pair, args.prompts, args.tokens = (folder / "target", folder / "draft"), 2, 8
    if args.pair is None:
        parser.error("give --pair TARGET DRAFT (or --quick)")
    for folder in args.pair:
        if not (folder / "model.safetensors").is_file():
            parser.error(f"{folder} holds no model.safetensors: make one with python -m offline.random_weights "
                         f"--size gpt2-large --draft-layers 4 --out FOLDER (or offline.train_pair)")
    print(f"{args.pair[0]} with draft {args.pair[1]}: {args.prompts} prompts x {args.tokens} greedy tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n{HEADER}", flush=True)
    measure_pair(args.pair[0], args.pair[1], args.formats, args.prompts, args.tokens)


if __name__ == "__main__":
    main()
