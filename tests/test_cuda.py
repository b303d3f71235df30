"""The suite's central claims again on a CUDA GPU (every test here skips on a machine without one;
CI has none, a machine with a CUDA GPU runs them: docs/performance.md, "On a GPU").

- The model on the GPU computes what it computes on the CPU (float32 logits, up to rounding).
- Greedy speculative decoding gives the target's own greedy tokens, in float32.
- Speculative sampling on the GPU, drawing from a GPU generator, follows the target's exact
  distribution (chi-square against exact enumeration), and the same test rejects the draft.
- The compiled decode path (Triton kernels on a GPU) gives eager's logits and greedy tokens.
- CUDA graphs of the step and the verifications (gpt2/speed/cuda_graph.py) give eager's logits and
  greedy tokens, and a second generation replays the graphs recorded in the first.
- The fused step (gpt2/speed/fused_step.py: Triton kernels, recorded as CUDA graphs) gives eager's
  float32 logits over steps and verifications, greedy speculative tokens equal to plain greedy with
  a fused target and draft, and a second generation recording no new graph and compiling nothing.
- bfloat16, the format `auto` picks on a GPU, stays within bfloat16's rounding of float32.
"""

import os
from functools import partial

import pytest
import torch
from conftest import TINY, TINY_VOCAB

from gpt2 import load_gpt2
from gpt2.speed import load_accelerated
from gpt2.speed.compiled import compile_decode, eager, is_compiled
from gpt2.speed.cuda_graph import graph_decode, is_graphed, ungraph
from gpt2.speed.fused_step import chosen_configs
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy
from spec_decoding.checks import check_lossless
from spec_decoding.calibration import calibrate_costs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = [5, 17, 3, 99, 42]


def logits_of(model, prompt, chunks, max_len=40):
    """Logits of the prompt, then of each chunk of new tokens, on one KV cache (on the CPU)."""
    device = model.wte.weight.device
    cache = model.new_kv_cache(max_len=max_len)
    out = [model(torch.tensor([prompt], device=device), cache)]
    out += [model(torch.tensor([chunk], device=device), cache) for chunk in chunks]
    return [o.float().cpu() for o in out]


CHUNKS = [[7], [1, 2, 3, 4, 5], [9], [11, 12]]  # a step, a verification, a step, a verification


@torch.inference_mode()
def test_gpu_logits_equal_cpu_logits_in_float32(pair_dirs):
    cpu = logits_of(load_gpt2(pair_dirs[0], dtype="float32"), PROMPT, CHUNKS)
    gpu = logits_of(load_gpt2(pair_dirs[0], device="cuda", dtype="float32"), PROMPT, CHUNKS)
    for c, g in zip(cpu, gpu):
        torch.testing.assert_close(g, c, atol=1e-4, rtol=0)


def test_greedy_speculative_equals_target_greedy_on_gpu(pair_dirs):
    target = load_gpt2(pair_dirs[0], device="cuda", dtype="float32")
    draft = load_gpt2(pair_dirs[1], device="cuda", dtype="float32")
    expected = autoregressive_generate(target, PROMPT, 40).tokens
    for gamma in (1, 3, 6):
        result = speculative_sampling_greedy(target, draft, PROMPT, 40, gamma=gamma)
        assert result.tokens == expected, f"gamma={gamma}"
    assert result.stats.target_calls < 40  # it did speculate: fewer target calls than tokens


def test_speculative_sampling_on_gpu_follows_the_target(make_checkpoint):
    target = load_gpt2(make_checkpoint(TINY_VOCAB, seed=21, std=0.2, embedding_std=0.3), device="cuda")
    draft = load_gpt2(make_checkpoint(TINY_VOCAB, seed=22, std=0.2, embedding_std=0.3), device="cuda")
    settings, prompt = dict(temperature=1.0), [1, 2, 3]
    result = check_lossless(partial(speculative_sampling, target, draft, gamma=2), target, prompt, 3,
                            settings, samples=4000, seed=0)
    assert result.passed and result.p_value > 1e-3, result.message
    # Power: the draft's own samples are told apart.
    draft_result = check_lossless(partial(autoregressive_generate, draft), target, prompt, 3, settings,
                                  samples=2000, seed=1)
    assert not draft_result.passed and draft_result.p_value < 1e-6, draft_result.message


@torch.inference_mode()
def test_compiled_decode_on_gpu_equals_eager(make_checkpoint):
    one_layer = TINY.with_(n_layer=1)
    model = load_accelerated(make_checkpoint(one_layer, seed=3, std=0.3, embedding_std=1.0), device="cuda",
                             dtype="float32")
    prompt = [5, 17, 3, 99, 42]
    expected = logits_of(eager(model), prompt, CHUNKS)
    got = logits_of(compile_decode(model), prompt, CHUNKS)
    assert is_compiled(model)
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=2e-5, rtol=0)
    draft = load_accelerated(make_checkpoint(one_layer, seed=4, std=0.3, embedding_std=1.0), device="cuda",
                             dtype="float32")
    plain = autoregressive_generate(eager(model), prompt, 30).tokens
    compile_decode(model)
    assert autoregressive_generate(model, prompt, 30).tokens == plain
    assert speculative_sampling_greedy(model, compile_decode(draft), prompt, 30, gamma=4).tokens == plain
    eager(model)


@torch.inference_mode()
def test_bfloat16_on_gpu_stays_within_its_rounding(pair_dirs):
    assert load_gpt2(pair_dirs[0], device="cuda", dtype="auto").wte.weight.dtype == torch.bfloat16  # what auto picks
    full = logits_of(load_gpt2(pair_dirs[0], device="cuda", dtype="float32"), PROMPT, CHUNKS)
    half = logits_of(load_gpt2(pair_dirs[0], device="cuda", dtype="bfloat16"), PROMPT, CHUNKS)
    for f, h in zip(full, half):
        # bfloat16 keeps 8 bits of mantissa: a few parts in a thousand per product, summed
        torch.testing.assert_close(h, f, atol=0.05 * f.abs().max().item(), rtol=0.05)


