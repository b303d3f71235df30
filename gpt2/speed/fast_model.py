"""The accelerated model's own classes: what gpt2.speed.accelerate returns, and what print(model)
shows of it.

  FastGPT2       gpt2/model.py's GPT2 with its output head as a module (`lm_head`, a FastLinear on
                 the token embedding's weight: still tied) and an optional compiled or graphed
                 decode path (`decode_path`). Everything else is GPT2's own code.
  FastLinear     a linear layer on the kernel chosen for this machine (gpt2/speed/kernels.py); its
                 repr names the weight format and the kernel for each number of rows.
  FastEmbedding  the token embedding when its weight is held in another layout than a plain
                 tensor (int8 bytes, float16 values, packed panels): a lookup decodes only the
                 rows it reads.

A weight a kernel reads as it is (a float32 weight on oneDNN, say) stays an ordinary parameter:
an edit reaches the kernel. A weight held as the kernel's own bytes (a StoredWeight) is read-only:
its `.weight` is decoded into a new tensor on demand, and an in-place edit of that raises an error
that says how to get the plain model (`FastGPT2.to_plain()`, or load_gpt2 without speed options),
instead of being silently lost.
"""

import itertools
import os
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..model import GPT2
from .fast_linear import WEIGHT_FORMATS
from .stored_weights import StoredWeight

# Read at call time by FastLinear: False runs the plain F.linear on the same values (the
# benchmarks compare the two faces of one model this way; GPT2_FAST_LINEAR=0 sets it for a run).
ENABLED = os.environ.get("GPT2_FAST_LINEAR", "1") != "0"

READ_ONLY = ("this weight is held as the bytes its kernel reads ({held}), and {what}.weight is a copy "
             "decoded from them: an edit would not reach the model. Weights of an accelerated model are "
             "read-only. To edit weights, use the plain model: load_gpt2(path) with no speed options "
             "(gpt2/model.py as written), or model.to_plain() (float32 parameters holding this format's values).")


class DecodedWeight(torch.Tensor):
    """A weight decoded from a StoredWeight: an ordinary tensor of the values the kernel computes
    with, whose in-place operations raise (READ_ONLY) instead of editing a copy nobody reads.
    Anything computed from it is a plain tensor."""

    why = "an accelerated model's weight is read-only"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        in_place = name in IN_PLACE or (name.endswith("_") and not name.startswith("_") and name != "requires_grad_")
        if (in_place and args and isinstance(args[0], DecodedWeight)) or isinstance(kwargs.get("out"), DecodedWeight):
            raise RuntimeError(args[0].why if args and isinstance(args[0], DecodedWeight) else cls.why)
        if func is torch.Tensor.data.__get__:
            return args[0]  # .data of a read-only weight is that weight (an edit through it raises too)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


