"""Decode steps replayed as CUDA graphs (a CUDA GPU only): the whole forward of a step, or of a
verification of a few rows, recorded once and then replayed with one call. Opt-in
(`graph_decode(model)`, `load_gpt2(..., compile="graph")`, `--compile graph`), and chosen by
`compile="auto"` on a GPU only where it was measured faster there. What is recorded per block is
the eager block, torch.compile's fused block (`compiled=True`, `--compile on`) or five Triton
kernels (`fused=True`, `--compile fused`, gpt2/speed/fused_step.py).

Why: on a GPU a decode step of GPT-2 is launch-bound. It is some 600 kernels (four matrix
products and a dozen small operations per block), each shorter than the time Python and the
driver take to launch it, so the GPU mostly waits. A CUDA graph records the launches once, with
their arguments and addresses, and the GPU then runs the whole list from one call. (pytorch-labs'
gpt-fast gets the same from torch.compile(mode="reduce-overhead"); here the eager model is
recorded as it is, nothing is compiled.)

What a replay needs: every tensor the recorded kernels read or write is at the address, and has
the shape, it had when it was recorded. So:
  - Inputs go through static tensors: the new tokens, their positions and cache slots, and the
    attention mask are copied into tensors made once per graph. The logits come out in a static
    tensor too, copied out (the next replay overwrites it).
  - The recorded block is gpt2/speed/compiled.py's block_step (the model's Block written for a
    fixed-size cache): it writes the new keys/values at their slots and attends over the whole
    buffer with a mask that hides the slots not written yet, so the shapes do not change as the
    cache fills.
  - The cache buffers outlive the graphs recorded on them: a cache made by model.new_kv_cache takes
    n_positions-long buffers from a pool kept with the model (its keys/values are views of their
    first max_len slots) and gives them back when its lists of keys and values are gone. The next
    cache of the same shape reuses them, and the graphs recorded on them. (Attention then reads
    the whole window each step, masked: a few percent of a step's bytes for gpt2-large.)
  - One graph per (buffers, row bucket, exit layer), recorded the first time it comes (that call
    runs the forward twice: a warm-up, which sets up the libraries' workspaces outside the
    recording, then the recording, then a replay). A call of T new rows runs the graph of the
    smallest bucket that holds it (ROW_BUCKETS: 1, 2, 4, 8, 16), padded, as serving engines
    bucket batch sizes: gamma up to 8 and the token trees need a handful of graphs, not one per
    length. The padding rows are dummies that stay out of the real rows' way: they come after
    them (the causal mask hides them), write their keys and values into slots past the cache's
    length (hidden by every later mask until a real token overwrites them), and the logits and
    features of the real rows alone are returned. The head runs over every row of the bucket
    (on a GPU, reading its weight once costs the same for a few more rows).

Calls no graph serves run the eager forward, on the same buffers: the first forward on a cache (the
prompt, whose length differs from one generation to the next, so a graph of it would rarely be
replayed), more than MAX_ROWS new tokens, no cache or a cache made some other way, training.
gpt2/model.py is unchanged.
"""

import sys
import time
import weakref

import torch

from .compiled import (MAX_ROWS, OPTIONS, block_step, decide_path, eager, faster_than_eager, fixed_size_inputs,
                       head, model_key, time_in_turns)
from .device import note_once, synchronize
from .fast_model import FastGPT2
from .fused_step import fused_block_step, fused_head, why_not_fused