@torch.inference_mode()
def test_cuda_graphs_on_gpu_equal_eager(pair_dirs):
    target = load_accelerated(pair_dirs[0], device="cuda", dtype="float32")
    chunks = CHUNKS + CHUNKS  # each shape recorded once, then replayed
    expected = logits_of(target, PROMPT, chunks)
    got = logits_of(graph_decode(target), PROMPT, chunks)
    assert is_graphed(target)
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=2e-5, rtol=0)
    draft = graph_decode(load_accelerated(pair_dirs[1], device="cuda", dtype="float32"))
    plain = autoregressive_generate(ungraph(target), PROMPT, 40).tokens
    graph_decode(target)
    assert autoregressive_generate(target, PROMPT, 40).tokens == plain
    for gamma in (3, 3, 5):
        result = speculative_sampling_greedy(target, draft, PROMPT, 40, gamma=gamma)
        assert result.tokens == plain, f"gamma={gamma}"
    graphs = len(target.decode_path.graphs)
    assert speculative_sampling_greedy(target, draft, PROMPT, 40, gamma=3).tokens == plain
    assert len(target.decode_path.graphs) == graphs  # the pooled buffers' graphs, replayed
    # compile=True on a GPU: torch.compile's fused block, recorded as CUDA graphs
    fused = load_gpt2(pair_dirs[0], device="cuda", dtype="float32", compile=True)
    assert is_graphed(fused) and fused.decode_path.compiled
    for e, c in zip(expected, logits_of(fused, PROMPT, chunks)):
        torch.testing.assert_close(c, e, atol=2e-5, rtol=0)
    # bfloat16, what auto picks here: within its rounding of its own eager logits
    half = load_accelerated(pair_dirs[0], device="cuda", dtype="bfloat16")
    eager_half = logits_of(half, PROMPT, chunks)
    for e, c in zip(eager_half, logits_of(graph_decode(half), PROMPT, chunks)):
        torch.testing.assert_close(c, e, atol=0.02 * e.abs().max().item(), rtol=0.02)


def test_compile_auto_on_gpu_chooses_between_eager_and_cuda_graphs(pair_dirs, kernel_cache_file):
    model = load_gpt2(pair_dirs[0], device="cuda", dtype="float32", compile="auto")
    from gpt2.speed import kernel_cache
    from gpt2.speed.compiled import model_key
    kept = kernel_cache.lookup("cuda_graph", model_key(model) | {"device": torch.cuda.get_device_name()})
    assert kept is not None  # measured and kept under the model's shape and this GPU
    use, why = kept
    assert is_graphed(model) == use and "ms a step" in why
    assert not is_compiled(model)


@torch.inference_mode()
def test_fused_step_on_gpu_equals_eager(pair_dirs):
    target = load_gpt2(pair_dirs[0], device="cuda", dtype="float32")
    chunks = CHUNKS + CHUNKS + [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]  # replayed; the 16-row bucket
    expected = logits_of(target, PROMPT, chunks)
    fused = load_gpt2(pair_dirs[0], device="cuda", dtype="float32", compile="fused")
    assert is_graphed(fused) and fused.decode_path.path == "fused"
    for e, c in zip(expected, logits_of(fused, PROMPT, chunks)):
        torch.testing.assert_close(c, e, atol=2e-5, rtol=1e-5)
    draft = load_gpt2(pair_dirs[1], device="cuda", dtype="float32", compile="fused")
    plain = autoregressive_generate(target, PROMPT, 40).tokens
    for gamma in (3, 5, 8):
        result = speculative_sampling_greedy(fused, draft, PROMPT, 40, gamma=gamma)
        assert result.tokens == plain, f"gamma={gamma}"
    graphs = len(fused.decode_path.graphs) + len(draft.decode_path.graphs)
    assert speculative_sampling_greedy(fused, draft, PROMPT, 40, gamma=5).tokens == plain
    # replayed, none recorded (the kernels are launched, and compiled, only while recording)
    assert len(fused.decode_path.graphs) + len(draft.decode_path.graphs) == graphs
    # bfloat16, what auto picks here: within its rounding of its own eager logits
    half = load_accelerated(pair_dirs[0], device="cuda", dtype="bfloat16")
    eager_half = logits_of(half, PROMPT, chunks)
    for e, c in zip(eager_half, logits_of(graph_decode(half, fused=True), PROMPT, chunks)):
        torch.testing.assert_close(c, e, atol=0.02 * e.abs().max().item(), rtol=0.02)
    assert chosen_configs() or os.environ.get("GPT2_FUSED_TUNE") == "0"  # block sizes timed on this GPU


def test_the_cost_model_calibrates_on_gpu_with_the_fused_step(pair_dirs):
    """--gamma auto measures its costs on the models as they run: on a GPU its sampled round draws
    with a generator of the GPU (a draw from it must be made there)."""
    target, draft = (load_gpt2(folder, device="cuda", dtype="float32", compile="fused") for folder in pair_dirs[:2])
    costs = calibrate_costs(target, draft, gamma_max=2, budget_s=0.2, min_rounds=1)
    assert costs.draft_step_s > 0 and costs.sample_s > 0 and costs.sampled_round_extra_s >= 0
    alpha = costs.sampled().break_even_alpha()  # None: drafting never pays (c near 1 on tiny models)
    assert alpha is None or 0 <= alpha <= 1