# Tensor methods that write into the tensor they are called on, besides the name_ ones.
IN_PLACE = {"__setitem__", "set_", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
            "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}


def decoded(stored: StoredWeight, what: str) -> DecodedWeight:
    """stored's plain weight, made now, as a read-only DecodedWeight whose error names `what`."""
    weight = stored.decode().detach().as_subclass(DecodedWeight)
    weight.why = READ_ONLY.format(held=stored.describe(), what=what)
    return weight


HANDLES = itertools.count()
LAYERS: "weakref.WeakValueDictionary[int, FastLinear]" = weakref.WeakValueDictionary()


class FastLinear(nn.Module):
    """x [..., in] -> x @ W.T + bias [..., out] on `kernel` (a gpt2.speed.kernels.RowsAwareKernel:
    one kernel per range of row counts). W is `weight` (an nn.Parameter the kernel reads as it is)
    or `stored` (a StoredWeight: the kernel's own bytes; `weight` then decodes a read-only copy).
    Runs the kernel at inference on a CPU while ENABLED, else F.linear on the same values (training,
    another device, GPT2_FAST_LINEAR=0)."""

    def __init__(self, weight: nn.Parameter | StoredWeight, bias: nn.Parameter | None, kernel, fmt: str):
        super().__init__()
        # a number naming this layer to code that calls it through an opaque op (the compiled
        # decode path, gpt2/speed/compiled.py): a buffer, so a compiled graph takes it as an input
        handle = next(HANDLES)
        LAYERS[handle] = self
        self.register_buffer("handle", torch.tensor(handle), persistent=False)
        self.out_features, self.in_features = weight.shape
        self.format, self.kernel = fmt, kernel
        self.stored = weight if isinstance(weight, StoredWeight) else None
        if self.stored is None:
            self.register_parameter("plain_weight", weight)
        self.bias = bias

    @property
    def weight(self) -> torch.Tensor:
        """W [out, in]: the parameter itself, or (held as a StoredWeight) a read-only copy decoded now."""
        return self.plain_weight if self.stored is None else decoded(self.stored, "this layer's")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the compiled decode path: the kernel as one opaque op
            return torch.ops.gpt2.fast_linear(x, self.handle, self.out_features)
        inference = not (torch.is_grad_enabled() and (x.requires_grad or (self.stored is None and self.plain_weight.requires_grad)))
        if ENABLED and inference and x.device.type == "cpu":
            return self.kernel(x, self.bias)
        weight = self.plain_weight if self.stored is None else self.stored.decode()
        return F.linear(x, weight.to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        held = f", held={self.stored.describe()}" if self.stored is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}, kernel=({self.kernel.describe()}){held}")


class FastEmbedding(nn.Module):
    """The token embedding on a StoredWeight [vocab, n_embd]: idx [...] -> its rows [..., n_embd],
    decoding only the rows read. `weight` decodes the whole table, read-only."""

    def __init__(self, stored: StoredWeight):
        super().__init__()
        self.num_embeddings, self.embedding_dim = stored.shape
        self.stored = stored

    @property
    def weight(self) -> torch.Tensor:
        return decoded(self.stored, "the token embedding's")

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.stored.rows(idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.stored.format}, held={self.stored.describe()}"


class FastGPT2(GPT2):
    """GPT2 with the output head as a module, `lm_head` (a FastLinear reading the token embedding's
    own weight, so the two stay tied), and `decode_path`: None (eager), or a compiled or CUDA-graph
    decode path (gpt2.speed.compiled, cuda_graph) that serves the calls it can and sends the others
    to GPT2.forward. Built by gpt2.speed.accelerate; `format` names the weight format."""

    def __init__(self, config):
        super().__init__(config)
        self.lm_head: FastLinear | None = None  # set by gpt2.speed.kernels.attach_kernels
        self.decode_path = None
        self.format = "float32"
        self.kernel_choice = ""  # one line per format: which kernel runs where, and how it was chosen

    @classmethod
    def holding(cls, plain: GPT2) -> "FastGPT2":
        """A FastGPT2 on the plain model's own tensors (shared, not copied), nothing attached yet:
        what gpt2.speed.kernels.attach_kernels then puts on kernels (tests and benchmarks that
        choose the kernels themselves start here)."""
        with torch.device("meta"):
            model = cls(plain.config)
        model.load_state_dict(plain.state_dict(), assign=True)
        model.format = str(plain.wpe.weight.dtype).removeprefix("torch.")
        return model.requires_grad_(False).eval()

    def forward(self, idx, cache=None, num_last_logits=None, **options):
        if self.decode_path is not None:
            return self.decode_path(idx, cache, num_last_logits, **options)
        return super().forward(idx, cache, num_last_logits, **options)

    def eager_forward(self, idx, cache=None, num_last_logits=None, **options):
        """GPT2.forward as written (what a decode path falls back to)."""
        return super().forward(idx, cache, num_last_logits, **options)

    def new_kv_cache(self, batch_size: int = 1, max_len: int | None = None, extra_slots: int = 0,
                     n_layer: int | None = None):
        """GPT2.new_kv_cache, or the decode path's own (a CUDA-graph path keeps its buffers in a pool)."""
        make = getattr(self.decode_path, "new_kv_cache", None) or self.eager_new_kv_cache
        return make(batch_size, max_len, extra_slots, n_layer)

    def eager_new_kv_cache(self, batch_size: int = 1, max_len: int | None = None, extra_slots: int = 0,
                           n_layer: int | None = None):
        """GPT2.new_kv_cache as written."""
        return super().new_kv_cache(batch_size, max_len, extra_slots, n_layer)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return super().head(x) if self.lm_head is None else self.lm_head(x)

    @property
    def quantize(self) -> str | None:
        """The weights' format where it is not the dtype's: "int8", "fp16" (float16 weights in a
        float32 model), "w8a8", else None."""
        return self.format if self.format in WEIGHT_FORMATS else None

    def num_parameters(self) -> int:
        """The weights' count, those held as StoredWeights included (the tied head's once)."""
        stored = {id(m.stored): m.stored.numel() for m in self.modules() if getattr(m, "stored", None) is not None}
        return super().num_parameters() + sum(stored.values())

    def extra_repr(self) -> str:
        return f"format={self.format}" + (f", decode_path={type(self.decode_path).__name__}" if self.decode_path else "")

    def embedding_weight(self):
        """The token embedding's weight as held: an nn.Parameter or a StoredWeight (the tied head's)."""
        return self.wte.stored if isinstance(self.wte, FastEmbedding) else self.wte.weight

    def to_plain(self) -> GPT2:
        """A plain GPT2 (gpt2/model.py, nn.Linear everywhere) whose parameters hold this model's
        values in its dtype (an int8 model's dequantized weights, say): the model to edit, probe or
        train. A new model: this one is unchanged."""
        plain = GPT2(self.config).to(device=self.wpe.weight.device, dtype=self.wpe.weight.dtype)
        state = {name: t for name, t in self.state_dict().items()
                 if not name.startswith("lm_head.") and not name.endswith("plain_weight")}
        for name, module in self.named_modules():
            if isinstance(module, (FastLinear, FastEmbedding)) and name != "lm_head":
                state[f"{name}.weight"] = module.weight.as_subclass(torch.Tensor).clone() \
                    if module.stored is not None else module.plain_weight.detach().clone()
        if isinstance(self.wte, nn.Embedding):
            state["wte.weight"] = self.wte.weight.detach().clone()
        plain.load_state_dict(state)
        return plain.requires_grad_(False).eval()
