"""How fast is our GPT-2 at batch-1 decoding on this CPU, and how much memory does loading take?

    python -m benchmarks.model_speed --models gpt2 gpt2-large --out runs/model_speed
    python -m benchmarks.model_speed --quick          # a fast smoke run (gpt2 only, few tokens)
    python -m benchmarks.model_speed --models --out runs/model_memory   # load time / memory only
    python -m benchmarks.model_speed --models --memory-models --dtypes float32 bfloat16 float16 \
        --out runs/dtype_speed                        # per-dtype step and verification only

For each model (a random-weight stand-in of the official shape, hub layout, under
checkpoints/standins/<name>; timings do not depend on the weight values) it measures:

1. Greedy decoding tokens/s, batch 1, fp32, CPU, same prompt and number of new tokens, for
     - ours:             spec_decoding.autoregressive_generate (linears through oneDNN, the default)
     - ours, MKL:        the same with gpt2.speed.kernels.ENABLED = False (the plain face: F.linear -> MKL)
     - HF transformers:  GPT2LMHeadModel.from_pretrained(same folder).generate(do_sample=False)
   after a warm-up, repeats interleaved (ours, MKL, HF, ours, ...) so that machine noise hits
   all alike; medians. It checks that ours and HF produce the same tokens.
2. The memory-bandwidth bound: a decoding step must read every weight once, so
   tokens/s <= read bandwidth / weight bytes. It times one decoding step (KV cache warm), turns it
   into GB/s of weights read, and compares with the read bandwidth measured here (x.sum() over
   1 GiB).
3. Load time and peak memory (gpt2-large by default): our load_accelerated(folder, dtype="float32") vs transformers'
   from_pretrained(folder), each in a fresh subprocess, page cache warm, peak RSS (VmHWM) minus
   the RSS after the imports; medians. Plus a variant of our loader that reads the file with plain reads
   instead of a memory map, to show where our peak comes from.

4. With --dtypes: one decoding step and one 5-token verification (the target's work per round of
   speculative decoding at gamma 4) on a warm cache, per dtype, of --dtype-model (gpt2-large by
   default); one model, cast from dtype to dtype, the dtypes taking turns round after round, so
   a busy machine slows them alike.
   This is what gpt2.speed.device.auto_dtype's choice and its "slower here" note rest on.

Writes <out>/results.json and <out>/results.md and prints the table.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import gpt2.speed.kernels
from gpt2 import OFFICIAL_CONFIGS
from gpt2.speed import load_accelerated
from spec_decoding import autoregressive_generate

from .common import (BYTES_PER_GB, DEFAULT_CHECKPOINTS, add_output_options, machine_info, markdown_table,
                     measure_read_bandwidth, median, random_prompt, standin_checkpoint, timed,
                     transformers_missing, weight_bytes_per_token, write_results)

DEFAULT_NEW_TOKENS = {"gpt2": 128, "gpt2-medium": 96, "gpt2-large": 64, "gpt2-xl": 32}
REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# 1. Decoding speed
# ---------------------------------------------------------------------------------------------

def ours_generate(model, prompt, new_tokens, onednn=True):
    gpt2.speed.kernels.ENABLED = onednn  # read at call time by the attached kernels (False: plain F.linear)
    try:
        return autoregressive_generate(model, prompt, new_tokens).tokens
    finally:
        gpt2.speed.kernels.ENABLED = True


def hf_generate(hf_model, prompt, new_tokens):
    ids = torch.tensor([prompt])
    out = hf_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=50256)
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def decode_step_seconds(model, prompt, context_len, steps):
    """Median time of one single-token forward with the KV cache holding context_len positions,
    {"onednn": s, "mkl": s}; the two routings alternate step by step so noise hits both alike."""
    cache = model.new_kv_cache(max_len=context_len + 1)
    ids = (prompt * (context_len // len(prompt) + 1))[:context_len]
    model(torch.tensor([ids]), cache)
    one = torch.tensor([[ids[-1]]])
    times = {"onednn": [], "mkl": []}
    try:
        for i in range(steps + 2):
            for mode in times:
                gpt2.speed.kernels.ENABLED = mode == "onednn"
                _, seconds = timed(None, model, one, cache)
                cache.truncate(context_len)
                if i >= 2:  # the first two rounds are warm-up
                    times[mode].append(seconds)
    finally:
        gpt2.speed.kernels.ENABLED = True
    return {mode: median(t) for mode, t in times.items()}


def bench_decoding(name, folder, args, bandwidth):
    from transformers import GPT2LMHeadModel

    new_tokens = args.new_tokens or DEFAULT_NEW_TOKENS[name]
    if args.quick:
        new_tokens = min(new_tokens, 16)
    prompt = random_prompt(args.prompt_len, seed=0)

    print(f"  loading ours and transformers' {name} ...", flush=True)
    ours = load_accelerated(folder, dtype="float32")  # as transformers runs it
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    runners = {
        "ours (oneDNN)": lambda: ours_generate(ours, prompt, new_tokens, onednn=True),
        "ours (MKL, GPT2_ONEDNN=0)": lambda: ours_generate(ours, prompt, new_tokens, onednn=False),
        "HF transformers": lambda: hf_generate(hf, prompt, new_tokens),
    }
    print("  warm-up ...", flush=True)
    for run in runners.values():
        run()

    times = {k: [] for k in runners}
    tokens = {}
    keys = list(runners)
    bar = tqdm(total=args.repeats * len(keys), desc=f"  {name} decoding", leave=False)
    for r in range(args.repeats):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotate the order each repeat
            tokens[k], seconds = timed(None, runners[k])
            times[k].append(seconds)
            bar.update()
    bar.close()

    context = args.prompt_len + new_tokens // 2
    print(f"  one decoding step at context {context} ...", flush=True)
    step = decode_step_seconds(ours, prompt, context, args.steps)
    step_onednn, step_mkl = step["onednn"], step["mkl"]

    weight_bytes = weight_bytes_per_token(ours)
    rows = {}
    for k in keys:
        t = median(times[k])
        rows[k] = {"seconds_median": t, "seconds_all": times[k], "tokens_per_s": new_tokens / t,
                   "weights_gb_per_s": weight_bytes * new_tokens / t / BYTES_PER_GB}
    result = {
        "model": name, "folder": str(folder), "parameters": ours.num_parameters(),
        "weight_bytes_per_token": weight_bytes, "prompt_len": args.prompt_len,
        "new_tokens": new_tokens, "repeats": args.repeats, "runs": rows,
        "same_tokens_ours_vs_hf": tokens["ours (oneDNN)"] == tokens["HF transformers"],
        "same_tokens_onednn_vs_mkl": tokens["ours (oneDNN)"] == tokens["ours (MKL, GPT2_ONEDNN=0)"],
        "first_mismatch_ours_vs_hf": next((i for i, (a, b) in enumerate(
            zip(tokens["ours (oneDNN)"], tokens["HF transformers"])) if a != b), None),
        "decode_step": {
            "context_len": context,
            "seconds_onednn": step_onednn, "seconds_mkl": step_mkl,
            "weights_gb_per_s_onednn": weight_bytes / step_onednn / BYTES_PER_GB,
            "weights_gb_per_s_mkl": weight_bytes / step_mkl / BYTES_PER_GB,
        },
        "bandwidth_ceiling_tokens_per_s": {
            "measured_read_bandwidth": bandwidth["gb_per_s_median"] * BYTES_PER_GB / weight_bytes,
            "issue_40_gb_per_s": 40 * BYTES_PER_GB / weight_bytes,
        },
    }
    del ours, hf
    return result


# ---------------------------------------------------------------------------------------------
# 4. Step and verification time per dtype
# ---------------------------------------------------------------------------------------------

def cast_parameters_(model, dtype):
    """Cast every parameter in place, one at a time: peak memory stays at one model plus one tensor
    (three copies of gpt2-large side by side would need 6 GB). Timing does not depend on the values."""
    for param in model.parameters():
        param.data = param.data.to(dtype)


@torch.inference_mode()
def bench_dtypes(name, folder, dtypes, context_len=64, verify_tokens=5, rounds=15):
    """Median seconds of one decoding step (1 new token) and one verification (verify_tokens new
    tokens) with context_len tokens in the KV cache (rolled back after each call), per dtype.

    One model is loaded and cast from dtype to dtype; every round visits each dtype (in a rotating
    order) and there fills a fresh cache, runs one untimed step and verification (kernel set-up),
    then the timed ones. So the dtypes take turns and a busy machine slows them alike."""
    print(f"  loading {name} ...", flush=True)
    model = load_accelerated(folder, dtype=dtypes[0])
    context = torch.tensor([random_prompt(context_len, seed=0)])
    new = {n: torch.tensor([random_prompt(n, seed=n)]) for n in (1, verify_tokens)}
    times = {(dtype, n): [] for dtype in dtypes for n in (1, verify_tokens)}
    for r in tqdm(range(rounds), desc=f"  {name} step/verify per dtype", leave=False):
        for dtype in dtypes[r % len(dtypes):] + dtypes[:r % len(dtypes)]:
            cast_parameters_(model, getattr(torch, dtype))
            cache = model.new_kv_cache(max_len=context_len + verify_tokens)
            model(context, cache, num_last_logits=1)
            for timed_run in (False, True):
                for n in (1, verify_tokens):
                    _, seconds = timed(None, model, new[n], cache, num_last_logits=n)
                    cache.truncate(context_len)
                    if timed_run:
                        times[(dtype, n)].append(seconds)
    base = median(times[(dtypes[0], 1)])
    rows = {}
    for dtype in dtypes:
        step, verify = median(times[(dtype, 1)]), median(times[(dtype, verify_tokens)])
        rows[dtype] = {"step_s": step, "verify_s": verify, "step_vs_first_step": step / base,
                       "verify_vs_first_step": verify / base, "verify_vs_own_step": verify / step,
                       "step_s_all": times[(dtype, 1)], "verify_s_all": times[(dtype, verify_tokens)]}
    return {"model": name, "folder": str(folder), "context_len": context_len,
            "verify_tokens": verify_tokens, "rounds": rounds, "threads": torch.get_num_threads(),
            "reference": dtypes[0], "dtypes": rows}


# ---------------------------------------------------------------------------------------------
# 3. Load time and peak memory, each in a fresh subprocess
# ---------------------------------------------------------------------------------------------

# Each snippet prints one JSON line: the resident set after the imports (VmRSS, the baseline) and
# the peak resident set after loading (VmHWM from /proc/self/status). The peak is not read as
# getrusage(RUSAGE_SELF).ru_maxrss: on Linux a child starts with the ru_maxrss of the process that
# spawned it (here this script, holding a model), so that reads the parent's peak. VmHWM belongs to
# the child's own address space; it is also given as ru_maxrss for reference. RssAnon/RssFile split
# what is resident after loading into private memory and mapped file pages.
_MEASURE = r"""
import json, resource, sys, time
{imports}
def status_kib(*keys):
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{k: int(fields[k].split()[0]) for k in keys}}
before = status_kib("VmRSS", "RssAnon", "RssFile")
base = before["VmRSS"]
start = time.perf_counter()
model = {load}
seconds = time.perf_counter() - start
peak = status_kib("VmHWM")["VmHWM"]
with torch.inference_mode():  # one forward pass touches every weight (lazily mapped ones too)
    model(torch.tensor([[0]]))
