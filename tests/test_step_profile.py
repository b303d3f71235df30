"""benchmarks/step_profile.py: the ATen matrix-vector candidate it times computes the same linear
layer; the zero-output stand-in that times "the rest" of a step does no work and keeps the shapes;
a run on a tiny int8 model prints the split."""

import re

import torch
import torch.nn.functional as F
from conftest import TINY

import benchmarks.step_profile as step_profile
from benchmarks.step_profile import aten_mv, zero_output


def test_aten_mv_matches_f_linear_at_each_row_count():
    torch.manual_seed(0)
    weight = torch.randn(48, 32, dtype=torch.bfloat16)
    bias = torch.randn(48, dtype=torch.bfloat16)
    kernel = aten_mv(weight)
    for rows in (1, 3):
        x = torch.randn(1, rows, 32, dtype=torch.bfloat16)
        for b in (bias, None):
            expected = F.linear(x.float(), weight.float(), None if b is None else b.float())
            got = kernel(x, b)
            assert got.shape == (1, rows, 48)
            torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=0.3)


def test_zero_output_keeps_shapes_and_makes_each_once():
    kernel = zero_output(48)
    x1, x5 = torch.randn(1, 1, 32), torch.randn(1, 5, 32)
    y1, y5 = kernel(x1, None), kernel(x5, torch.ones(48))
    assert y1.shape == (1, 1, 48) and y5.shape == (1, 5, 48) and not y1.any() and not y5.any()
    assert kernel(torch.randn(1, 1, 32), None) is y1  # made once: timing it times nothing


def test_a_run_splits_step_and_verification_into_linear_layers_and_the_rest(make_checkpoint, monkeypatch, capsys):
    monkeypatch.setattr(step_profile, "measure_read_bandwidth", lambda: {"gb_per_s_best": 10.0})
    folder = make_checkpoint(TINY, seed=0)
    assert step_profile.main(["--checkpoint", str(folder), "--dtype", "float32", "--quantize", "int8",
                              "--threads", "1", "--steps", "2", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for what in ("step", r"verify\(5\)"):
        assert re.search(rf"  {what}: [0-9.]+ ms = linear layers -?[0-9.]+ ms.* \+ the rest [0-9.]+ ms \([0-9]+%\)", out), out
    assert re.search(r"verify\(5\) / step: [0-9.]+", out) and "no candidate for quantized ones" in out