def record_cuda_graph(forward):
    """Record forward() (reads and writes only tensors that stay put; returns a tuple of tensors)
    as a CUDA graph. Returns (replay, outputs): replay() runs it again, writing into outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()  # warm-up: first calls set up cuBLAS handles and workspaces, which a recording cannot
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = forward()  # recorded, not run
    return graph.replay, outputs


class PooledList(list):
    """The list of a cache's key (or value) views into pooled buffers. A plain list cannot be
    watched with a weak reference; this one can, so its buffers go back to the pool only when
    nothing (a KVCache, or a BatchedKVCache that took its lists) holds it any more."""


class GraphedDecode:
    """Stands in for model.forward (same arguments, same results up to rounding) and for
    model.new_kv_cache (same arguments; the cache's buffers come from the pool). record_seconds:
    graph key -> seconds its first call took (warm-up, recording, replay). path: what each
    block records ("eager", "compiled" or "fused")."""

    def __init__(self, model, record=record_cuda_graph, compiled: bool = False, fused: bool = False):
        self.model = model
        self.eager_forward = model.eager_forward
        self.eager_new_kv_cache = model.eager_new_kv_cache
        self.record = record  # tests on a CPU give a stand-in that calls forward again
        # compiled: record the block torch.compile made of block_step (its fused kernels: fewer
        # launches to replay) instead of the eager block's; fused: five Triton kernels a block
        self.compiled, self.fused = compiled and not fused, fused
        self.block = fused_block_step if fused else torch.compile(block_step) if compiled else block_step
        self.free = {}  # buffer shape -> [(keys, values)] not held by any cache
        self.graphs = {}  # (id(keys), row bucket, exit layer) -> (inputs, replay, outputs)
        self.record_seconds: dict[tuple, float] = {}

    @property
    def path(self) -> str:
        return path_name(self.compiled, self.fused)

    def new_kv_cache(self, batch_size: int = 1, max_len: int | None = None, extra_slots: int = 0,
                     n_layer: int | None = None):
        """model.new_kv_cache, on pooled buffers of n_positions + extra_slots slots."""
        cache = self.eager_new_kv_cache(batch_size, max_len, extra_slots, n_layer)  # checks, dtype
        k = cache.keys[0]
        length = self.model.config.n_positions + extra_slots
        shape = (k.shape[0], k.shape[1], length, k.shape[3])
        free = self.free.setdefault((shape, len(cache.keys), k.dtype, k.device), [])
        if free:
            keys, values = free.pop()
        else:
            with torch.inference_mode(False):  # the eager forward writes them outside inference mode too
                keys, values = ([torch.zeros(shape, dtype=k.dtype, device=k.device) for _ in cache.keys]
                                for _ in range(2))
        cache.keys = PooledList(b[:, :, :cache.max_len] for b in keys)
        cache.values = PooledList(b[:, :, :cache.max_len] for b in values)
        cache.full_buffers = (keys, values)
        weakref.finalize(cache.keys, free.append, (keys, values))
        return cache

    def serves(self, idx, cache, more) -> bool:
        model = self.model
        return (isinstance(getattr(cache, "full_buffers", None), tuple) and isinstance(cache.keys, PooledList)
                and cache.length > 0 and isinstance(idx, torch.Tensor) and idx.dim() == 2
                and 1 <= idx.shape[1] <= MAX_ROWS and not (torch.is_grad_enabled() and model.wpe.weight.requires_grad)
                and not model.training and not set(more) - OPTIONS)

    def __call__(self, idx, cache=None, num_last_logits=None, **more):
        """model(idx, cache, num_last_logits, positions=, attn_mask=, exit_layer=,
        return_features=): the arguments of GPT2.forward."""
        if not self.serves(idx, cache, more):
            return self.eager_forward(idx, cache, num_last_logits, **more)
        positions, attn_mask = more.get("positions"), more.get("attn_mask")
        exit_layer, return_features = more.get("exit_layer"), more.get("return_features", False)
        model, start, T = self.model, cache.length, idx.shape[1]
        model._check_input(idx, start, cache, positions, attn_mask)  # the eager path's messages
        keys, values = cache.full_buffers
        buffer_len = keys[0].shape[2]
        slots, positions, mask = fixed_size_inputs(start, T, buffer_len, positions, attn_mask, idx.device)
        bucket = row_bucket(T, buffer_len - start)
        idx, positions, slots, mask = padded_inputs(idx, positions, slots, mask, bucket)
        rows = T if num_last_logits is None else min(num_last_logits, T)
        key = (id(keys), bucket, exit_layer)
        with torch.inference_mode():
            if key not in self.graphs:
                t0 = time.perf_counter()
                try:
                    self.graphs[key] = self.record_graph(keys, values, idx, positions, slots, mask, exit_layer)
                except Exception as e:  # compiling failed (in the warm-up): no compiler, a failed build
                    if not (self.fused or isinstance(e, torch._dynamo.exc.TorchDynamoException)):
                        raise
                    print(f"note: compiling the recorded block failed here ({type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:200]}); recording the eager block instead",
                          file=sys.stderr)
                    self.compiled = self.fused = False
                    self.block = block_step
                    self.graphs.clear()  # graphs of the fused block recorded before: the path is one
                    self.graphs[key] = self.record_graph(keys, values, idx, positions, slots, mask, exit_layer)
                synchronize(idx.device)
                self.record_seconds[key] = seconds = time.perf_counter() - t0
                print(f"note: recorded a CUDA graph of the forward for up to {bucket} new row(s) in "
                      f"{seconds:.2f} s (once per cache shape and row bucket)", file=sys.stderr)
            inputs, replay, (logits, features) = self.graphs[key]
            for static, new in zip(inputs, (idx, positions, slots, mask)):
                static.copy_(new)
            replay()
        cache.advance(T)
        # Copies of the real rows (the next replay writes over the static outputs), made outside
        # inference mode as the eager forward's outputs are: a drafter may train on the features
        logits = logits[:, T - rows:T].clone()
        return (logits, features[:, :T].clone()) if return_features else logits

    def record_graph(self, keys, values, idx, positions, slots, mask, exit_layer):
        """Static inputs, replay and static outputs (logits [B, T, vocab], features [B, T, C], T
        the bucket's rows) of one recorded forward on these buffers."""
        model = self.model
        inputs = tuple(t.clone() for t in (idx, positions, slots, mask))

        def forward():
            s_idx, s_positions, s_slots, s_mask = inputs
            x = model.wte(s_idx) + model.wpe(s_positions)
            if self.compiled and x.shape[1] > 1:  # one compiled graph for 2 to MAX_ROWS rows (gpt2.speed.compiled)
                for tensor, dim in ((x, 1), (s_slots, 0), (s_mask, 0)):
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
            for layer, block in enumerate(model.h[:exit_layer]):
                x = self.block(block, x, keys[layer], values[layer], s_slots, s_mask)
            return (fused_head(model, x) if self.fused else head(model, model.ln_f(x))), x

        replay, outputs = self.record(forward)
        return inputs, replay, outputs


# The row counts a graph is recorded for: a call of T new rows runs the smallest that holds it.
ROW_BUCKETS = (1, 2, 4, 8, MAX_ROWS)


def row_bucket(T: int, free_slots: int) -> int:
    """The rows of the graph that serves T new rows: the smallest bucket >= T that fits in the
    buffer's free_slots (the padding rows write there too), else T itself."""
    return next((b for b in ROW_BUCKETS if T <= b <= free_slots), T)


def padded_inputs(idx, positions, slots, mask, rows: int):
    """GraphedDecode's inputs for T real rows padded to `rows`: idx [B, rows], positions [rows],
    slots [rows], mask [rows, buffer_len]. The padding rows take token 0 at position 0 (any valid
    ones: their outputs are dropped), the slots after the real ones, and a causal mask (a row that
    may attend to nothing would make NaNs, and a NaN value times a zero weight is still NaN)."""
    T = idx.shape[1]
    if rows == T:
        return idx, positions, slots, mask
    extra = slots[-1:] + torch.arange(1, rows - T + 1, device=idx.device)  # no .item(): no sync on a GPU
    idx = torch.cat([idx, idx.new_zeros(idx.shape[0], rows - T)], dim=1)
    positions = torch.cat([positions, positions.new_zeros(rows - T)])
    causal = torch.arange(mask.shape[1], device=idx.device)[None, :] <= extra[:, None]
    return idx, positions, torch.cat([slots, extra]), torch.cat([mask, causal])


def path_name(compiled: bool, fused: bool) -> str:
    """What each block records: "fused", "compiled" or "eager"."""
    return "fused" if fused else "compiled" if compiled else "eager"


def graph_decode(model, record=record_cuda_graph, compiled: bool = False, fused: bool = False):
    """The model with the graphed decode path (a FastGPT2's decode_path; a plain GPT2 is held by a
    new FastGPT2, as compiled.compile_decode does), on a CUDA GPU, for inference; returns it.
    compiled=True records torch.compile's fused block instead of the eager one, fused=True the
    Triton kernels of gpt2/speed/fused_step.py (where the model cannot take them, a note says why
    and the compiled block is recorded). Switching the path off (ungraph) and on again keeps the
    pool and the graphs recorded. record: how a forward is recorded (tests on a CPU pass a stand-in)."""
    model = model if isinstance(model, FastGPT2) else FastGPT2.holding(model)
    device = model.wpe.weight.device.type
    if device != "cuda" and record is record_cuda_graph:
        note_once(f"note: CUDA graphs are for CUDA GPUs; a model on {device} stays eager", sys.stderr)
        return model
    if fused and (why := why_not_fused(model)):
        note_once(f"note: the fused decode step is not for this model ({why}); recording the compiled "
                  f"block instead", sys.stderr)
        fused, compiled = False, True
    path = path_name(compiled, fused)
    kept = model.__dict__.setdefault("_graphed_paths", {})  # path -> its GraphedDecode
    if not (is_graphed(model) and model.decode_path is kept.get(path)):
        ungraph(eager(model))
        model.decode_path = kept.get(path) or kept.setdefault(path, GraphedDecode(model, record, compiled, fused))
    return model


def is_graphed(model) -> bool:
    return isinstance(getattr(model, "decode_path", None), GraphedDecode)


def ungraph(model):
    """Take the graphed path off `model` (caches made meanwhile keep working, eagerly; graph_decode
    puts it back with its graphs); returns the model."""
    if is_graphed(model):
        model.decode_path = None
    return model


def choose_graphed(model) -> tuple[bool, str]:
    """compile="auto" on a CUDA GPU: (whether the graphed path is faster for this model here, why),
    measured once per GPU, shape and format and kept with the kernel choices (gpt2/speed/kernel_cache.py).
    The model is left with the path chosen."""
    c, w = model.config, model.wpe.weight
    if w.device.type != "cuda":
        return False, f"CUDA graphs are for CUDA GPUs (this model is on {w.device.type})"
    what = model_key(model) | {"device": torch.cuda.get_device_name(w.device)}
    return decide_path(model, "cuda_graph", what, _measure, graph_decode, ungraph,
                       f"whether CUDA graphs make decoding faster for this {c.n_layer}-block width-{c.n_embd} model")


@torch.inference_mode()
def _measure(model, rounds: int = 5) -> tuple[bool, str]:
    """Time a 1-row step and a 5-row verification, eager and graphed, in turns; graphed where it
    is faster by gpt2.speed.compiled's AUTO_MARGIN."""
    times = time_in_turns(model, {"eager": ungraph, "graphed": graph_decode}, rounds, warm_up=True)  # records first
    ungraph(model)
    use, verdict, ms = faster_than_eager(times, "graphed")
    return use, f"CUDA graphs {verdict} here ({ms})"
