"""A CPU's fused decode step: every block of the model in one call to C (gpt2/speed/csrc/block_step.c),
for a prompt, a step (1 new token) and a verification alike. Opt-in: `compile="fused"` on a CPU
(`load_gpt2(..., compile="fused")`, `--compile fused`); `compile="auto"` takes it where the model
can and it measures faster than eager.

Why: a block's four linear layers already run on our C kernels (gpt2/speed/csrc/rows_linear.c),
which read the weights at close to the memory's speed. What is left of a step is some fifteen
small PyTorch operations a block (LayerNorms, the cache writes, attention, a GELU, residual adds,
reshapes), each a few microseconds of dispatch from Python for a few kilobytes of work. block_step.c
writes them as loops around the same kernels, on the same packed weights, so nothing is copied.

What runs where: the embeddings, ln_f and the output head run as in GPT2.forward (eagerly, the head
on its FastLinear); the blocks in C. It serves every call with a KVCache of batch 1 in float32,
token trees' masks and positions included (calls without a cache, batches and training go to the
eager forward). It needs every linear layer of the blocks on one of our C kernels for every
number of rows (the int8 and w8a8 formats) and a head size that is a multiple of 8: where a model
has not, why_not says so and the model stays eager.

Numerics: the linear layers compute what the eager model's compute, bit for bit; the LayerNorms,
attention and the GELU round differently from PyTorch's (another summation order, exp by a
polynomial), so logits agree with eager's to float32 rounding. A row's result does not depend on
the rows beside it, the prompt goes through the same code as the steps, and a tree's node attends
its ancestors' slots in the order a chain would hold them: greedy speculative decoding on this
path, chains and trees, equals plain greedy decoding on it, token for token, whatever the lengths.
(The eager forward is not so: PyTorch's attention takes other code for other numbers of rows, so
a prompt read in one forward and the same tokens read in two can round apart.)
"""

import ctypes
import sys
import weakref

import torch

from . import native
from .device import note_once
from .fast_linear import NativeRowsLinear
from .fast_model import FastGPT2, FastLinear
from ..kv_cache import KVCache

# The keywords of GPT2.forward this path serves (all of them).
OPTIONS = {"positions", "attn_mask", "exit_layer", "return_features"}


