"""A compiled decode path: the decode step (1 row) and the verification forward (a few rows)
through torch.compile, on the model's own KV cache. Opt-in (`compile_decode(model)`,
`load_gpt2(..., compile=True)`, `--compile`), and chosen by `compile="auto"` only where it was
measured faster on this machine.

Why: a decode step of GPT-2 is four large matrix products per block (which read the weights: the
step's floor) and some fifteen small operations per block (LayerNorms, a GELU, residual adds,
reshapes, the cache writes, attention), each dispatched from Python. PyTorch's inductor turns the
small ones into a few fused C++/OpenMP loops per block on a CPU, a few Triton kernels on a CUDA
GPU; the matrix products stay on the kernels gpt2.speed.kernels chose (a FastLinear being compiled
calls its kernel through a custom op, so the compiler sees an opaque call).

What is compiled: one block, `block_step` below, the same function for every block of the model
(the blocks' weights are inputs of the compiled graph, not constants: one compile serves all
layers). It is gpt2/model.py's own Block.forward, called with a fixed-size cache (SlotCache):

  - the cache buffers keep their full length max_len; new keys/values are written at their slots
    with index_copy_, and attention runs over all max_len slots with a mask that hides the slots
    not written yet. So the shapes do not change as the cache fills, and nothing recompiles from
    one step to the next (a cache of another max_len reuses the graph: that size is dynamic).
  - The number of new rows T is the one shape that varies: 1 (a step) gets its own graph, and
    every T from 2 to MAX_ROWS (verifications, token trees) shares a second one. Longer inputs
    (a prompt) take the eager path, whose large products dominate anyway.

The embedding, ln_f and the output head run eagerly, as in GPT2.forward. gpt2/model.py itself is
unchanged: `compile_decode` sets an accelerated model's `decode_path` (gpt2/speed/fast_model.py's
FastGPT2.forward sends calls there) to a CompiledDecode, which sends every call it cannot serve (no
cache, training, a batched cache, long inputs) to the eager forward.
"""

import getpass
import os
import re
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from . import kernel_cache
from .fast_model import LAYERS, FastGPT2
from .device import synchronize
from ..kv_cache import KVCache

def separate_compile_cache() -> str:
    """Give inductor's cache of compiled code a folder per CPU capability (returns it).

    Its entries do not record which vector instructions they were generated for: code compiled
    while PyTorch acts as an AVX2 CPU (ATEN_CPU_CAPABILITY=avx2, as .ci/run does) and loaded later
    by a native AVX-512 run, or the reverse, reads and writes out of bounds (heap corruption,
    NaN logits). One folder per capability keeps them apart."""
    suffix = "-" + torch.backends.cpu.get_cpu_capability().lower()
    # inductor's default folder (torch._inductor.runtime.cache_dir_utils; importing it takes seconds)
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser()))
    if not base.endswith(suffix):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = base + suffix
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]

separate_compile_cache()  # before anything is compiled in this process

# Inputs of more rows than this run eagerly: a prompt, whose matrix products dominate.
MAX_ROWS = 16
# The keywords of GPT2.forward the compiled path serves (anything else goes to the eager forward).
OPTIONS = {"positions", "attn_mask", "exit_layer", "return_features"}

@torch.library.custom_op("gpt2::fast_linear", mutates_args=())
def fast_linear_op(x: torch.Tensor, handle: torch.Tensor, out_features: int) -> torch.Tensor:
    """x [..., in] -> [..., out_features] through the FastLinear named by handle (its kernel, chosen
    by gpt2.speed.kernels): an opaque call to the compiler, which would otherwise trace into the
    kernel objects."""
    # contiguous: the compiler assumes the layout of the fake below (some kernels, e.g. a
    # transposed product, give a transposed view; a copy of a few rows)
    return LAYERS[int(handle)](x).contiguous()

@fast_linear_op.register_fake
def _(x, handle, out_features):
    return x.new_empty(*x.shape[:-1], out_features)

def head(model, x):
    """The output head as the model computes it."""
    return model.head(x)

