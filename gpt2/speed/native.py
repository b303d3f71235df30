"""Our own C kernel (gpt2/speed/csrc/rows_linear.c), compiled on this machine the first time it is
needed and called through ctypes: no build step at install, no PyTorch headers, and a machine
without a C compiler or without AVX2/FMA/F16C simply does not offer it (gpt2/speed/kernels.py's probe
says why, and the library kernels run instead).

The compiled library is kept beside the kernel cache (~/.cache/gpt2-spec/native/), under a name
made from the source, the compiler and its flags: an edit of the C file, or another compiler,
builds a new one.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from . import kernel_cache

SOURCE = Path(__file__).parent / "csrc" / "rows_linear.c"
# The fused CPU step's blocks (gpt2/speed/native_step.py): built apart, with FLAGS; it calls the
# kernels of whichever build of SOURCE holds a model's weights, through function pointers.
STEP_SOURCE = Path(__file__).parent / "csrc" / "block_step.c"
# -ffp-contract=off: only the kernel's written FMAs fuse, so the summation order is the source's.
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
NEEDS = ("avx2", "fma", "f16c")
# Where the CPU has AVX-512 (and does not act as an AVX2 one, GPT2_CPU=avx2 or avx2-vnni), the kernel is built
# with it: its loop over several rows then takes 16-lane vectors (rows_linear.c), same results.
WIDE_FLAGS = ["-mavx512f"]
# ... and where it has AVX512-VNNI, the w8a8 kernel takes its 4-byte integer dot products
# (vpdpbusd); without, the AVX2 build's 2-by-2 ones (vpmaddwd): the same exact sums.
VNNI_FLAGS = ["-mavx512bw", "-mavx512vnni"]
# An AVX2 CPU with AVX-VNNI (Intel since Alder Lake, AMD since Zen 5) gets it in its AVX2 build:
# the w8a8 kernel's vpdpbusd on 8 lanes (GPT2_CPU=avx2 leaves it out, as on a Zen 2/3).
AVX_VNNI_FLAGS = ["-mavxvnni"]

_LIBRARY: ctypes.CDLL | None = None  # this CPU's build, once loaded
_BUILDS: dict[tuple, ctypes.CDLL] = {}  # (wide, avx_vnni) -> that build, loaded
_STEP_LIBRARY: ctypes.CDLL | None = None  # block_step.c's build, once loaded


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc or gcc on the PATH (None: there is none)."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and (found := shutil.which(name)):
            return found
    return None


def why_not() -> str | None:
    """None if the kernel can be built and run here, else why not (for kernels.probe)."""
    missing = [f for f in NEEDS if f not in kernel_cache.cpu_flags()]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (the C kernel is AVX2 with FMA and F16C)"
    if compiler() is None:
        return "no C compiler found (cc, gcc, or $CC): the C kernel is compiled on first use"
    return None


def source_tag() -> str:
    """A short hash of the kernel's source: gpt2/speed/kernels.py keeps it with every measured choice
    that included this kernel, so an edited kernel is measured again."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def step_tag() -> str:
    """A short hash of block_step.c: kept with the measured choice of the fused CPU step."""
    return hashlib.sha256(STEP_SOURCE.read_bytes()).hexdigest()[:12]


def acting_as() -> str:
    """GPT2_CPU: "avx2" or "avx2-vnni" where the process acts as such a CPU (gpt2.speed.kernels
    checks the name), else ""."""
    return os.environ.get("GPT2_CPU", "").strip().lower()


def wide() -> bool:
    """Whether this CPU's build is the AVX-512 one (WIDE_FLAGS)."""
    return "avx512f" in kernel_cache.cpu_flags() and acting_as() not in ("avx2", "avx2-vnni")


def vnni() -> bool:
    """Whether this CPU's AVX-512 build takes the w8a8 kernel's VNNI instructions."""
    return {"avx512bw", "avx512_vnni"} <= set(kernel_cache.cpu_flags())


def avx_vnni() -> bool:
    """Whether this CPU's AVX2 build takes AVX-VNNI (not under GPT2_CPU=avx2)."""
    return "avx_vnni" in kernel_cache.cpu_flags() and acting_as() != "avx2"