peak_forward = status_kib("VmHWM")["VmHWM"]
n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({{"seconds": seconds, "baseline_kib": base, "peak_kib": peak, "before_kib": before,
                  "peak_after_forward_kib": peak_forward,
                  "after_load_kib": status_kib("VmRSS", "RssAnon", "RssFile"), "param_bytes": n_bytes,
                  "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""

LOADERS = {
    "ours: load_gpt2(folder)": ("import torch\nfrom gpt2 import load_gpt2", "load_gpt2(sys.argv[1], dtype='float32')"),
    "HF: GPT2LMHeadModel.from_pretrained(folder)": (
        "import torch\nfrom transformers import GPT2LMHeadModel",
        "GPT2LMHeadModel.from_pretrained(sys.argv[1])"),
    "ours, plain reads instead of mmap (sketch of a fix)": (
        # (building a model on "meta" here imports torch._dynamo once, ~2 s; done before timing)
        "import numpy, torch\nfrom benchmarks.model_speed import load_gpt2_without_mmap\n"
        "from gpt2 import GPT2, GPT2Config\nwith torch.device('meta'): GPT2(GPT2Config(1, 1, 8, 8, 8))",
        "load_gpt2_without_mmap(sys.argv[1])"),
}


def load_gpt2_without_mmap(folder):
    """Our loader's result, built without a memory map: the safetensors header says where each
    tensor's bytes are; read them with plain file reads straight into the final tensor (through
    one temporary per [in, out] weight that needs transposing). Nothing of the file stays
    resident, so the peak is the weights plus the largest single tensor."""
    import struct

    from gpt2 import GPT2
    from gpt2.checkpoints import CONV1D_SUFFIXES, read_config

    folder = Path(folder)
    with open(folder / "model.safetensors", "rb", buffering=0) as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data_start = 8 + header_len
        with torch.device("meta"):
            model = GPT2(read_config(folder / "config.json"))
        state = {}
        for name, p in model.state_dict().items():
            begin, end = header[name]["data_offsets"]
            assert header[name]["dtype"] == "F32"
            state[name] = dst = torch.empty(p.shape, dtype=torch.float32)
            transposed = name.endswith(CONV1D_SUFFIXES)  # stored [in, out], wanted [out, in]
            # Allocated after dst, the temporary is freed from the top of the heap.
            buf = torch.empty(header[name]["shape"], dtype=torch.float32) if transposed else dst
            assert end - begin == buf.numel() * 4
            f.seek(data_start + begin)
            f.readinto(buf.numpy().reshape(-1).view("uint8"))
            if transposed:
                dst.copy_(buf.t())
            del buf
    model.load_state_dict(state, assign=True)
    return model.requires_grad_(False).eval()


def warm_page_cache(path: Path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def bench_loading(name, folder, repeats):
    warm_page_cache(folder / "model.safetensors")  # the untimed first read
    results = {}
    for label, (imports, load) in LOADERS.items():
        code = _MEASURE.format(imports=imports, load=load)
        runs = []
        for _ in tqdm(range(repeats), desc=f"  load {label[:40]}", leave=False):
            proc = subprocess.run([sys.executable, "-c", code, str(folder)], cwd=REPO_ROOT,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        extra = [(r["peak_kib"] - r["baseline_kib"]) * 1024 for r in runs]
        results[label] = {
            "seconds_median": median([r["seconds"] for r in runs]),
            "peak_minus_baseline_bytes_median": median(extra),
            "peak_after_forward_minus_baseline_bytes_median": median(
                [(r["peak_after_forward_kib"] - r["baseline_kib"]) * 1024 for r in runs]),
            # growth of private memory and of resident mapped-file pages, load vs after the imports
            "after_load_rss_anon_bytes": median([(r["after_load_kib"]["RssAnon"] - r["before_kib"]["RssAnon"])
                                                 * 1024 for r in runs]),
            "after_load_rss_file_bytes": median([(r["after_load_kib"]["RssFile"] - r["before_kib"]["RssFile"])
                                                 * 1024 for r in runs]),
            "param_bytes": runs[0]["param_bytes"], "runs": runs,
        }
    return {"model": name, "file_bytes": (folder / "model.safetensors").stat().st_size,
            "repeats": repeats, "loaders": results}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def gb(n_bytes):
    return f"{n_bytes / BYTES_PER_GB:.2f}"


def report(results) -> str:
    bw = results["read_bandwidth"]
    md = [f"# Model speed (batch 1, fp32, CPU, greedy)\n",
          f"Machine: {results['machine']['cpu']}, {results['machine']['torch_threads']} torch threads, "
          f"torch {results['machine']['torch']}, transformers {results['machine']['transformers']}. "
          f"Random-weight stand-ins of the official shapes. Medians of interleaved repeats.\n",
          f"Measured read bandwidth (x.sum() over 1 GiB fp32): **{bw['gb_per_s_median']:.1f} GB/s** "
          f"median, {bw['gb_per_s_best']:.1f} GB/s best.\n",
          "## Decoding speed\n"]
    rows = []
    for d in results["decoding"]:
        for k, r in d["runs"].items():
            rows.append([d["model"], f"{d['prompt_len']} + {d['new_tokens']}", k,
                         f"{r['tokens_per_s']:.2f}", f"{1000 / r['tokens_per_s']:.1f}",
                         f"{r['weights_gb_per_s']:.1f}"])
    md.append(markdown_table(["model", "prompt + new", "implementation", "tokens/s",
                              "ms/token (end to end)", "weights GB/s"], rows))
    md.append("\n## One decoding step vs the memory-bandwidth bound\n")
    rows = []
    for d in results["decoding"]:
        s, c = d["decode_step"], d["bandwidth_ceiling_tokens_per_s"]
        rows.append([d["model"], gb(d["weight_bytes_per_token"]), s["context_len"],
                     f"{1000 * s['seconds_onednn']:.1f}", f"{s['weights_gb_per_s_onednn']:.1f}",
                     f"{1000 * s['seconds_mkl']:.1f}", f"{s['weights_gb_per_s_mkl']:.1f}",
                     f"{1 / s['seconds_onednn']:.1f}", f"{c['measured_read_bandwidth']:.1f}",
                     f"{c['issue_40_gb_per_s']:.1f}",
                     "yes" if d["same_tokens_ours_vs_hf"] else f"NO (first at {d['first_mismatch_ours_vs_hf']})",
                     "yes" if d["same_tokens_onednn_vs_mkl"] else "NO"])
    md.append(markdown_table(["model", "weights GB/token", "context", "step ms (oneDNN)",
                              "GB/s (oneDNN)", "step ms (MKL)", "GB/s (MKL)", "tokens/s (oneDNN step)",
                              "ceiling tokens/s at measured bandwidth", "ceiling at 40 GB/s",
                              "same tokens as HF", "oneDNN = MKL tokens"], rows))
    if results.get("dtypes"):
        d = results["dtypes"]
        ref = d["reference"]
        md.append(f"\n## Step and {d['verify_tokens']}-token verification per dtype ({d['model']})\n")
        md.append(f"Warm KV cache of {d['context_len']} tokens, {d['threads']} threads, medians of "
                  f"{d['rounds']} interleaved rounds (one model, cast from dtype to dtype).\n")
        rows = [[dtype, f"{1000 * r['step_s']:.1f}", f"{r['step_vs_first_step']:.2f}",
                 f"{1000 * r['verify_s']:.1f}", f"{r['verify_vs_first_step']:.2f}",
                 f"{r['verify_vs_own_step']:.2f}"] for dtype, r in d["dtypes"].items()]
        md.append(markdown_table(["dtype", "step ms", f"step / {ref} step",
                                  f"verify {d['verify_tokens']} ms", f"verify / {ref} step",
                                  "verify / own step"], rows))
    if results.get("loading"):
        md.append("\n## Load time and peak memory\n")
        for L in results["loading"]:
            md.append(f"{L['model']}: model.safetensors is {gb(L['file_bytes'])} GB; "
                      f"fresh subprocess per load, page cache warm, medians of {L['repeats']}.\n")
            rows = [[label, f"{r['seconds_median']:.2f}", gb(r["peak_minus_baseline_bytes_median"]),
                     gb(r["peak_after_forward_minus_baseline_bytes_median"]),
                     gb(r["param_bytes"]), gb(r["after_load_rss_anon_bytes"]),
                     gb(r["after_load_rss_file_bytes"])]
                    for label, r in L["loaders"].items()]
            md.append(markdown_table(["loader", "load s", "peak RSS - baseline GB", "same, after 1st forward GB", "parameters GB",
                                      "after 1st forward: +RssAnon GB", "+RssFile GB"], rows))
    return "\n".join(md) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["gpt2", "gpt2-large"], choices=list(OFFICIAL_CONFIGS))
    p.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS,
                   help="where the stand-in checkpoints live (<dir>/<model>), made if missing")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=None,
                   help="new tokens per generation (default: 128 for gpt2, 64 for gpt2-large)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per implementation")
    p.add_argument("--steps", type=int, default=10, help="timed single decoding steps")
    p.add_argument("--memory-models", nargs="*", default=["gpt2-large"],
                   help="models whose load time / peak memory to measure (none: skip)")
    p.add_argument("--memory-repeats", type=int, default=3)
    p.add_argument("--dtypes", nargs="*", default=[], choices=["float32", "bfloat16", "float16"],
                   help="time one step and one 5-token verification in each dtype (the first is "
                        "the reference), e.g. --dtypes float32 bfloat16 float16")
    p.add_argument("--dtype-model", default="gpt2-large", choices=list(OFFICIAL_CONFIGS))
    p.add_argument("--dtype-rounds", type=int, default=15)
    add_output_options(p, "model_speed", "gpt2 only, 16 new tokens, 1 repeat, gpt2 load measured once")
    args = p.parse_args(argv)
    if missing := transformers_missing("benchmarks.model_speed (it times transformers' GPT-2 beside ours)"):
        p.error(missing)
    if args.quick:
        args.models, args.repeats, args.steps = ["gpt2"], 1, 3
        args.memory_models, args.memory_repeats = ["gpt2"], 1

    torch.manual_seed(0)
    results = {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}}
    print("Measuring memory read bandwidth ...", flush=True)
    results["read_bandwidth"] = bandwidth = measure_read_bandwidth(0.25 if args.quick else 1.0)
    print(f"  {bandwidth['gb_per_s_median']:.1f} GB/s (median), {bandwidth['gb_per_s_best']:.1f} GB/s (best)")

    results["decoding"] = []
    for name in args.models:
        print(f"\n[{name}] decoding speed", flush=True)
        folder = standin_checkpoint(name, args.checkpoints)
        d = bench_decoding(name, folder, args, bandwidth)
        results["decoding"].append(d)
        for k, r in d["runs"].items():
            print(f"  {k:28s} {r['tokens_per_s']:7.2f} tokens/s")
        print(f"  same tokens ours vs HF: {d['same_tokens_ours_vs_hf']}")

    results["loading"] = []
    for name in args.memory_models:
        print(f"\n[{name}] load time and peak memory", flush=True)
        folder = standin_checkpoint(name, args.checkpoints)
        results["loading"].append(bench_loading(name, folder, args.memory_repeats))

    if args.dtypes:
        print(f"\n[{args.dtype_model}] step and verification per dtype", flush=True)
        folder = standin_checkpoint(args.dtype_model, args.checkpoints)
        results["dtypes"] = bench_dtypes(args.dtype_model, folder, args.dtypes,
                                         rounds=1 if args.quick else args.dtype_rounds)

    md = report(results)
    print("\n" + md)
    write_results(args.out, results, md)


if __name__ == "__main__":
    main()
