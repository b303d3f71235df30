"""Faster CPU kernels for GPT-2's linear layers in 16- and 8-bit weight formats.

Decoding one token reads every weight once, so on a CPU a step takes (bytes of weights) / (memory
bandwidth): halving the bytes should halve the step. PyTorch's stock 16-bit paths did not get
there in earlier measurements (a bf16 step took as long as fp32). The kernels used here are the
candidates `python -m benchmarks.linear_kernels` found most promising:

  - bfloat16: oneDNN with the weights reordered ONCE into its blocked layout
    (torch.ops.mkldnn._reorder_linear_weight), instead of plain [out, in] weights per call.
  - int8 (weight-only, per output channel, symmetric): torch._weight_int8pack_mm with bfloat16
    activations (its fp32-activation path is several times slower for a few rows).
  - float16 weights in a float32 model (quantize="fp16"): fbgemm's fp16 GEMM
    (torch.ops.quantized.linear_dynamic_fp16), which reads the 16-bit weights and multiplies in
    float32, on any x86 CPU with AVX2. On the quiet machine it read weights at the full memory
    bandwidth at one row (README, "Weight formats on CPU").

`python -m benchmarks.weight_formats` measures them end to end against float32.

`attach_fast_kernels(model)` gives each linear weight (and the tied output head, wte.weight) a
`fast_linear` attribute: a callable (x, bias) -> x @ W.T + bias in that format.
gpt2.model.linear() uses it when present, on CPU, in inference; set GPT2_FAST_LINEAR=0 to run the
plain path (F.linear / oneDNN on the parameters themselves) instead. The parameters stay ordinary
tensors holding the same values, so both paths compute the same function up to rounding, and
anything that makes new tensors (model.to(...), load_state_dict) simply drops the fast kernels.
"""

import os

import torch

ENABLED = os.environ.get("GPT2_FAST_LINEAR", "1") != "0"
QUANTIZE_CHOICES = (None, "int8", "fp16")
# _weight_int8pack_mm is fast with bf16 activations only: an fp32 model's int8 layers round their
# inputs to bf16 (the tests' tolerances include this).
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


class OneDNNPackedWeight:
    """A bf16 weight [out, in] reordered once into oneDNN's blocked layout (extra memory: one
    copy of the weight)."""

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] bf16 -> [..., out] bf16."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class FP16Weight:
    """A float32 weight stored as float16 for fbgemm, which multiplies in float32:
    y = x @ fp16(W).T + bias."""

    def __init__(self, weight: torch.Tensor):
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] float32 -> [..., out] float32."""
        y = torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        return y if bias is None else y + bias


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


class Int8Weight:
    """Weight-only int8: y = (x @ q.T) * scale + bias, computed by torch._weight_int8pack_mm."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        self.q, self.scale, self.dtype = q.contiguous(), scale.to(dtype), dtype

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(self.dtype), self.q, self.scale)
        y = y.view(*x.shape[:-1], -1).to(x.dtype)
        return y if bias is None else y + bias


def linear_weights(model):
    """The weights that go through gpt2.model.linear(): every Linear's, and wte (the head)."""
    from .model import Linear

    yield model.wte.weight
    for module in model.modules():
        if isinstance(module, Linear):
            yield module.weight


def attach_fast_kernels(model, int8: dict | None = None, fp16: bool = False) -> int:
    """Give each linear weight of a CPU model its fast kernel (see the module docstring).

    int8: parameter -> (q, scale) for weights quantized at load time (their parameters hold the
    dequantized values). fp16: the float32 model's linear weights were rounded to float16 at load
    time; they get fbgemm's fp16 kernel. bf16 weights get oneDNN pre-packed copies. Other formats
    keep the plain path. Returns how many weights got a kernel."""
    count = 0
    for weight in linear_weights(model):
        if weight.device.type != "cpu":
            continue
        if int8 is not None and weight in int8:
            weight.fast_linear = Int8Weight(*int8[weight], dtype=INT8_ACTIVATION_DTYPE)
        elif fp16 and weight.dtype == torch.float32 and fbgemm_available():
            weight.fast_linear = FP16Weight(weight)
        elif weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
            weight.fast_linear = OneDNNPackedWeight(weight)
        else:
            continue
        count += 1
    return count

