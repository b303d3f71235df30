"""What an accelerated model holds for a linear weight whose kernel reads another layout than a
plain tensor: the bytes that kernel reads, once.

A `StoredWeight` is not a tensor: it is a small record of a weight [out, in] held as `layouts`
(the int8 bytes and scales, the float16 values, a kernel's packed panels, ...), with the dtype its
values decode to. gpt2/speed/fast_model.py's FastLinear and FastEmbedding hold one; their
`.weight` decodes it into a new, read-only tensor (an edit there could never reach what the
kernel reads, so it raises instead of being lost).

    layer = model.h[0].mlp.c_fc                     # FastLinear(..., format=int8, kernel=...)
    layer.stored                                    # StoredWeight(int8: q [5120, 1280] int8, scale [5120] float32)
    layer.stored.decode()                           # the float32 weight [5120, 1280], q * scale, made now
    layer.stored.layouts                            # {"q": ..., "scale": ...}: what the model holds

A layout is a name and a tensor (or a library's opaque packed object):
  "q", "scale"      int8 weights [out, in] and their float32 scales [out]: q * scale
  "half"            float16 weights [out, in] (a float32 model's "fp16" format): half.float()
  "plain"           the weight itself in the model's dtype (before a kernel packed it)
  "panels"          our C kernel's panels (gpt2.speed.native.pack_panels; pack_quad_panels, uint8, for
                    w8a8), with "scale" for int8 and w8a8
  "packed"          a library's packed weight (oneDNN's blocked layout, fbgemm's packed float16):
                    opaque, decoded by the library (its own unpacking)
A kernel that packs its weight replaces the layout it was packed from (`replace`), so the bytes
the model holds are the bytes its kernel reads.
"""

import ctypes

import torch

from . import native
from .fast_linear import dequantize_int8, int8_per_channel

# Layouts whose bytes can be written to a file and mapped back (the library ones are opaque).
STORABLE = ("q", "scale", "half", "plain", "panels")


class StoredWeight:
    """A weight [out, in] held as `layouts` (see the module docstring). `shape` is the weight's,
    `dtype` the dtype decode() returns, `device` where the layouts live."""

    def __init__(self, fmt: str, layouts: dict, shape, dtype: torch.dtype):
        """fmt: the weight format ("int8", "w8a8", "fp16", "float32", "bfloat16"); layouts: name -> tensor;
        shape [out, in] and dtype: what the weight decodes to."""
        self.format, self.layouts = fmt, dict(layouts)
        self.shape, self.dtype = torch.Size(shape), dtype
        self.device = next(t.device for t in layouts.values() if isinstance(t, torch.Tensor))
        self.decoder = None  # () -> plain tensor, for a "packed" layout (the library's unpacking)

    def numel(self) -> int:
        return self.shape.numel()

    def decode(self) -> torch.Tensor:
        """The plain weight [out, in] in self.dtype, computed now from the stored layouts (a new
        tensor: nothing is kept)."""
        layouts = self.layouts
        if "q" in layouts:
            return dequantize_int8(layouts["q"], layouts["scale"], self.dtype)
        if "panels" in layouts:
            rows = self.panel_weight()
            return dequantize_int8(rows, layouts["scale"], self.dtype) if "scale" in layouts else rows.to(self.dtype)
        if "half" in layouts:
            return layouts["half"].to(self.dtype)
        if "plain" in layouts:
            return layouts["plain"]
        return self.decoder().to(self.dtype)

    def int8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q [out, in] int8, scale [out] float32) of an int8 weight, for a kernel that reads them:
        the held q, or q read back from the panels (exact) where the panels replaced it."""
        if "q" in self.layouts:
            return self.layouts["q"], self.layouts["scale"]
        if "panels" in self.layouts:
            return self.panel_weight().contiguous(), self.layouts["scale"]
        return int8_per_channel(self.decode())  # a library's packed int8: its values give back q, scale

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` [...] of the plain weight -> [..., in], decoding only those (an embedding
        lookup: model.wte(idx) reads a few rows of the vocabulary's weight, not all of it)."""
        layouts, flat = self.layouts, index.reshape(-1)
        if "q" in layouts:
            picked = dequantize_int8(layouts["q"][flat], layouts["scale"][flat], self.dtype)
        elif "panels" in layouts:
            panels = layouts["panels"]
            rows = (native.quad_panel_rows(panels, flat, self.shape[1]) if panels.dtype == torch.uint8
                    else native.panel_rows(panels, flat))
            picked = (dequantize_int8(rows, layouts["scale"][flat], self.dtype) if "scale" in layouts
                      else rows.to(self.dtype))
        elif "half" in layouts or "plain" in layouts:
            picked = layouts.get("half", layouts.get("plain"))[flat].to(self.dtype)
        else:
            picked = self.decode()[flat]
        return picked.view(*index.shape, self.shape[1])

    def panel_weight(self) -> torch.Tensor:
        """The weight [out, in] (int8's q where a scale is held) read back from our C kernel's
        panels: its 16-row panels, or the w8a8 kernel's quad panels (uint8)."""
        panels = self.layouts["panels"]
        if panels.dtype == torch.uint8:
            return native.unpack_quad_panels(panels, self.shape[0], self.shape[1])
        return native.unpack_panels(panels, self.shape[0])

    def replace(self, old: tuple[str, ...], new: dict, decode=None) -> None:
        """A kernel packed this weight into `new` (layout name -> tensor): drop the layouts `old` it
        was packed from (the kernel reads the new ones; decode() now decodes those)."""
        for name in old:
            self.layouts.pop(name, None)
        self.layouts.update(new)
        if decode is not None:
            self.decoder = decode

    def nbytes_stored(self) -> int:
        """The bytes of the layouts held (a library's opaque layout counted as its elements' bytes)."""
        return sum(layout_nbytes(t) for t in self.layouts.values())

    def describe(self) -> str:
        """"int8: q [5120, 1280] int8, scale [5120] float32"-style: what is held."""
        parts = [f"{name} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor)
                 else f"{name} ({type(t).__name__})" for name, t in self.layouts.items()]
        return ", ".join(parts)

    def __repr__(self):
        return f"StoredWeight({self.format}: {self.describe()}; decodes to {list(self.shape)} {str(self.dtype).removeprefix('torch.')})"


def layout_nbytes(t) -> int:
    """Bytes of one layout: a tensor's elements (an opaque oneDNN tensor too); a library's packed
    object: 0 here (counted by its kernel, gpt2.speed.kernels.held_tensors)."""
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def stored(weight) -> StoredWeight | None:
    """The StoredWeight behind a parameter, or None for a plain tensor."""
    return weight if isinstance(weight, StoredWeight) else None


def give_back_freed_memory() -> None:
    """Return to the system the memory just freed (a weight's float32 copy read from the file, the
    quantizing's or packing's temporaries): glibc keeps freed blocks for reuse, so the freed copies
    of many weights would otherwise add up to the process's peak. Nothing where the C library is
    not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # macOS, Windows, musl: nothing to do
        pass
