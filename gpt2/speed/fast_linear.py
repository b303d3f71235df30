"""The CPU kernels a linear layer can run on: x @ W.T + bias, each a callable (x, bias) -> y built
once from a weight [out, in]. gpt2/speed/kernels.py decides which of them works on this CPU and which is
fastest for each number of rows; this file only says how each one computes.

Decoding one token reads every weight once, so on a CPU a step takes (bytes of weights) / (memory
bandwidth): halving the bytes should halve the step. The kernels here are the candidates
`python -m benchmarks.linear_kernels` found most promising (docs/linear_kernels.md):

  - float32: oneDNN on the plain weights (OneDNNLinear), PyTorch's F.linear (PlainLinear, MKL on
    x86), or torch.mm(W, x.T) (TransposedMM: a matrix times a few columns, which some CPUs run
    faster than oneDNN for a few rows; docs/linear_kernels.md).
  - float32 for verifications: oneDNN on weights reordered once for a few rows
    (OneDNNPackedForRows), as bfloat16's below.
  - bfloat16: oneDNN with the weights reordered ONCE into its blocked layout
    (torch.ops.mkldnn._reorder_linear_weight), instead of plain [out, in] weights per call. Needs
    AVX-512 (or AVX-NE-CONVERT) on x86: gpt2/speed/kernels.py probes for it.
  - int8 (weight-only, per output channel, symmetric): our C kernel (NativeInt8Linear, below),
    float32 activations, sums and outputs. The library's int8 products, torch._weight_int8pack_mm
    with bfloat16 activations (Int8Weight) and the same on oneDNN's bfloat16 matmul (Int8AsBF16),
    round their outputs to bfloat16; they stay here for the benchmarks to compare.
  - w8a8 (quantize="w8a8"): int8's weights, and each input row rounded to int8 in blocks of 32,
    multiplied on integer dot products (NativeW8A8Linear; w8a8_reference writes it out).
  - float16 weights in a float32 model (quantize="fp16"): fbgemm's fp16 GEMM
    (torch.ops.quantized.linear_dynamic_fp16), which reads the 16-bit weights and multiplies in
    float32, on any x86 CPU with AVX2.
  - our own C kernel for a few rows (NativeRowsLinear, gpt2/speed/csrc/rows_linear.c, AVX2 with FMA and
    F16C), on float16, float32 or int8 weights: each weight row is read from memory once for all the
    rows, and a row's result is the same bits alone or among others.

The parameters of a model stay ordinary tensors holding the same values, so every kernel computes
the same function up to rounding, and anything that makes new tensors (model.to(...),
load_state_dict) simply drops the kernels.
"""

import torch
import torch.nn.functional as F

from . import native

# The weight formats that are not a dtype (quantize's choices): a float32 model holding its
# linear weights in another form.
WEIGHT_FORMATS = ("int8", "fp16", "w8a8")
QUANTIZE_CHOICES = (None, *WEIGHT_FORMATS)
# The formats whose weights are int8 bytes and per-output scales (w8a8 rounds the inputs too).
INT8_FORMATS = ("int8", "w8a8")
# _weight_int8pack_mm is fast with bf16 activations only (Int8Weight, Int8AsBF16 round their inputs
# and outputs to bf16; the int8 format's own kernel, NativeInt8Linear, does not).
INT8_ACTIVATION_DTYPE = torch.bfloat16


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: weight [out, in] ~ q [out, in] int8 * scale [out] fp32,
    q in [-127, 127] and scale = max |row| / 127 (computed in fp32)."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale[:, None]).to(dtype)


class PlainLinear:
    """F.linear on the weight as it is (PyTorch's default: MKL for float32 on x86)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out], in x's dtype (the weight's)."""
        return F.linear(x, self.weight, bias)


class OneDNNLinear:
    """oneDNN's inner product on the plain [out, in] weight (float32, or bfloat16 where the CPU
    has the instructions). Inference only: the op has no autograd formula."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, bias, "none", [], "")


class TransposedMM:
    """y.T = W @ x.T: the weight as the left operand, the few rows of x as columns. The same
    product as F.linear with the operands swapped, which BLAS libraries route to other kernels."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        y = torch.mm(self.weight, rows.T).T.reshape(*x.shape[:-1], -1)  # [..., out]
        return y if bias is None else y + bias


