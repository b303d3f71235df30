"""The fused decode step (gpt2/speed/fused_step.py: five Triton kernels a block) on a CPU, run by
Triton's interpreter (conftest.py sets TRITON_INTERPRET=1 where there is no CUDA GPU): the same
kernels a GPU compiles, the same arithmetic, on CPU tensors.

- One block and the head equal the eager block's (gpt2/speed/compiled.py's block_step) in float32,
  for a step, verifications, two batch rows and a tree's mask, and write the same cache slots.
- A wrong mask or a wrong slot is far above the tolerance (the comparison has power).
- Through the graphed path (recorded with the CPU stand-in of tests/test_cuda_graph.py) a model
  gives eager's logits, and greedy speculative decoding gives the target's own tokens.
tests/test_cuda.py runs the kernels compiled, on a GPU, where there is one.
"""

import pytest
import torch
from conftest import TINY
from test_cuda_graph import recorder

from gpt2 import GPT2Config, load_gpt2
from gpt2.model import GPT2
from gpt2.speed import fused_step, load_accelerated
from gpt2.speed.compiled import block_step, fixed_size_inputs
from gpt2.speed.cuda_graph import graph_decode, is_graphed
from spec_decoding import autoregressive_generate, speculative_sampling_greedy

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or triton.knobs.runtime.interpret),
                                reason="needs a CUDA GPU or Triton's interpreter (TRITON_INTERPRET=1)")

# Rounding only: the kernels sum in another order than eager's. A wrong mask, slot or weight is
# off by O(1) (test_a_wrong_mask_or_slot_is_far_above_the_tolerance).
TOLERANCE = dict(atol=2e-5, rtol=1e-5)
BUFFER = 24  # cache slots
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled kernels on a GPU, else interpreted


def tiny_model(config=TINY, seed=0):
    torch.manual_seed(seed)
    model = GPT2(config).eval()
    for p in model.parameters():  # random LayerNorm weights and biases too: the kernels read them
        torch.nn.init.normal_(p, std=0.3)
    return model.to(DEVICE)


def block_inputs(B, T, start, seed, config=TINY, mask="causal"):
    g = torch.Generator().manual_seed(seed)
    head_dim = config.n_embd // config.n_head
    x = torch.randn(B, T, config.n_embd, generator=g)
    keys, values = (torch.randn(B, config.n_head, BUFFER, head_dim, generator=g) for _ in range(2))
    attn_mask = None
    if mask == "tree":  # every row sees the cached slots and itself, and some earlier new rows at random
        attn_mask = torch.rand(T, start + T, generator=g) < 0.5
        attn_mask[:, :start] = True
        attn_mask[:, start:] &= torch.ones(T, T, dtype=torch.bool).tril()
        attn_mask[:, start:] |= torch.eye(T, dtype=torch.bool)
        attn_mask = attn_mask.to(DEVICE)
    slots, _, full_mask = fixed_size_inputs(start, T, BUFFER, None, attn_mask, DEVICE)
    return x.to(DEVICE), keys.to(DEVICE), values.to(DEVICE), slots, full_mask


@pytest.mark.parametrize("B, T, start, mask", [(1, 1, 5, "causal"), (1, 5, 3, "causal"), (2, 3, 7, "causal"),
                                               (1, 16, 4, "causal"), (1, 4, 6, "tree")])
@torch.inference_mode()
def test_a_fused_block_and_head_equal_eager_in_float32(B, T, start, mask):
    model = tiny_model()
    x, keys, values, slots, full_mask = block_inputs(B, T, start, seed=T, mask=mask)
    eager_keys, eager_values = keys.clone(), values.clone()
    expected = block_step(model.h[0], x, eager_keys, eager_values, slots, full_mask)
    got = fused_step.fused_block_step(model.h[0], x, keys, values, slots, full_mask)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    # the whole buffers: the new k, v at their slots, every other slot untouched
    torch.testing.assert_close(keys, eager_keys, **TOLERANCE)
    torch.testing.assert_close(values, eager_values, **TOLERANCE)
    torch.testing.assert_close(fused_step.fused_head(model, got), model.head(model.ln_f(expected)), **TOLERANCE)


@torch.inference_mode()
def test_a_wrong_mask_or_slot_is_far_above_the_tolerance():
    model = tiny_model()
    x, keys, values, slots, full_mask = block_inputs(1, 4, 6, seed=1)
    expected = block_step(model.h[0], x, keys.clone(), values.clone(), slots, full_mask)
    # the future and the unwritten slots visible
    seeing_all = fused_step.fused_block_step(model.h[0], x, keys.clone(), values.clone(), slots,
                                             torch.ones_like(full_mask))
    assert (seeing_all - expected).abs().max() > 1e-2
    # the new keys written one slot late (and read there by the mask's last slot)
    late_keys = keys.clone()
    late = fused_step.fused_block_step(model.h[0], x, late_keys, values.clone(), slots + 1, full_mask)
    assert (late - expected).abs().max() > 1e-2


