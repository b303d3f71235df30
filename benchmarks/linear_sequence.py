"""The linear layers of one gpt2-large step, back to back, through three doors: the C kernel
alone, its Python wrapper, and the model's own path. Where does a step lose time between the
kernel and the model?

    python -m benchmarks.linear_sequence --format int8 --rows 1 5 --threads 2
    python -m benchmarks.linear_sequence --quick          # smoke run

A step calls a linear layer 145 times (36 blocks x 4, then the head), each on its own weights, so
the weights come from memory: the floor is their bytes / the read bandwidth (x.sum(), measured in
the same run). Each layer here has its own random weights in the C kernel's panels
(gpt2/speed/csrc/rows_linear.c; int8 per channel, or float16), and one pass calls all of them in a
step's order, through:
  - kernel: the compiled function through ctypes, its arguments made once (what the kernel
    costs, plus ctypes' few microseconds a call);
  - wrapper: gpt2.speed.native.rows_linear (a call's tensors and pointers made in Python);
  - model: the FastLinear module gpt2.speed.accelerate puts in the model (what
    gpt2/model.py calls: module call, kernel choice by rows, the wrapper).
The doors run in turns, passes of --rows rows each; medians over --rounds. Every door's output is
checked equal, bit for bit, to the kernel's on the first pass. What a door adds over the one
before is its Python, per call.

Writes <out>/results.json and <out>/results.md.
"""

import argparse

import torch
from torch import nn

from gpt2.speed import native
from gpt2.speed.fast_linear import NativeInt8Linear, NativeRowsLinear
from gpt2.speed.fast_model import FastLinear
from gpt2.speed.kernels import RowsAwareKernel
from gpt2.speed.stored_weights import StoredWeight

from .common import (BYTES_PER_GB, add_output_options, machine_info, markdown_table, measure_read_bandwidth,
                     median, timed, write_results)
from .linear_kernels import SHAPES

DOORS = ("kernel", "wrapper", "model")
FORMATS = ("int8", "fp16")


class Layer:
    """One linear layer's weights in the kernel's panels, and the three ways to call it."""

    def __init__(self, out: int, inputs: int, fmt: str, generator: torch.Generator):
        if fmt == "int8":
            q = torch.randint(-127, 128, (out, inputs), dtype=torch.int8, generator=generator)
            self.kernel = NativeInt8Linear(q, torch.rand(out, generator=generator) / 127)
        else:
            self.kernel = NativeRowsLinear(torch.randn(out, inputs, generator=generator) / inputs ** 0.5,
                                           torch.float16)
        self.bias = torch.randn(out, generator=generator) * 0.01
        self.out, self.inputs = out, inputs
        # The model's door: a FastLinear as gpt2.speed.accelerate makes it, holding the kernel's panels.
        layouts = {"panels": self.kernel.panels} | ({"scale": self.kernel.scale} if fmt == "int8" else {})
        self.module = FastLinear(StoredWeight(fmt, layouts, (out, inputs), torch.float32),
                                 nn.Parameter(self.bias, requires_grad=False),
                                 RowsAwareKernel([(float("inf"), "native", self.kernel)]), fmt)

    def bytes(self) -> int:
        return self.kernel.panels.numel() * self.kernel.panels.element_size()

    def wrapped(self, x: torch.Tensor) -> torch.Tensor:
        """The wrapper's door: gpt2.speed.native.rows_linear on this layer."""
        return native.rows_linear(x, self.kernel.panels, self.out, self.bias, self.kernel.scale)

    def bare_call(self, x: torch.Tensor, y: torch.Tensor, threads: int):
        """The kernel's function and its arguments, ready to call: fn(*args) computes y from x."""
        scale = self.kernel.scale
        args = (x.data_ptr(), x.shape[0], self.inputs, self.kernel.panels.data_ptr(), self.out,
                None if scale is None else scale.data_ptr(), self.bias.data_ptr(), y.data_ptr(), threads)
        return native.library().by_dtype[self.kernel.panels.dtype], args


