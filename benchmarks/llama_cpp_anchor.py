"""Our decoding beside llama.cpp's, built on the same host: plain and speculative, and the bandwidth floor.

    python -m benchmarks.llama_cpp_anchor --llama-cpp /path/to/llama.cpp --out runs/llama_cpp_anchor
    LLAMA_CPP_DIR=/path/to/llama.cpp python -m benchmarks.llama_cpp_anchor --formats auto fp32 bf16

--llama-cpp (or the environment variable LLAMA_CPP_DIR) is llama.cpp's source folder, holding
convert_hf_to_gguf.py and the built binaries in build/bin (or the binaries' folder itself, the
converter beside or above it). How to build it from the llama-cpp-python source distribution:
docs/performance.md, "llama.cpp on the same host". Without the binaries the script says so in one
line and exits 0.

The pair: a gpt2-large-shaped random-weight target and a draft made of its first --draft-layers
blocks (benchmarks.common.standin_pair), and the trained pair too if --trained-pair holds one
(python -m offline.train_pair). Each checkpoint is converted to GGUF once (f16 and q8_0, by
llama.cpp's own converter, from a folder written here: write_converter_input) and cached beside it.

One run interleaves everything, round after round, the order rotated each round, so that the
noise of a shared machine hits both implementations alike; medians are reported:
- ours, per --formats (load_gpt2 formats, benchmarks.weight_formats.FORMATS): one decoding step
  and one verification of 5 tokens with --context cached positions (target forwards), then
  greedy plain decoding (autoregressive_generate) and greedy speculative decoding
  (speculative_sampling_greedy, gamma --gamma) of --new-tokens tokens after the same prompt;
- llama.cpp, per GGUF type: llama-bench (tg: one step at depth --context; pp5: verifying 5 tokens
  there), llama-completion (plain greedy decoding) and llama-speculative-simple (the same draft,
  at most --gamma tokens a round), the same prompt text, --threads threads, --new-tokens tokens.
Tokens per second count from the prompt to the last token for both (prompt evaluation included;
model loading excluded). Beside every step time: the bandwidth floor, the weight bytes one step
must read over the read bandwidth measured here (x.sum() over 1 GiB, best of several).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2 import encode
from gpt2.speed import load_accelerated
from gpt2.tokenizer import TOKENIZER_FILES
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

from .common import (BYTES_PER_GB, DEFAULT_CHECKPOINTS, add_output_options, has_checkpoint, machine_info,
                     markdown_table, median, standin_pair, timed, write_results)
from .weight_formats import FORMATS, fast_kernels, format_bytes, forward_seconds

BUILD_HINT = ("build llama.cpp as docs/performance.md says ('llama.cpp on the same host'), then pass "
              "--llama-cpp DIR or set LLAMA_CPP_DIR")
BINARIES = {"completion": ("llama-completion", "llama-cli"), "speculative": ("llama-speculative-simple",),
            "bench": ("llama-bench",)}
CONVERTER = "convert_hf_to_gguf.py"
GGUF_TYPES = ("f16", "q8_0")  # what the converter writes: 16-bit weights, and 8-bit blocks (34 bytes per 32)
COMPILE = {"off": False, "on": True, "fused": "fused", "auto": "auto"}  # --compile -> load_accelerated(compile=...)
# The causal-mask buffers the hub's GPT-2 files carry (h.N.attn.bias): not weights, and the
# converter of llama-cpp-python 0.3.36 fails on them ("Can not map tensor"), so they are left out.
MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.(masked_)?bias$")


# ---------------------------------------------------------------------------------------------
# Finding llama.cpp
# ---------------------------------------------------------------------------------------------

@dataclass
class LlamaCpp:
    """Paths of the llama.cpp programs this benchmark runs."""
    completion: Path
    speculative: Path
    bench: Path
    converter: Path


def find_llama_cpp(root) -> tuple[LlamaCpp | None, str]:
    """(the programs, "") if root (llama.cpp's source folder or its binaries' folder) has them all,
    else (None, one line saying what is missing and how to build it)."""
    if not root:
        return None, f"skipped: no llama.cpp given; {BUILD_HINT}"
    root = Path(root).expanduser()
    bin_dirs = [root / "build" / "bin", root / "bin", root]
    found, missing = {}, []
    for role, names in BINARIES.items():
        path = next((d / n for n in names for d in bin_dirs if (d / n).is_file() and os.access(d / n, os.X_OK)), None)
        if path is None:
            missing.append(names[0])
        found[role] = path
    converter = next((d / CONVERTER for d in [root, *root.parents][:4] if (d / CONVERTER).is_file()), None)
    if converter is None:
        missing.append(CONVERTER)
    if missing:
        return None, f"skipped: {', '.join(missing)} not found in {root}; {BUILD_HINT}"
    return LlamaCpp(converter=converter, **found), ""


# ---------------------------------------------------------------------------------------------
# Converting a checkpoint to GGUF
# ---------------------------------------------------------------------------------------------

def write_converter_input(checkpoint: Path, folder: Path) -> Path:
    """The Hugging Face folder llama.cpp's converter reads, made from one of our checkpoints:
    config.json as is, model.safetensors without the mask buffers, and the tokenizer as
    vocab.json + merges.txt (OpenAI's encoder.json and vocab.bpe under the names HF gives them)."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(checkpoint) / "config.json", folder / "config.json")
    tensors = load_file(str(Path(checkpoint) / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not MASK_BUFFER.match(k)}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    shutil.copyfile(TOKENIZER_FILES / "encoder.json", folder / "vocab.json")
    shutil.copyfile(TOKENIZER_FILES / "vocab.bpe", folder / "merges.txt")
    return folder


def convert_to_gguf(llama: LlamaCpp, checkpoint: Path, gguf_type: str) -> Path:
    """checkpoint/llama.cpp/model-<type>.gguf, converted once (again if the checkpoint is newer)."""
    checkpoint = Path(checkpoint)
    out, hf_folder = checkpoint / "llama.cpp" / f"model-{gguf_type}.gguf", checkpoint / "llama.cpp" / "hf"
    if not stale(out, checkpoint):
        return out
    if stale(hf_folder / "merges.txt", checkpoint):  # written last
        write_converter_input(checkpoint, hf_folder)
    print(f"  converting {checkpoint} to {out.name} ...", flush=True)
    run = subprocess.run([sys.executable, str(llama.converter), str(hf_folder), "--outtype", gguf_type,
                          "--outfile", str(out)], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{llama.converter} failed on {hf_folder}:\n{run.stderr[-2000:]}")
    return out


def stale(path: Path, checkpoint: Path) -> bool:
    """True if path must be (re)made: it is missing, or older than the checkpoint's weights."""
    return not path.is_file() or path.stat().st_mtime < (checkpoint / "model.safetensors").stat().st_mtime


def gguf_tensors(path: Path) -> list[tuple[str, int, int]]:
    """(name, bytes, rows) of every tensor in a GGUF file, read with llama.cpp's gguf package."""
    from gguf import GGUFReader

    # GGUF lists a tensor's dimensions innermost first: a [rows, row_length] matrix is (row_length, rows)
    return [(t.name, int(t.n_bytes), int(t.shape[-1]) if len(t.shape) > 1 else 1)
            for t in GGUFReader(str(path)).tensors]


def gguf_step_bytes(tensors: list[tuple[str, int, int]]) -> int:
    """Bytes of weights one decoding step reads from a GGUF GPT-2: every tensor once, except the
    embeddings, of which one row is read: the position embedding always, the token embedding
    only when a separate output.weight is the head (GPT-2 ties them: then the head reads it all)."""
    names = {name for name, _, _ in tensors}
    row_only = {"position_embd.weight"} | ({"token_embd.weight"} if "output.weight" in names else set())
    return sum(n_bytes // rows if name in row_only else n_bytes for name, n_bytes, rows in tensors)


def floor_seconds(weight_bytes: int, gb_per_s: float) -> float:
    """The bandwidth floor of a step: its weight bytes over the memory read bandwidth."""
    return weight_bytes / (gb_per_s * BYTES_PER_GB)


# ---------------------------------------------------------------------------------------------
# Reading llama.cpp's timings
# ---------------------------------------------------------------------------------------------

NUMBER = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|nan|inf)"
PROMPT_EVAL = re.compile(rf"prompt eval time\s*=\s*{NUMBER}\s*ms\s*/\s*(\d+)\s*tokens")
EVAL = re.compile(rf"(?<!prompt )eval time\s*=\s*{NUMBER}\s*ms\s*/\s*(\d+)\s*runs\s*\(\s*{NUMBER}\s*ms per token,"
                  rf"\s*{NUMBER}\s*tokens per second\)")
ENCODED = re.compile(rf"encoded\s+(\d+)\s+tokens in\s+{NUMBER}\s+seconds")
DECODED = re.compile(rf"decoded\s+(\d+)\s+tokens in\s+{NUMBER}\s+seconds")
COUNTS = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s+=\s*(\d+)\s*$", re.M)


class TimingsNotFound(RuntimeError):
    """llama.cpp's output lacks the timing lines: it failed, or a newer version words them otherwise."""


def last_match(pattern: re.Pattern, text: str, what: str):
    matches = pattern.findall(text)
    if not matches:
        raise TimingsNotFound(f"no '{what}' line in llama.cpp's output; its last lines:\n{text[-1500:]}")
    return matches[-1]  # the context's own line comes last (llama_perf_context_print)


def parse_completion_timings(text: str) -> dict:
    """llama-completion's perf lines -> prompt tokens, generated-token evaluations and their ms."""
    prompt_ms, prompt_tokens = last_match(PROMPT_EVAL, text, "prompt eval time")
    eval_ms, runs, ms_per_token, _ = last_match(EVAL, text, "eval time")
    return {"prompt_ms": float(prompt_ms), "prompt_tokens": int(prompt_tokens), "eval_ms": float(eval_ms),
            "eval_runs": int(runs), "ms_per_token": float(ms_per_token)}


def parse_speculative_timings(text: str) -> dict:
    """llama-speculative-simple's summary -> tokens and seconds of the prompt and of the decoding,
    and its draft counts."""
    prompt_tokens, encode_s = last_match(ENCODED, text, "encoded ... tokens in")
    generated, decode_s = last_match(DECODED, text, "decoded ... tokens in")
    counts = {k: int(v) for k, v in COUNTS.findall(text)}
    return {"prompt_tokens": int(prompt_tokens), "encode_s": float(encode_s), "generated": int(generated),
            "decode_s": float(decode_s), **counts}


def parse_bench_json(text: str, context: int) -> dict:
    """llama-bench -o json -> seconds of one step (tg) and of verifying n tokens (pp n), at depth context."""
    start = text.find("[")
    if start < 0:
        raise TimingsNotFound(f"no JSON in llama-bench's output; its last lines:\n{text[-1500:]}")
    rows = json.loads(text[start:text.rindex("]") + 1])
    out = {}
    for row in rows:
        if row.get("n_depth", 0) != context:
            continue
        if row["n_gen"] > 0 and row["n_prompt"] == 0:
            out["step_s"] = row["avg_ns"] / 1e9 / row["n_gen"]
        elif row["n_prompt"] > 0 and row["n_gen"] == 0:
            out[f"verify{row['n_prompt']}_s"] = row["avg_ns"] / 1e9
    if "step_s" not in out:
        raise TimingsNotFound(f"llama-bench gave no token-generation result at depth {context}:\n{text[-1500:]}")
    return out


# ---------------------------------------------------------------------------------------------
# Running both
# ---------------------------------------------------------------------------------------------

def run_llama(args_list: list[str]) -> tuple[str, str]:
    """Run one llama.cpp program: (stdout, the generated text; stdout + stderr, where the timings are)."""
    run = subprocess.run(args_list, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(args_list)} exited with {run.returncode}:\n{run.stderr[-2000:]}")
    return run.stdout, run.stdout + "\n" + run.stderr


# q8_0's repacked CPU kernels (the default) crash this version on batches of several tokens
# (a segfault in llama-bench pp5 and in any prompt; found on an Intel Xeon with AMX), so q8_0
# runs unrepacked: the plain q8_0 dot products.
NO_REPACK = {"q8_0": True}


def llama_round(llama: LlamaCpp, target_gguf: Path, draft_gguf: Path, gguf_type: str, prompt: str, settings) -> dict:
    """One round of llama.cpp: llama-bench's step and verify(5), then plain and speculative decoding."""
    t = str(settings.threads)
    no_repack = NO_REPACK.get(gguf_type, False)
    common = ["-t", t, "-c", str(settings.ctx_size), "--temp", "0", "--seed", "0", "--ignore-eos",
              "-n", str(settings.new_tokens), "-p", prompt, *(["--no-repack"] if no_repack else [])]
    bench = parse_bench_json(run_llama([str(llama.bench), "-m", str(target_gguf), "-t", t, "-p", "5",
                                        "-n", "16", "-d", str(settings.context), "-r", "1", "-o", "json",
                                        "--repack", "0" if no_repack else "1"])[0],
                             settings.context)
    plain_out = run_llama([str(llama.completion), "-m", str(target_gguf), "-no-cnv", "--no-display-prompt",
                           *common])
    plain = parse_completion_timings(plain_out[1])
    spec_out = run_llama([str(llama.speculative), "-m", str(target_gguf), "-md", str(draft_gguf), "-td", t,
                          "--spec-type", "draft-simple", "--spec-draft-n-max", str(settings.gamma), "--spec-draft-n-min", "0", *common])
    spec = parse_speculative_timings(spec_out[1])
    plain_s = (plain["prompt_ms"] + plain["eval_ms"]) / 1e3
    return {"step_s": bench["step_s"], "verify5_s": bench.get("verify5_s"),
            "plain_tok_s": settings.new_tokens / plain_s, "plain": plain, "text": plain_out[0],
            "spec_tok_s": spec["generated"] / (spec["encode_s"] + spec["decode_s"]), "spec": spec}


def ours_round(target, draft, fmt: str, prompt_ids: list[int], settings) -> dict:
    """One round of ours: a step and verify(5) at settings.context cached positions, then plain and
    speculative greedy decoding."""
    with fast_kernels(not fmt.endswith("-plain")):
        cache = target.new_kv_cache(max_len=settings.context + 8)
        context = (prompt_ids * (settings.context // len(prompt_ids) + 1))[:settings.context]
        draft_cache = draft.new_kv_cache(max_len=settings.context + 8)
        for rows in (1, 5):  # untimed: a compiled model compiles each shape on its first call
            forward_seconds(target, cache, 0, prompt_ids[:rows])
            forward_seconds(draft, draft_cache, 0, prompt_ids[:rows])
        with torch.inference_mode():
            target(torch.tensor([context]), cache, 1)
        steps = [forward_seconds(target, cache, settings.context, prompt_ids[:1]) for _ in range(settings.steps)]
        verifies = [forward_seconds(target, cache, settings.context, prompt_ids[:5]) for _ in range(settings.steps)]
        del cache, draft_cache
        plain, plain_s = timed(None, autoregressive_generate, target, prompt_ids, settings.new_tokens)
        spec, spec_s = timed(None, speculative_sampling_greedy, target, draft, prompt_ids, settings.new_tokens,
                             settings.gamma)
    return {"step_s": median(steps), "verify5_s": median(verifies), "plain_tok_s": settings.new_tokens / plain_s,
            "spec_tok_s": settings.new_tokens / spec_s, "alpha": spec.stats.alpha,
            "tokens_per_target_call": spec.stats.tokens_per_target_call, "tokens": plain.tokens,
            "spec_equals_plain": spec.tokens == plain.tokens}


def measure_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Memory read bandwidth in GB/s: the best of several x.sum() over a buffer far larger than
    any cache, with torch's threads as set (the benchmark's --threads)."""
    x = torch.ones(int(gib * 2**30) // 4)
    x.sum()  # touch every page once
    best = min(timed(None, x.sum)[1] for _ in range(repeats))
    return x.numel() * 4 / best / BYTES_PER_GB


def agreeing_tokens(ours: list[int], llama_text: str) -> int:
    """How many of our greedy tokens llama.cpp's greedy text starts with (re-encoded with our
    tokenizer; what it prints after the text, if anything, lies past the tokens compared)."""
    theirs = encode(llama_text) if llama_text else []
    return next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))


@dataclass
class Pair:
    name: str
    target: Path
    draft: Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR"),
                   help="llama.cpp's source folder (with build/bin) or its binaries' folder (default: $LLAMA_CPP_DIR)")
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    p.add_argument("--target-model", default="gpt2-large")
    p.add_argument("--draft-layers", type=int, default=6)
    p.add_argument("--trained-pair", type=Path, default=Path("runs/trained_pair"),
                   help="also this pair (target/, draft/) if it exists (python -m offline.train_pair)")
    p.add_argument("--formats", nargs="+", default=["auto", "fp32", "bf16"], choices=list(FORMATS),
                   help="our formats (benchmarks.weight_formats.FORMATS)")
    p.add_argument("--compile", nargs="+", default=["off"], choices=list(COMPILE),
                   help="our decode path: eager (off), compiled (on: gpt2.speed.compiled), every block in one "
                        "call to C (fused: gpt2.speed.native_step), or the faster of eager and fused (or compiled) "
                        "measured here (auto); several: each format runs with each")
    p.add_argument("--gguf-types", nargs="+", default=list(GGUF_TYPES), choices=GGUF_TYPES)
    p.add_argument("--prompt", default="The history of the printing press begins in the fifteenth century, when")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per round (llama.cpp: --spec-draft-n-max)")
    p.add_argument("--context", type=int, default=64, help="cached positions for the step and verify(5) timings")
    p.add_argument("--steps", type=int, default=8, help="our step / verify(5) timings per round (median)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians over them)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (page cache, first-call setup)")
    p.add_argument("--threads", type=int, default=2)
    add_output_options(p, "llama_cpp_anchor", "gpt2-shaped pair, 2-block draft, 16 tokens, 1 round")
    args = p.parse_args(argv)
    llama, why = find_llama_cpp(args.llama_cpp)
    if llama is None:
        print(why)
        return 0
    try:
        import gguf  # noqa: F401  (the converter's package; also reads the tensors' byte counts)
    except ImportError:
        print(f"skipped: the gguf package is not importable; pip install {llama.converter.parent / 'gguf-py'}")
        return 0
    if args.quick:
        args.target_model, args.draft_layers, args.new_tokens, args.repeats, args.steps = "gpt2", 2, 16, 1, 3
    args.ctx_size = max(256, args.context + args.new_tokens + 64)
    torch.set_num_threads(args.threads)

    pairs = [Pair(f"{args.target_model}-shaped stand-in, {args.draft_layers}-block draft",
                  *standin_pair(args.checkpoints, args.target_model, args.draft_layers, damping=0.04,
                                embedding_std=0.1))]
    if has_checkpoint(args.trained_pair / "target") and has_checkpoint(args.trained_pair / "draft"):
        pairs.append(Pair(f"trained pair ({args.trained_pair})", args.trained_pair / "target",
                          args.trained_pair / "draft"))
    prompt_ids = encode(args.prompt)
    results = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()},
               "prompt_tokens": prompt_ids, "bandwidth_gb_s": [], "pairs": {}}
    results["bandwidth_gb_s"].append(measure_bandwidth())
    md = []
    for pair in pairs:
        print(f"\n{pair.name}", flush=True)
        ggufs = {t: (convert_to_gguf(llama, pair.target, t), convert_to_gguf(llama, pair.draft, t))
                 for t in args.gguf_types}
        models = {}  # "ours <format>[ compile=on|auto]" -> (target, draft, format)
        for fmt in args.formats:
            auto = models.get("ours auto")
            if fmt == "bf16" and auto and auto[0].wpe.weight.dtype == torch.bfloat16 \
                    and getattr(auto[0], "quantize", None) is None:
                print("  bf16: what auto picked, not run twice", flush=True)
                continue
            for compile_choice in args.compile:
                name = f"ours {fmt}" + ("" if compile_choice == "off" else f" compile={compile_choice}")
                print(f"  loading our {fmt} pair{'' if compile_choice == 'off' else ', compile=' + compile_choice} ...",
                      flush=True)
                kwargs = {**FORMATS[fmt], "compile": COMPILE[compile_choice]}
                models[name] = (load_accelerated(pair.target, **kwargs), load_accelerated(pair.draft, **kwargs), fmt)
        jobs = {name: (lambda name=name: ours_round(*models[name], prompt_ids, args)) for name in models}
        jobs |= {f"llama.cpp {t}": (lambda t=t: llama_round(llama, *ggufs[t], t, args.prompt, args)) for t in ggufs}
        runs = {name: [] for name in jobs}
        names = list(jobs)
        for r in range(args.warmup + args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                out = jobs[name]()
                if r >= args.warmup:
                    runs[name].append(out)
                print(f"  round {r + 1}/{args.warmup + args.repeats}{' (warm-up)' if r < args.warmup else ''} {name}: step {out['step_s'] * 1e3:.1f} ms, plain "
                      f"{out['plain_tok_s']:.2f} tok/s, speculative {out['spec_tok_s']:.2f} tok/s", flush=True)
            results["bandwidth_gb_s"].append(measure_bandwidth())
        step_bytes = {name: format_bytes(target, fmt) for name, (target, _, fmt) in models.items()}
        step_bytes |= {f"llama.cpp {t}": gguf_step_bytes(gguf_tensors(ggufs[t][0])) for t in ggufs}
        summary = summarize(runs, step_bytes, max(results["bandwidth_gb_s"]), models)
        results["pairs"][pair.name] = {"summary": summary, "runs": strip_text(runs)}
        md.append(pair_markdown(pair.name, summary, args, max(results["bandwidth_gb_s"])))
        del models
    text = "\n\n".join(md) + "\n"
    print("\n" + text)
    write_results(args.out, results, text)
    return 0


def summarize(runs: dict, step_bytes: dict, gb_per_s: float, models: dict) -> dict:
    """Medians per implementation/format, the floor beside the step, and llama.cpp's greedy agreement."""
    out = {}
    for name, rounds in runs.items():
        m = {k: median([r[k] for r in rounds if r.get(k) is not None])
             for k in ("step_s", "verify5_s", "plain_tok_s", "spec_tok_s")}
        m["weight_bytes"] = step_bytes[name]
        m["floor_s"] = floor_seconds(step_bytes[name], gb_per_s)
        if name.startswith("ours"):
            m["alpha"] = median([r["alpha"] for r in rounds if r["alpha"] is not None])
            m["tokens_per_target_call"] = median([r["tokens_per_target_call"] for r in rounds])
            m["spec_equals_plain"] = all(r["spec_equals_plain"] for r in rounds)
            target = models[name][0]
            m["dtype"] = str(target.wpe.weight.dtype).removeprefix("torch.") + (
                f", {target.quantize} weights" if getattr(target, "quantize", None) else "")
        else:
            spec = rounds[-1]["spec"]
            m["acceptance"] = spec["n_accept"] / spec["n_drafted"] if spec.get("n_drafted") else None
            m["prompt_tokens"] = rounds[-1]["plain"]["prompt_tokens"]
        out[name] = m
    ours_tokens = next((r[0]["tokens"] for n, r in runs.items() if n.startswith("ours")), None)
    for name, rounds in runs.items():
        if name.startswith("llama.cpp") and ours_tokens is not None:
            out[name]["agreeing_tokens"] = agreeing_tokens(ours_tokens, rounds[-1]["text"])
    return out


def strip_text(runs: dict) -> dict:
    """The rounds without llama.cpp's full output and our token lists (results.json stays small)."""
    return {n: [{k: v for k, v in r.items() if k not in ("text", "tokens")} for r in rs]
            for n, rs in runs.items()}


GOALS = (">= 0.7 of the bandwidth floor (floor / step)", "verify(5) <= 1.3 steps",
         "plain decoding >= 1.2x llama.cpp q8_0's", "speculative >= 1.5x llama.cpp's best speculative tokens/s")


def goal_lines(summary: dict, ours: str) -> list[str]:
    """The four speed goals for our format `ours`, each reached or not (or not measured: no llama.cpp
    run to compare with); [] when `ours` did not run."""
    if ours not in summary:
        return []
    o = summary[ours]
    q8 = summary.get("llama.cpp q8_0")
    llama = {name: m for name, m in summary.items() if name.startswith("llama.cpp")}
    best = max(llama, key=lambda name: llama[name]["spec_tok_s"]) if llama else None
    checks = [(o["floor_s"] >= 0.7 * o["step_s"],
               f"floor {o['floor_s'] * 1e3:.1f} ms / step {o['step_s'] * 1e3:.1f} ms = {o['floor_s'] / o['step_s']:.2f}"),
              (o["verify5_s"] <= 1.3 * o["step_s"], f"{o['verify5_s'] / o['step_s']:.2f} steps"),
              None if q8 is None else (o["plain_tok_s"] >= 1.2 * q8["plain_tok_s"],
                                       f"{o['plain_tok_s']:.2f} against {q8['plain_tok_s']:.2f} tok/s: "
                                       f"{o['plain_tok_s'] / q8['plain_tok_s']:.2f}x"),
              None if best is None else (o["spec_tok_s"] >= 1.5 * llama[best]["spec_tok_s"],
                                         f"{o['spec_tok_s']:.2f} against {best}'s {llama[best]['spec_tok_s']:.2f} "
                                         f"tok/s: {o['spec_tok_s'] / llama[best]['spec_tok_s']:.2f}x")]
    return [f"- {goal}: " + ("**not measured** (no llama.cpp run to compare with)" if check is None else
                             f"**{'reached' if check[0] else 'not reached'}** ({check[1]})")
            for goal, check in zip(GOALS, checks)]


def pair_markdown(pair: str, summary: dict, args, gb_per_s: float) -> str:
    rows = []
    for name, m in summary.items():
        acceptance = m.get("alpha") if name.startswith("ours") else m.get("acceptance")
        rows.append([name + (f" ({m['dtype']})" if "dtype" in m else ""), f"{m['step_s'] * 1e3:.1f}",
                     f"{m['floor_s'] * 1e3:.1f} ({m['weight_bytes'] / 1e9:.2f} GB)",
                     f"{m['floor_s'] / m['step_s']:.2f}",
                     "-" if m["verify5_s"] != m["verify5_s"] else f"{m['verify5_s'] / m['step_s']:.2f}",
                     f"{m['plain_tok_s']:.2f}", f"{m['spec_tok_s']:.2f}", f"{m['spec_tok_s'] / m['plain_tok_s']:.2f}",
                     "-" if acceptance is None else f"{acceptance:.2f}",
                     m.get("agreeing_tokens", "-")])
    table = markdown_table(["implementation (format)", "step ms", "floor ms (bytes)", "floor / step",
                            "verify(5) / step", "plain tok/s", f"speculative tok/s (gamma {args.gamma})",
                            "spec / plain", "acceptance", f"greedy tokens equal to ours (of {args.new_tokens})"], rows)
    first = f"ours {args.formats[0]}"  # the format whose goals are judged, eager and compiled
    goals = {name: goal_lines(summary, name) for name in summary if name == first or name.startswith(first + " ")}
    return (f"**{pair}**: {args.threads} threads, prompt of {len(encode(args.prompt))} tokens, "
            f"{args.new_tokens} greedy tokens, step and verify(5) at {args.context} cached positions, "
            f"medians of {args.repeats} interleaved rounds; read bandwidth {gb_per_s:.1f} GB/s "
            f"(x.sum() over 1 GiB, best).\n\n{table}\n\n"
            f"Acceptance: ours is alpha, llama.cpp's n_accept / n_drafted. A random-weight stand-in's draft "
            f"agrees with its target almost always, far more than a real pair's would: its speculative "
            f"speed-ups are an upper bound, not real-model behaviour."
            + "".join(f"\n\nGoals, {name}:\n" + "\n".join(lines)
                      for name, lines in goals.items() if lines))


if __name__ == "__main__":
    sys.exit(main())