class Linear(ctypes.Structure):
    _fields_ = [("run", ctypes.c_void_p), ("panels", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("inputs", ctypes.c_int64), ("out", ctypes.c_int64)]


class Block(ctypes.Structure):
    _fields_ = [("ln1_weight", ctypes.c_void_p), ("ln1_bias", ctypes.c_void_p), ("ln2_weight", ctypes.c_void_p),
                ("ln2_bias", ctypes.c_void_p), ("c_attn", Linear), ("attn_proj", Linear), ("c_fc", Linear),
                ("mlp_proj", Linear)]


def panel_kernel(layer) -> NativeRowsLinear | None:
    """The C kernel a FastLinear runs for every number of rows (None: it runs others for some)."""
    if not isinstance(layer, FastLinear):
        return None
    used = {id(kernel): kernel for _, _, kernel in layer.kernel.by_rows}
    kernel = next(iter(used.values()))
    return kernel if len(used) == 1 and isinstance(kernel, NativeRowsLinear) else None


def why_not(model) -> str | None:
    """Why this model cannot take the fused CPU step (None: it can)."""
    if not isinstance(model, FastGPT2):
        return "it is a plain model: load it with a weight format (dtype='auto', quantize='int8', ...)"
    if (reason := native.why_not()) is not None:
        return reason
    c, w = model.config, model.wpe.weight
    if w.device.type != "cpu" or w.dtype != torch.float32:
        return f"it is a {w.dtype} model on {w.device.type}; this step runs float32 models on a CPU"
    if (c.n_embd // c.n_head) % 8:
        return f"its head size {c.n_embd // c.n_head} is not a multiple of 8"
    for i, block in enumerate(model.h):
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            layer = block.get_submodule(name)
            if panel_kernel(layer) is None:
                runs = layer.kernel.describe() if isinstance(layer, FastLinear) else "PyTorch's nn.Linear"
                return (f"its {model.format} h.{i}.{name} runs on {runs}, not on our C kernel for every "
                        f"number of rows: load it with quantize='int8' or 'w8a8' (--quantize)")
    return None


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class FusedCPUStep:
    """Stands in for model.forward (same arguments, same results up to rounding): calls with a
    batch-1 float32 KVCache run the blocks in block_step.c; any other call goes to the eager forward."""

    def __init__(self, model: FastGPT2):
        self.model = model
        self.eager_forward = model.eager_forward
        self.step = native.step_library().decode_blocks
        self.keep = []  # the tensors whose addresses the blocks hold (the biases made float32)
        self.blocks = (Block * len(model.h))(*[self._block(b) for b in model.h])
        self.cache_pointers: "weakref.WeakKeyDictionary[KVCache, tuple]" = weakref.WeakKeyDictionary()

    def _linear(self, layer: FastLinear) -> Linear:
        kernel = panel_kernel(layer)
        bias = None if layer.bias is None else layer.bias.detach().float().contiguous()
        self.keep += [kernel.panels, kernel.scale, bias]
        run = ctypes.cast(native.entry_point(kernel.panels, kernel.lib), ctypes.c_void_p).value
        return Linear(run, kernel.panels.data_ptr(), _address(kernel.scale), _address(bias),
                      layer.in_features, layer.out_features)

    def _block(self, block) -> Block:
        ln = [t.detach().float().contiguous() for t in (block.ln_1.weight, block.ln_1.bias,
                                                          block.ln_2.weight, block.ln_2.bias)]
        self.keep += ln
        return Block(*[t.data_ptr() for t in ln], self._linear(block.attn.c_attn), self._linear(block.attn.c_proj),
                     self._linear(block.mlp.c_fc), self._linear(block.mlp.c_proj))

    def serves(self, idx, cache) -> bool:
        model = self.model
        return (type(cache) is KVCache and cache.batch_size == 1 and isinstance(idx, torch.Tensor)
                and idx.dim() == 2 and idx.shape[1] >= 1
                and cache.keys[0].dtype == torch.float32 and cache.keys[0].device.type == "cpu"
                and not (torch.is_grad_enabled() and model.wpe.weight.requires_grad) and not model.training)

    def _pointers(self, cache: KVCache) -> tuple:
        """The cache's per-layer key and value buffers as C arrays of addresses (made once a cache)."""
        held = self.cache_pointers.get(cache)
        if held is None or held[0][0] != cache.keys[0].data_ptr():
            n = len(cache.keys)
            keys = (ctypes.c_void_p * n)(*[k.data_ptr() for k in cache.keys])
            values = (ctypes.c_void_p * n)(*[v.data_ptr() for v in cache.values])
            held = self.cache_pointers[cache] = (keys, values, n)
        return held

    def __call__(self, idx, cache=None, num_last_logits=None, **more):
        """model(idx, cache, num_last_logits, positions=, attn_mask=, exit_layer=, return_features=):
        GPT2.forward's arguments."""
        if (not self.serves(idx, cache) or set(more) - OPTIONS
                or cache.length + idx.shape[1] > cache.max_len):  # the eager forward says what is wrong
            return self.eager_forward(idx, cache, num_last_logits, **more)
        model = self.model
        start, T = cache.length, idx.shape[1]
        positions, attn_mask = more.get("positions"), more.get("attn_mask")
        model._check_input(idx, start, cache, positions, attn_mask)  # the eager path's messages
        exit_layer = more.get("exit_layer")
        n_blocks = len(model.h) if exit_layer is None else len(model.h[:exit_layer])
        keys, values, held = self._pointers(cache)
        if n_blocks > held:
            raise ValueError(f"this cache holds {held} blocks, the forward runs {n_blocks}: make it with "
                             f"model.new_kv_cache(n_layer={n_blocks}) or more")
        c = model.config
        if positions is None:
            positions = torch.arange(start, start + T)
        # a token tree's mask [T, start + T] as bytes (None: causal)
        mask = None if attn_mask is None else attn_mask.to(device="cpu", dtype=torch.uint8).contiguous()
        x = (model.wte(idx) + model.wpe(positions)).contiguous()  # [1, T, C], overwritten by the blocks
        failed = self.step(x.data_ptr(), T, c.n_embd, c.n_head, cache.max_len, start, _address(mask),
                           c.layer_norm_epsilon, self.blocks, n_blocks, keys, values, torch.get_num_threads())
        if failed:
            raise MemoryError("the fused CPU step could not allocate its buffers")
        cache.advance(T)
        features = x
        if num_last_logits is not None:
            x = x[:, -num_last_logits:]
        logits = model.head(model.ln_f(x))
        return (logits, features) if more.get("return_features", False) else logits


def fused_decode(model):
    """The model with the fused CPU step (a FastGPT2's decode_path), for inference on a CPU; where the
    model cannot take it a note says why and the model is left as it is. Returns the model."""
    if (why := why_not(model)) is not None:
        note_once(f"note: the fused CPU step is not for this model ({why}); it stays eager", sys.stderr)
        return model
    if not is_fused(model):
        model.decode_path = FusedCPUStep(model)
    return model


def choose_fused(model) -> tuple[bool, str]:
    """compile="auto" on a CPU, for a model that can take the fused step: (whether it is faster than
    eager here, why), measured once per machine for the model's shape and format and kept with the
    kernel choices (gpt2/speed/kernel_cache.py). The model is left with the path chosen."""
    from .compiled import decide_path, model_key

    what = model_key(model) | {"quantize": model.quantize, "step": native.step_tag()}
    c = model.config
    return decide_path(model, "fused_cpu", what, _measure, fused_decode, unfuse,
                       f"whether the fused CPU step is faster for this {c.n_layer}-block width-{c.n_embd} model")


@torch.inference_mode()
def _measure(model, rounds: int = 5) -> tuple[bool, str]:
    """Time a 1-row step and a 5-row verification, eager and fused, in turns; the fastest of
    `rounds` each (noise only ever adds time)."""
    from .compiled import faster_than_eager, time_in_turns

    fused = FusedCPUStep(model)
    times = time_in_turns(model, {"eager": unfuse, "fused": lambda m: setattr(m, "decode_path", fused)}, rounds)
    unfuse(model)
    use, verdict, ms = faster_than_eager(times, "fused")
    return use, f"fused CPU step {verdict} here ({ms})"


def is_fused(model) -> bool:
    return isinstance(getattr(model, "decode_path", None), FusedCPUStep)


def unfuse(model):
    """Take the fused CPU step off `model` again; returns the model."""
    if is_fused(model):
        model.decode_path = None
    return model
