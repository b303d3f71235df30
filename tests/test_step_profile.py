"""benchmarks/step_profile.py: the ATen matrix-vector candidate it times computes the same linear layer."""

import torch
import torch.nn.functional as F

from benchmarks.step_profile import aten_mv


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