class OneDNNPackedWeight:
    """A bf16 weight [out, in] reordered once into oneDNN's blocked layout (extra memory: one
    copy of the weight)."""

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] bf16 -> [..., out] bf16."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class OneDNNPackedForRows(OneDNNPackedWeight):
    """A float32 weight [out, in] reordered once into the layout oneDNN picks for a verification's
    few rows (gamma + 1 = 5 by default; the layout depends on the rows it is packed for). On some
    CPUs a few rows run faster on it than on the plain weight, where oneDNN's and MKL's few-row
    products cost well above a 1-row one (gpt2/speed/kernels.py uses it only where it measures faster).
    Extra memory: one float32 copy of the weight."""

    ROWS = 5

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, self.ROWS)


class FP16Weight:
    """A float32 weight stored as float16 for fbgemm, which multiplies in float32:
    y = x @ fp16(W).T + bias."""

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] float32 -> [..., out] float32."""
        y = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return y if bias is None else y + bias


class NativeRowsLinear:
    """Our C kernel (gpt2/speed/csrc/rows_linear.c, compiled on first use by gpt2/speed/native.py): the weight
    copied into panels of 16 output rows, as float16 ("native-fp16": a float32 weight holding
    float16-rounded values, 2 bytes a weight) or float32 ("native-f32": a second float32 copy);
    float32 math. Every output is one running sum in one fixed order, so a row gives the same bits
    alone (a decode step) as among others (a verification), unlike the library kernels, which run
    other code for other row counts."""

    scale = None  # int8's per-output scale (NativeInt8Linear)
    lib = None  # a build of the kernel (native.library(wide_build=...)); None: this CPU's

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype):
        self.panels, self.out = native.pack_panels(weight.detach(), dtype), weight.shape[0]

    @classmethod
    def from_panels(cls, panels: torch.Tensor, out: int, scale: torch.Tensor | None = None):
        """The kernel on panels packed before (pack_panels of a weight with `out` rows, e.g. mapped
        from the weight cache), without packing again; int8 panels take their scale [out], as
        NativeInt8Linear keeps it."""
        kernel = cls.__new__(cls)
        kernel.panels, kernel.out = panels, out
        if scale is not None:
            kernel.scale = scale.float().contiguous()
        return kernel

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype (float32 math)."""
        y = native.rows_linear(x.float(), self.panels, self.out,
                               None if bias is None else bias.detach().float().contiguous(), self.scale, self.lib)
        return y.to(x.dtype)


class NativeInt8Linear(NativeRowsLinear):
    """Our C kernel on int8 weights ("native-int8"): q copied into panels of 16 output rows (1 byte a
    weight). The int8 format's one computation (gpt2/speed/kernels.py): y = (x @ q.T) * scale + bias
    with x as given (float32), each output's sum of q * x in float32 in one fixed order, times its
    float32 scale, then the bias; nothing rounded to 16 bits, so an int8 head's logits keep
    float32's precision. With NativeRowsLinear's property: a row gives the same bits alone as
    among others."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        self.panels, self.out = native.pack_panels(q, torch.int8), q.shape[0]
        self.scale = scale.float().contiguous()


class NativeW8A8Linear(NativeRowsLinear):
    """Our C kernel's w8a8 computation ("native-w8a8", the "w8a8" format): the int8 format's
    weights (q, scale), and each input row rounded to int8 too, in blocks of W8A8_BLOCK inputs with
    a float32 scale each; each block's products summed exactly in integers (AVX512-VNNI's or AVX2's
    integer dot products), the blocks' sums added in float32 in order, times the weight's scale,
    plus the bias (w8a8_reference writes it out). A verification's rows then cost integer
    arithmetic, a fraction of float32's; its outputs stay float32 but move further from float32's
    than int8's do (the inputs are rounded too). A row gives the same bits alone as among others."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor):
        self.panels, self.out = native.pack_quad_panels(q), q.shape[0]
        self.scale = scale.float().contiguous()


# Inputs per block of the w8a8 computation's rounding (QBLOCK in rows_linear.c).
W8A8_BLOCK = 32