def build_flags(wide_build: bool, avx_vnni_build: bool | None = None) -> list[str]:
    """The compiler flags of the AVX-512 build (wide_build) or the AVX2 one, that one with AVX-VNNI
    if avx_vnni_build (None: where this CPU has it)."""
    if wide_build:
        return FLAGS + WIDE_FLAGS + (VNNI_FLAGS if vnni() else [])
    return FLAGS + (AVX_VNNI_FLAGS if (avx_vnni() if avx_vnni_build is None else avx_vnni_build) else [])


def library_path(cc: str, flags: list[str], source: Path = SOURCE) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    code = source_tag() if source == SOURCE else step_tag()
    tag = hashlib.sha256("\n".join([code, *version, *flags]).encode()).hexdigest()[:16]
    return kernel_cache.cache_path().parent / "native" / f"{source.stem}-{tag}.so"


def library(wide_build: bool | None = None, avx_vnni_build: bool | None = None) -> ctypes.CDLL:
    """The compiled kernel, built now if this machine has not built this source before: this
    CPU's build, or (wide_build True/False) the AVX-512 or the AVX2 one (the tests compare them);
    avx_vnni_build: the AVX2 one with or without AVX-VNNI (None: as this CPU)."""
    global _LIBRARY
    if wide_build is None:
        if _LIBRARY is None:
            _LIBRARY = library(wide())
        return _LIBRARY
    flags = build_flags(wide_build, avx_vnni_build)
    key = (wide_build, AVX_VNNI_FLAGS[0] in flags)
    if key not in _BUILDS:
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        cc = compiler()
        path = library_path(cc, flags)
        if not path.exists():
            try:
                build(cc, path, flags)
            except RuntimeError:
                if AVX_VNNI_FLAGS[0] not in flags:
                    raise
                return library(wide_build, avx_vnni_build=False)  # a compiler without -mavxvnni
        lib = ctypes.CDLL(str(path))
        # (x, rows, in, panels, out, scale, bias, y, threads) -> 0
        for fn in (lib.rows_linear_f16, lib.rows_linear_f32, lib.rows_linear_i8, lib.rows_linear_w8a8):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        # the entry point of each panel dtype (looked up once: rows_linear runs once per layer per step)
        lib.by_dtype = {torch.float16: lib.rows_linear_f16, torch.float32: lib.rows_linear_f32,
                        torch.int8: lib.rows_linear_i8, torch.uint8: lib.rows_linear_w8a8}
        _BUILDS[key] = lib
    return _BUILDS[key]


def step_library() -> ctypes.CDLL:
    """block_step.c compiled (built now if this machine has not built this source before)."""
    global _STEP_LIBRARY
    if _STEP_LIBRARY is None:
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        cc = compiler()
        path = library_path(cc, FLAGS, STEP_SOURCE)
        if not path.exists():
            build(cc, path, FLAGS, STEP_SOURCE)
        lib = ctypes.CDLL(str(path))
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        # (x, T, C, n_head, max_len, start, mask, eps, blocks, n_blocks, keys, values, threads) -> 0
        lib.decode_blocks.restype = ctypes.c_int
        lib.decode_blocks.argtypes = [p, i64, i64, i64, i64, i64, p, ctypes.c_float, p, i64, p, p, ctypes.c_int]
        _STEP_LIBRARY = lib
    return _STEP_LIBRARY