@torch.inference_mode()
def test_the_graphed_fused_path_gives_eager_logits_and_exact_greedy_speculation(make_checkpoint):
    folder = make_checkpoint(TINY, seed=3, std=0.3, embedding_std=1.0)
    model = load_accelerated(folder, device=DEVICE, dtype="float32")
    prompt = torch.tensor([[5, 17, 3, 99, 42]], device=DEVICE)
    chunks = [torch.tensor([c], device=DEVICE) for c in ([7], [1, 2, 3, 4, 5], [9], [11, 12], [8], [1, 2, 3, 4, 5])]

    def logits_of():
        cache = model.new_kv_cache(max_len=30)
        return [model(prompt, cache)] + [model(chunk, cache) for chunk in chunks]

    expected = logits_of()
    graph_decode(model, record=recorder([]), fused=True)
    assert is_graphed(model) and model.decode_path.path == "fused"
    got = logits_of()
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, **TOLERANCE)
    assert len(model.decode_path.graphs) == 3  # buckets of 1, 2 and 8 rows: one graph each, replayed
    draft = load_gpt2(folder, device=DEVICE, dtype="float32")  # eager: the target's calls are the ones under test
    plain = autoregressive_generate(load_gpt2(folder, device=DEVICE, dtype="float32"), [5, 17, 3], 10).tokens
    result = speculative_sampling_greedy(model, draft, [5, 17, 3], 10, gamma=4)
    assert result.tokens == plain


@pytest.fixture
def notes_not_yet_shown(monkeypatch):
    import gpt2.speed.device
    monkeypatch.setattr(gpt2.speed.device, "_NOTES_SHOWN", set())  # said once a process: not yet here


def test_a_model_the_kernels_cannot_read_is_named_and_recorded_with_the_compiled_block(capsys, notes_not_yet_shown):
    odd_heads = tiny_model(GPT2Config(n_layer=1, n_head=4, n_embd=24, n_positions=32, vocab_size=50))
    assert "head size 6" in fused_step.why_not_fused(odd_heads)
    graphed = graph_decode(odd_heads, record=recorder([]), fused=True)  # a FastGPT2 holding the plain model
    assert graphed.decode_path.path == "compiled"
    assert "the fused decode step is not for this model (its head size 6" in capsys.readouterr().err
    assert fused_step.why_not_fused(tiny_model()) is None


def test_compile_fused_on_a_cpu_stays_eager_and_says_why(make_checkpoint, capsys, notes_not_yet_shown):
    """On a CPU compile="fused" is the CPU's fused step (gpt2/speed/native_step.py,
    tests/test_native_step.py), which this float32 model, on oneDNN and PyTorch, cannot take."""
    from gpt2.speed.native_step import is_fused
    model = load_gpt2(make_checkpoint(TINY, seed=3), device="cpu", compile="fused")
    assert not is_graphed(model) and not is_fused(model)
    assert "the fused CPU step is not for this model" in capsys.readouterr().err


@pytest.mark.parametrize("T", [1, 5])
@torch.inference_mode()
def test_a_16_bit_fused_block_stays_within_its_rounding(T):
    """float16 (the interpreter's dot takes no bfloat16; tests/test_cuda.py checks bfloat16 on a
    GPU): what the fused block rounds to 16 bits, eager rounds too."""
    model = tiny_model()
    x, keys, values, slots, full_mask = block_inputs(1, T, 3, seed=T)
    expected = block_step(model.h[0], x, keys.clone(), values.clone(), slots, full_mask)
    half = model.half()
    got = fused_step.fused_block_step(half.h[0], x.half(), keys.half(), values.half(), slots, full_mask)
    # float16 keeps 11 bits: a few parts in a thousand per product, summed
    torch.testing.assert_close(got.float(), expected, atol=0.01 * expected.abs().max().item(), rtol=0.01)


def test_block_sizes_are_timed_once_and_kept_for_the_next_process(kernel_cache_file, monkeypatch, capsys,
                                                                   notes_not_yet_shown):
    """On a GPU each product's block sizes are timed once per shape and kept with the kernel
    choices: a later process reads them instead of timing again. Here a stand-in GPU whose
    timings favour one candidate (the timing itself, in a CUDA graph, runs on a GPU only)."""
    import gpt2.speed.kernel_cache
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Stand-in GPU")
    monkeypatch.delenv("GPT2_FUSED_TUNE", raising=False)
    monkeypatch.setattr(fused_step, "_chosen", {})
    candidates = fused_step.candidates(5)
    fastest = candidates[3]
    launched = []

    def seconds(call):  # the stand-in GPU's clock: the fastest candidate takes 1, the others 2
        call()
        return 1.0 if launched[-1] == fastest else 2.0

    monkeypatch.setattr(fused_step, "_graph_seconds", seconds)
    key = ((True, True, False, False, True), 8, 96, 32, torch.float32)
    assert fused_step._choose(key, candidates, launched.append) == fastest
    assert launched == candidates  # each timed once
    assert "timing the fused kernels' block sizes" in capsys.readouterr().err
    assert fused_step._choose(key, candidates, launched.append) == fastest and len(launched) == len(candidates)
    # a new process: nothing in memory, the file read back, nothing timed
    monkeypatch.setattr(fused_step, "_chosen", {})
    monkeypatch.setattr(gpt2.speed.kernel_cache, "_KEPT", {})
    assert fused_step._choose(key, candidates, launched.append) == fastest and len(launched) == len(candidates)
    # another shape is timed; with GPT2_FUSED_TUNE=0 the first candidate, untimed
    assert fused_step._choose(key[:2] + (128, 32, torch.float32), candidates, launched.append) == fastest
    assert len(launched) == 2 * len(candidates)
    monkeypatch.setenv("GPT2_FUSED_TUNE", "0")
    assert fused_step._choose(key[:2] + (256, 32, torch.float32), candidates, launched.append) == candidates[0]
    assert len(launched) == 2 * len(candidates)
    # and the report names them
    from gpt2.speed.kernel_report import describe_value
    assert describe_value("fused_block_sizes", list(fastest)).startswith(f"{fastest[0]} rows a program, BLOCK_N")