class SlotCache:
    """One block's fixed-size cache buffers, as Block.forward's cache: update writes the new keys
    and values at `slots` and returns the whole buffers, so attention runs over every slot (the
    mask hides those not written yet) and no shape changes as the cache fills."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.slots, k.to(self.keys.dtype))
        self.values.index_copy_(2, self.slots, v.to(self.values.dtype))
        return self.keys, self.values


def block_step(block, x, keys, values, slots, attn_mask):
    """gpt2/model.py's own Block.forward over a fixed-size cache (what torch.compile compiles, and
    what a CUDA graph records).

    x [B, T, C]; keys, values [B, n_head, max_len, head_dim], this block's cache buffers, written
    in place at `slots` [T]; attn_mask [T, max_len] bool (True = may attend). Returns [B, T, C]."""
    return block(x, attn_mask, SlotCache(keys, values, slots), 0)

def fixed_size_inputs(start: int, T: int, buffer_len: int, positions, attn_mask, device):
    """What block_step needs besides x, for T new tokens on a cache holding `start` positions in
    buffers of buffer_len slots: (slots [T], positions [T], full_mask [T, buffer_len]).

    positions [T] and attn_mask [T, start + T] are GPT2.forward's (None: the next positions,
    causal). The mask hides every slot past start + T, which holds nothing written yet."""
    slots = torch.arange(start, start + T, device=device)  # where the new keys go
    if positions is None:
        positions = slots
    if attn_mask is None:  # causal: cached slots, then each new token up to its own
        full_mask = torch.arange(buffer_len, device=device)[None, :] <= slots[:, None]
    else:  # the caller's mask over [0, start + T)
        full_mask = torch.zeros(T, buffer_len, dtype=torch.bool, device=device)
        full_mask[:, :start + T] = attn_mask
    return slots, positions, full_mask

class CompiledDecode:
    """Stands in for model.forward (same arguments, same results up to rounding): calls with a
    KVCache and at most MAX_ROWS new tokens go through the compiled block; any other call goes to
    the eager forward. compile_seconds: "1 row" or "2 to 16 rows" -> seconds the call that
    compiled it took."""

    def __init__(self, model):
        self.model = model
        self.eager_forward = model.eager_forward
        self.block = torch.compile(block_step)
        self.compile_seconds: dict[str, float] = {}
        self.failed: str | None = None  # why compiling failed here (then every call runs eagerly)

    def serves(self, idx, cache) -> bool:
        model = self.model
        return (type(cache) is KVCache and isinstance(idx, torch.Tensor) and idx.dim() == 2
                and 1 <= idx.shape[1] <= MAX_ROWS and model.wpe.weight.device.type in DEVICES
                and not (torch.is_grad_enabled() and model.wpe.weight.requires_grad)
                and not model.training and self.failed is None)

    def __call__(self, idx, cache=None, num_last_logits=None, **more):
        """model(idx, cache, num_last_logits, positions=, attn_mask=, exit_layer=,
        return_features=): the arguments of GPT2.forward."""
        if not self.serves(idx, cache) or set(more) - OPTIONS:
            return self.eager_forward(idx, cache, num_last_logits, **more)
        positions, attn_mask = more.get("positions"), more.get("attn_mask")
        exit_layer, return_features = more.get("exit_layer"), more.get("return_features", False)
        model = self.model
        start = cache.length
        model._check_input(idx, start, cache, positions, attn_mask)  # the eager path's messages
        T = idx.shape[1]
        slots, positions, full_mask = fixed_size_inputs(start, T, cache.max_len, positions, attn_mask, idx.device)
        x = model.wte(idx) + model.wpe(positions)
        # Sizes that change from call to call are marked dynamic up front, so that they never
        # cause a recompile: the cache's max_len always, the rows T from 2 up (T = 1, a step,
        # is a graph of its own: PyTorch specializes sizes 0 and 1).
        dynamic = [(full_mask, 1)] + ([(x, 1), (slots, 0), (full_mask, 0)] if T > 1 else [])
        for tensor, dim in dynamic:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
        graphs = compiled_graphs()
        t0 = time.perf_counter()
        try:
            for layer, block in enumerate(model.h[:exit_layer]):
                keys, values = cache.keys[layer], cache.values[layer]
                torch._dynamo.maybe_mark_dynamic(keys, 2)
                torch._dynamo.maybe_mark_dynamic(values, 2)
                x = self.block(block, x, keys, values, slots, full_mask)
        except torch._dynamo.exc.TorchDynamoException as e:  # no C++ compiler, a failed build, ...
            self.failed = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            print(f"note: the compiled decode path failed here ({self.failed}); this model runs "
                  f"eagerly from now on", file=sys.stderr)
            # The eager forward writes the same cache slots again: cache.length has not moved.
            return self.eager_forward(idx, cache, num_last_logits, **more)
        if compiled_graphs() > graphs:
            rows = "1 row" if T == 1 else f"2 to {MAX_ROWS} rows"
            self.compile_seconds[rows] = seconds = time.perf_counter() - t0
            print(f"note: compiled the decode path for {rows} in {seconds:.1f} s (once per "
                  f"process and shape)", file=sys.stderr)
        cache.advance(T)
        features = x
        if num_last_logits is not None:
            x = x[:, -num_last_logits:]
        logits = head(model, model.ln_f(x))
        return (logits, features) if return_features else logits

# "graph": a CUDA GPU's whole step recorded as a CUDA graph (gpt2/speed/cuda_graph.py); "fused":
# the same with five Triton kernels a block (gpt2/speed/fused_step.py)
COMPILE_CHOICES = (False, True, "graph", "fused", "auto")
# Where the compiled path runs: inductor writes C++/OpenMP loops for a CPU, Triton kernels for a
# CUDA GPU (Apple's MPS stays eager).
DEVICES = ("cpu", "cuda")
COMPILE_FLAGS = {"off": False, "on": True, "graph": "graph", "fused": "fused", "auto": "auto"}  # the scripts' --compile
# compile="auto" takes the compiled path only where it is faster than eager by this fraction: a
# closer result is timing noise, and eager is what the learner reads.
AUTO_MARGIN = 0.05
# The context the auto measurement decodes at (positions already in the cache).
AUTO_CONTEXT = 32

def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]

def compile_decode(model):
    """The model with the compiled decode path (a FastGPT2's decode_path), on a CPU or a CUDA GPU,
    for inference: a FastGPT2 gets it; a plain GPT2 is held by a new FastGPT2 that gets it (the plain
    model itself is left as written). Returns that model. Idempotent."""
    model = model if isinstance(model, FastGPT2) else FastGPT2.holding(model)
    device = model.wpe.weight.device.type
    if device not in DEVICES:
        print(f"note: the compiled decode path is for CPUs and CUDA GPUs; this model on {device} "
              f"stays eager", file=sys.stderr)
        return model
    if not is_compiled(model):
        model.decode_path = CompiledDecode(model)
    return model

def is_compiled(model) -> bool:
    return isinstance(getattr(model, "decode_path", None), CompiledDecode)

def eager(model):
    """Take the compiled path off `model` again; returns the model."""
    if is_compiled(model):
        model.decode_path = None
    return model

def choose_compiled(model) -> tuple[bool, str]:
    """compile="auto": (whether the compiled path is faster for this model here, why), measured on
    the model itself once per machine for its shape and format, and kept with the kernel choices
    (gpt2/speed/kernel_cache.py; `python -m gpt2.speed.kernel_report --remeasure` forgets it). The model is
    left with the path chosen."""
    c, w = model.config, model.wpe.weight
    if w.device.type not in DEVICES:
        return False, f"the compiled decode path is for CPUs and CUDA GPUs (this model is on {w.device.type})"
    what = model_key(model) | {"quantize": getattr(model, "quantize", None)}  # FastGPT2.quantize
    if w.device.type == "cuda":  # a GPU's choice is its own (the CPU's entries keep their keys)
        what["device"] = torch.cuda.get_device_name(w.device)
    return decide_path(model, "compiled", what, _measure, compile_decode, eager,
                       f"whether the compiled decode path is faster for this {c.n_layer}-block width-{c.n_embd} model")


def model_key(model) -> dict:
    """What a measured choice of decode path is kept under: the model's shape and dtype."""
    c = model.config
    return {"n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "vocab_size": c.vocab_size,
            "dtype": str(model.wpe.weight.dtype).removeprefix("torch.")}


def decide_path(model, kind: str, what: dict, measure, take, leave, about: str) -> tuple[bool, str]:
    """(use, why) of a decode path, measure(model)'s, kept per machine under (kind, what) and read
    back later; the model is left on the path (take(model)) or off it (leave(model))."""
    (use, why), measured_now = kernel_cache.decide_once(kind, what, lambda: list(measure(model)), about)
    (take if use else leave)(model)
    return use, why + ("" if measured_now else f" (measured here before, kept in {kernel_cache.shown_path()})")


@torch.inference_mode()
def _measure(model, rounds: int = 5) -> tuple[bool, str]:
    """Time a 1-row step and a 5-row verification, eager and compiled, in turns; the fastest of
    `rounds` each (noise only ever adds time)."""
    compiled = CompiledDecode(model)
    model.decode_path = compiled
    time_decode(model)  # compiles both shapes
    if compiled.failed:
        eager(model)
        return False, f"compiling failed here ({compiled.failed})"
    times = time_in_turns(model, {"eager": eager, "compiled": lambda m: setattr(m, "decode_path", compiled)}, rounds)
    use, verdict, ms = faster_than_eager(times, "compiled")
    compile_s = sum(compiled.compile_seconds.values())
    return use, f"compiled decode path {verdict} here ({ms}; compiling took {compile_s:.1f} s)"


def time_in_turns(model, paths: dict, rounds: int, warm_up: bool = False) -> dict[str, list[tuple[float, float]]]:
    """paths: name -> a function putting the model on that decode path. Returns name -> the
    (step, 5-row verification) seconds of each round (time_decode), the paths taking turns within
    a round so that noise hits each alike; warm_up: an untimed first round (a graphed path records
    then). The model is left on the last path."""
    times = {name: [] for name in paths}
    for r in range(rounds + warm_up):
        for name, take in paths.items():
            take(model)
            if r >= warm_up:
                times[name].append(time_decode(model))
    return times


def faster_than_eager(times: dict[str, list[tuple[float, float]]], path: str) -> tuple[bool, str, str]:
    """times: "eager" and `path` -> (step, 5-row verification) seconds of each round. Returns
    whether `path` is faster by AUTO_MARGIN (the fastest round of each: noise only ever adds
    time), the verdict in words, and the fastest times in words."""
    best = {name: (min(t[0] for t in ts), min(t[1] for t in ts)) for name, ts in times.items()}
    use = sum(best[path]) < (1 - AUTO_MARGIN) * sum(best["eager"])
    ms = "; ".join(f"{name} {1000 * t1:.1f} ms a step, {1000 * t5:.1f} ms a 5-row verification"
                   for name, (t1, t5) in best.items())
    return use, "faster" if use else f"not faster by {AUTO_MARGIN:.0%}", ms

def time_decode(model, context: int = AUTO_CONTEXT) -> tuple[float, float]:
    """Seconds of one 1-row step and one 5-row verification on a cache holding `context`
    positions (random tokens: the time does not depend on them)."""
    g = torch.Generator().manual_seed(0)
    device = model.wpe.weight.device
    ids = torch.randint(0, model.config.vocab_size, (1, context + 5), generator=g).to(device)
    cache = model.new_kv_cache(max_len=context + 5)
    model(ids[:, :context], cache)
    seconds = []
    for rows in (1, 5):
        cache.truncate(context)
        synchronize(device)
        t0 = time.perf_counter()
        model(ids[:, context:context + rows], cache, num_last_logits=rows)
        synchronize(device)  # a GPU returns before its work is done
        seconds.append(time.perf_counter() - t0)
    return seconds[0], seconds[1]