def build(cc: str, path: Path, flags: list[str] = FLAGS, source: Path = SOURCE) -> None:
    """Compile SOURCE with flags into path (written to a temporary name, then renamed: a reader
    never loads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        done = subprocess.run([cc, *flags, str(source), "-o", str(built)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {source.name} with {cc} failed:\n{done.stderr.strip()[-2000:]}")
        os.replace(built, path)


# Output rows per panel of a packed weight (PANEL in rows_linear.c).
PANEL = 16


def pack_panels(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight [out, in] -> panels [ceil(out / PANEL), in, PANEL] in dtype: panel p holds weight
    rows PANEL p ... PANEL p + PANEL - 1, transposed (the last panel padded with zero rows), so the
    kernel reads each panel front to back, once."""
    out, inputs = weight.shape
    panels = -(-out // PANEL)
    padded = weight.new_zeros(panels * PANEL, inputs, dtype=dtype)
    padded[:out] = weight
    return padded.view(panels, PANEL, inputs).transpose(1, 2).contiguous()


def unpack_panels(panels: torch.Tensor, out: int) -> torch.Tensor:
    """pack_panels' inverse: panels [P, in, PANEL] -> the weight [out, in] (a new tensor, the
    panels' dtype)."""
    return panels.transpose(1, 2).reshape(-1, panels.shape[1])[:out]


# Inputs a w8a8 quad holds, and the bytes a w8a8 weight is stored with above its int8 value
# (rows_linear.c's w8a8 layout: unsigned bytes q + 128).
QUAD = 4
W8_OFFSET = 128


def pack_quad_panels(q: torch.Tensor) -> torch.Tensor:
    """int8 weights q [out, in] -> the w8a8 kernel's panels [ceil(out / PANEL), ceil(in / QUAD), PANEL,
    QUAD] uint8 holding q + 128: panel p, quad j holds inputs QUAD j ... QUAD j + 3 of the panel's
    PANEL outputs, one 64-byte load (padding: q = 0)."""
    out, inputs = q.shape
    panels, quads = -(-out // PANEL), -(-inputs // QUAD)
    padded = torch.full((panels * PANEL, quads * QUAD), W8_OFFSET, dtype=torch.uint8)
    padded[:out, :inputs] = (q.to(torch.int16) + W8_OFFSET).to(torch.uint8)
    return padded.view(panels, PANEL, quads, QUAD).transpose(1, 2).contiguous()


def unpack_quad_panels(panels: torch.Tensor, out: int, inputs: int) -> torch.Tensor:
    """pack_quad_panels' inverse: -> q [out, inputs] int8 (a new tensor)."""
    rows = panels.transpose(1, 2).reshape(panels.shape[0] * PANEL, -1)[:out, :inputs]
    return (rows.to(torch.int16) - W8_OFFSET).to(torch.int8)


def quad_panel_rows(panels: torch.Tensor, index: torch.Tensor, inputs: int) -> torch.Tensor:
    """Rows `index` [n] of q packed in quad panels -> [n, inputs] int8."""
    rows = panels[index // PANEL, :, index % PANEL].reshape(len(index), -1)[:, :inputs]
    return (rows.to(torch.int16) - W8_OFFSET).to(torch.int8)


def panel_rows(panels: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` [n] of the weight packed in panels -> [n, in], read from the panels directly."""
    return panels[index // PANEL, :, index % PANEL]


def entry_point(panels: torch.Tensor, lib: ctypes.CDLL | None = None):
    """The kernel's C function for these panels' dtype, in `lib` (a build; default: this CPU's):
    (x, rows, in, panels, out, scale, bias, y, threads) -> 0. rows_linear calls it; the fused CPU
    step (block_step.c) is handed its address."""
    return (lib or _LIBRARY or library()).by_dtype[panels.dtype]


def rows_linear(x: torch.Tensor, panels: torch.Tensor, out: int, bias: torch.Tensor | None,
                scale: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [..., in] float32 @ W.T + bias -> [..., out] float32, where panels = pack_panels(W, float16,
    float32 or int8) and W has `out` rows (or panels = pack_quad_panels(q): the w8a8 computation,
    rows_linear.c, the inputs rounded to int8 in blocks); bias [out] float32 contiguous. int8 panels hold q, and
    W = q * scale [out] (float32 contiguous): each output is then its float32 sum of q * x times
    its scale, then the bias (nothing rounded to 16 bits). On PyTorch's number of threads; lib: a
    build of the kernel (default: this CPU's). (Written for a call's few microseconds: it runs
    once per linear layer per step.)"""
    x = x if x.is_contiguous() else x.contiguous()
    inputs = x.shape[-1]
    if (-(-inputs // QUAD) if panels.dtype == torch.uint8 else inputs) != panels.shape[1]:
        raise ValueError(f"rows_linear: x has {inputs} inputs, the packed weight another number")
    y = torch.empty(*x.shape[:-1], out, dtype=torch.float32)
    failed = entry_point(panels, lib)(
        x.data_ptr(), x.numel() // inputs, inputs, panels.data_ptr(), out,
        None if scale is None else scale.data_ptr(), None if bias is None else bias.data_ptr(),
        y.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("rows_linear_w8a8: no memory for the quantized inputs")
    return y