def step_layers(fmt: str, scale_down: int = 1) -> list[Layer]:
    """A gpt2-large step's linear layers, in its order (scale_down: every size divided, and as many
    blocks, for a smoke run)."""
    g = torch.Generator().manual_seed(0)
    blocks = SHAPES["c_attn"][2] // scale_down
    block = [SHAPES[name][:2] for name in ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj")]
    shapes = block * blocks + [SHAPES["head"][:2]]
    return [Layer(out // scale_down, inputs // scale_down, fmt, g) for out, inputs in shapes]


def passes(layers: list[Layer], rows: int, threads: int) -> dict:
    """door -> a function running one pass over every layer (rows rows each), and a check that
    every door computes the kernel's bits."""
    g = torch.Generator().manual_seed(1)
    xs = {n: torch.randn(rows, n, generator=g) for n in {layer.inputs for layer in layers}}
    ys = [torch.empty(rows, layer.out) for layer in layers]
    bare = [layer.bare_call(xs[layer.inputs], y, threads) for layer, y in zip(layers, ys)]

    def kernel(buffers=(xs, ys)):  # (kept alive with it: the arguments point into them)
        for fn, args in bare:
            fn(*args)

    def wrapper():
        for layer in layers:
            layer.wrapped(xs[layer.inputs])

    def model():
        for layer in layers:
            layer.module(xs[layer.inputs])

    kernel()
    for layer, y in zip(layers, ys):
        x = xs[layer.inputs]
        for door, got in (("wrapper", layer.wrapped(x)), ("model", layer.module(x))):
            if not torch.equal(got, y):
                raise AssertionError(f"the {door} door's output differs from the kernel's")
    return {"kernel": kernel, "wrapper": wrapper, "model": model}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", choices=FORMATS, default="int8", help="the weights' format (default int8)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 5], help="rows a call (1: a step; 5: verify 4 tokens)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    add_output_options(p, "linear_sequence", "every size divided by 8, 2 rounds")
    args = p.parse_args(argv)
    reason = native.why_not()
    if reason:
        raise SystemExit(f"error: the C kernel does not run here: {reason}")
    scale_down = 8 if args.quick else 1
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(args.threads)
    layers = step_layers(args.format, scale_down)
    nbytes = sum(layer.bytes() for layer in layers)
    print(f"{len(layers)} layers, {nbytes / BYTES_PER_GB:.2f} GB of {args.format} panels, {args.threads} threads")
    bandwidth = measure_read_bandwidth(0.125 if args.quick else 1.0)
    floor = nbytes / (bandwidth["gb_per_s_best"] * BYTES_PER_GB)
    results = {"format": args.format, "threads": args.threads, "layers": len(layers), "bytes": nbytes,
               "read_bandwidth": bandwidth, "floor_s": floor, "rows": {}, "machine": machine_info()}
    table = []
    with torch.inference_mode():
        for rows in args.rows:
            doors = passes(layers, rows, args.threads)
            seconds = {door: [] for door in DOORS}
            for _ in range(rounds):
                for door in DOORS:  # in turns: the machine's noise hits every door alike
                    seconds[door].append(timed(None, doors[door])[1])
            results["rows"][rows] = seconds
            kernel_s = median(seconds["kernel"])
            for door in DOORS:
                s = median(seconds[door])
                table.append([rows, door, f"{s * 1e3:.1f}", f"{min(seconds[door]) * 1e3:.1f}",
                              f"{nbytes / s / BYTES_PER_GB:.1f}", f"{floor / s:.2f}",
                              "" if door == "kernel" else f"{(s - kernel_s) / len(layers) * 1e6:+.1f}"])
    md = (f"A gpt2-large step's {len(layers)} linear layers{' (every size divided by 8: --quick)' if args.quick else ''} ({args.format} panels, {nbytes / BYTES_PER_GB:.2f} GB), "
          f"back to back, {args.threads} threads; read bandwidth {bandwidth['gb_per_s_best']:.1f} GB/s "
          f"(x.sum(), best), so the floor is {floor * 1e3:.1f} ms; medians of {rounds} rounds.\n\n"
          + markdown_table(["rows", "door", "pass ms", "best ms", "GB/s", "floor / pass",
                            "us a call over the kernel"], table) + "\n")
    print("\n" + md)
    write_results(args.out, results, md)


if __name__ == "__main__":
    main()