def w8a8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, in] float32 -> (xq [rows, in] int64 in [-127, 127], xs [rows, blocks] float32): the
    w8a8 computation's rounding of its inputs, block by block of W8A8_BLOCK inputs (the last one
    shorter): xs a block's largest |x| / 127, xq = round-half-even(x / xs) (0 where xs is 0)."""
    rows, inputs = x.shape
    blocks = -(-inputs // W8A8_BLOCK)
    padded = torch.zeros(rows, blocks * W8A8_BLOCK, dtype=torch.float32)
    padded[:, :inputs] = x
    padded = padded.view(rows, blocks, W8A8_BLOCK)
    xs = padded.abs().amax(dim=-1) / torch.tensor(127.0)
    safe = torch.where(xs > 0, xs, torch.ones_like(xs))
    xq = torch.round(padded / safe[..., None]).clamp(-127, 127)
    xq = torch.where(xs[..., None] > 0, xq, torch.zeros_like(xq)).to(torch.int64)
    return xq.view(rows, -1)[:, :inputs], xs


def w8a8_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
                   ) -> torch.Tensor:
    """The w8a8 computation written out in PyTorch (slow; the tests hold the C kernel to it, bit
    for bit): x [..., in] float32, q [out, in] int8, scale [out], bias [out] or None -> [..., out]."""
    flat = x.reshape(-1, x.shape[-1]).float()
    xq, xs = w8a8_quantize(flat)
    rows, inputs = flat.shape
    blocks = xs.shape[1]
    pad = blocks * W8A8_BLOCK - inputs
    xq_b = F.pad(xq, (0, pad)).view(rows, blocks, W8A8_BLOCK)
    q_b = F.pad(q.to(torch.int64), (0, pad)).view(q.shape[0], blocks, W8A8_BLOCK)
    sums = torch.einsum("rbk,obk->rob", xq_b, q_b)  # exact: int64
    acc = torch.zeros(rows, q.shape[0], dtype=torch.float32)
    for b in range(blocks):  # in order, a float32 multiply then a float32 add
        acc = acc + sums[:, :, b].to(torch.float32) * xs[:, b:b + 1]
    y = acc * scale.float()
    if bias is not None:
        y = y + bias.float()
    return y.view(*x.shape[:-1], q.shape[0])


class Int8Weight:
    """Weight-only int8 on torch._weight_int8pack_mm: y = (x @ q.T) * scale + bias with x and the
    scale rounded to bfloat16 and the output rounded to bfloat16. Not a kernel of the int8 format
    (gpt2/speed/kernels.py says why); benchmarks compare against it."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = INT8_ACTIVATION_DTYPE):
        self.q, self.scale, self.dtype = q.contiguous(), scale.to(dtype), dtype

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(self.dtype), self.q, self.scale)
        y = y.view(*x.shape[:-1], -1).to(x.dtype)
        return y if bias is None else y + bias


class Int8AsBF16:
    """Weight-only int8 on oneDNN's bfloat16 matmul (AMX / AVX512-BF16), for several rows at once (not
    a kernel of the int8 format: its outputs are bfloat16, gpt2/speed/kernels.py):
    y = (x @ q.T) * scale + bias with Int8Weight's numbers. The int8 values q are integers in
    [-127, 127], exact in bfloat16, so the bfloat16 copy (pre-packed once; extra memory: 2 bytes a
    weight) holds the same weights; x is rounded to bfloat16 as Int8Weight rounds it, each
    product is exact, the sums are float32, and the scale (the same bfloat16 scale) multiplies the
    float32 sum inside oneDNN (a "mul" post-op) before the one rounding to bfloat16. So the two
    differ only in the order of the float32 additions: an output now and then by one bfloat16
    step. _weight_int8pack_mm reads the weights once per 4 rows; this reads them once."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = INT8_ACTIVATION_DTYPE):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(q.to(torch.bfloat16), 1)
        self.scale, self.dtype = scale.to(dtype), dtype

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        rows = x.reshape(-1, x.shape[-1]).to(self.dtype)  # [M, in]
        scale = self.scale.expand(rows.shape[0], -1)  # [M, out]: the post-op takes the output's shape
        y = torch.ops.mkldnn._linear_pointwise.binary(rows, scale, self.packed, None, "mul")
        y = y.view(*x.shape[:-1], -1).to(x.dtype)
        return y if bias is None else y + bias
