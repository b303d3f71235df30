"""The compiled decode path (gpt2/speed/compiled.py, an accelerated model's decode_path) against the
eager model: the same logits up to float32 rounding, the same greedy tokens, and no recompile as
the cache fills or changes size.

One 1-layer model keeps the compiles short (a few seconds; the graphs are the same for every
layer count). float32 throughout: the claims are about the compiler, not a format's rounding."""

import pytest
import torch
from conftest import TINY, sibling_tree

from gpt2 import GPT2, load_gpt2
from gpt2.speed import FastGPT2, kernels, load_accelerated
from gpt2.speed.compiled import MAX_ROWS, choose_compiled, compile_decode, compiled_graphs, eager, is_compiled
from spec_decoding import (GREEDY, autoregressive_generate, speculative_sampling_greedy,
                           tree_speculative_sampling)

ONE_LAYER = TINY.with_(n_layer=1)
# Rounding only: the compiled block fuses LayerNorm/GELU/adds and attends over the whole buffer
# with a mask, so float32 sums run in another order. A wrong mask or a wrong cache slot is far
# above this (logits of this model are O(1)).
ATOL = 2e-5


@pytest.fixture(scope="module")
def model(make_checkpoint):
    return load_accelerated(make_checkpoint(ONE_LAYER, seed=3, std=0.3, embedding_std=1.0), dtype="float32")


@pytest.fixture(scope="module")
def kernel_model(make_checkpoint):
    """The same model with every linear layer and the head a FastLinear on a chosen kernel (its
    layers are too small for one to pay, so the threshold is lifted for this load)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)
        model = load_accelerated(make_checkpoint(ONE_LAYER, seed=3, std=0.3, embedding_std=1.0), dtype="float32")
    assert len(kernels.attached(model)) == 4 * ONE_LAYER.n_layer + 1
    return model


def step_logits(model, prompt, chunks, max_len):
    """Logits of each forward: the prompt, then each chunk of new tokens (rows), on one cache."""
    cache = model.new_kv_cache(max_len=max_len)
    out = [model(prompt, cache)]
    for chunk in chunks:
        out.append(model(chunk, cache))
    return out


@torch.inference_mode()
def test_compiled_logits_equal_eager_for_steps_and_verifications(model):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, TINY.vocab_size, (1, 7), generator=g)
    # Steps of 1 row and verifications of 2, 5 and MAX_ROWS rows, at growing cache lengths.
    chunks = [torch.randint(0, TINY.vocab_size, (1, t), generator=g) for t in (1, 5, 1, 2, MAX_ROWS, 1)]
    expected = step_logits(eager(model), prompt, chunks, max_len=40)
    got = step_logits(compile_decode(model), prompt, chunks, max_len=40)
    assert is_compiled(model)
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)
    eager(model)


@torch.inference_mode()
def test_compiled_tree_mask_equals_eager(model):
    """Token trees pass positions and a mask over the cached + new slots (two siblings at one
    position must not see each other)."""
    prompt, nodes, positions, mask = sibling_tree(TINY.vocab_size)
    results = []
    for path in (eager, compile_decode):
        cache = path(model).new_kv_cache(max_len=20)
        model(prompt, cache)
        results.append(model(nodes, cache, positions=positions, attn_mask=mask))
    torch.testing.assert_close(results[1], results[0], atol=ATOL, rtol=0)
    eager(model)


def test_compiled_greedy_tokens_equal_eager(model, make_checkpoint):
    prompt = [5, 17, 3, 99, 42]
    draft = load_accelerated(make_checkpoint(ONE_LAYER, seed=4, std=0.3, embedding_std=1.0), dtype="float32")
    expected = autoregressive_generate(eager(model), prompt, 30).tokens
    assert autoregressive_generate(compile_decode(model), prompt, 30).tokens == expected
    # Verification rows: speculative decoding with the compiled target (and draft).
    compile_decode(draft)
    assert speculative_sampling_greedy(model, draft, prompt, 30, gamma=4).tokens == expected
    assert tree_speculative_sampling(model, draft, prompt, 30, (2, 2), sampling=GREEDY).tokens == expected
    eager(model)


@torch.inference_mode()
def test_no_recompile_as_the_cache_fills_or_changes_size(model):
    """Two graphs in all (1 row; 2 to MAX_ROWS rows): the cache's length is a mask, not a shape,
    and its max_len is a dynamic size. Without that, every step or every cache recompiled."""
    compile_decode(model)
    step_logits(model, torch.tensor([[1, 2, 3]]), [torch.tensor([[4]]), torch.tensor([[5, 6, 7]])], 30)
    before = compiled_graphs()
    for max_len in (25, 31, 50):
        chunks = [torch.tensor([[t]]) for t in range(8)] + [torch.tensor([list(range(r))]) for r in (2, 4, 9)]
        step_logits(model, torch.tensor([[1, 2]]), chunks, max_len)
    assert compiled_graphs() == before
    eager(model)


@torch.inference_mode()
def test_calls_it_does_not_serve_stay_eager_with_their_messages(model):
    compile_decode(model)
    before = compiled_graphs()
    long_prompt = torch.arange(MAX_ROWS + 1)[None] % TINY.vocab_size
    cache = model.new_kv_cache(max_len=MAX_ROWS + 2)
    model(long_prompt, cache)  # a prompt longer than MAX_ROWS: eager
    model(long_prompt)  # no cache: eager
    assert compiled_graphs() == before
    with pytest.raises(ValueError, match="has room for"):  # the eager path's own message
        model(torch.tensor([[1, 2]]), cache)
    eager(model)


def test_auto_measures_once_per_machine_and_keeps_the_choice(model, kernel_cache_file, monkeypatch):
    import gpt2.speed.compiled
    use, why = choose_compiled(model)
    assert is_compiled(model) == use
    assert "ms a step" in why and "compiling took" in why
    measured = []
    monkeypatch.setattr(gpt2.speed.compiled, "_measure", lambda m: measured.append(m) or (not use, "other"))
    again, why_again = choose_compiled(eager(model))
    assert measured == [] and again == use and is_compiled(model) == use  # read, not remeasured
    assert "measured here before" in why_again
    eager(model)


def test_load_compile_flag(make_checkpoint):
    """compile=True is gpt2.speed's step: an accelerated model with the compiled decode path; the
    plain load has none. compile_decode of a plain model gives a new FastGPT2 holding it and
    leaves the plain model as written."""
    folder = make_checkpoint(ONE_LAYER, seed=3, std=0.3, embedding_std=1.0)
    compiled = load_gpt2(folder, compile=True)
    assert isinstance(compiled, FastGPT2) and is_compiled(compiled)
    plain = load_gpt2(folder)
    assert not is_compiled(plain) and not is_compiled(load_accelerated(folder))
    held = compile_decode(plain)
    assert isinstance(held, FastGPT2) and is_compiled(held) and held is not plain
    assert type(plain) is GPT2 and not is_compiled(plain)
    with pytest.raises(ValueError, match="compile must be one of"):
        load_gpt2(folder, compile="yes")


@torch.inference_mode()
def test_linears_run_on_the_kernels_chosen_for_their_weights(kernel_model, monkeypatch):
    """Inside the compiled graph each FastLinear still runs the kernel chosen for its weight (the
    compiler sees one opaque op, which calls the layer), and compiled logits stay those of the
    eager model."""
    model = kernel_model
    seen = []
    for layer in kernels.attached(model):
        kernel = layer.kernel
        monkeypatch.setattr(layer, "kernel", lambda x, bias, layer=layer, kernel=kernel: seen.append(layer) or kernel(x, bias))
    prompt, step = torch.tensor([[1, 2, 3]]), torch.tensor([[4]])
    expected = step_logits(eager(model), prompt, [step], 12)
    compile_decode(model)
    cache = model.new_kv_cache(max_len=12)
    model(prompt, cache)
    seen.clear()
    got = model(step, cache)
    assert is_compiled(model) and model.decode_path.failed is None  # served by the compiled block
    block = model.h[0]
    layers = [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj]
    assert all(any(layer is s for s in seen) for layer in layers + [model.lm_head])
    torch.testing.assert_close(got, expected[1], atol=ATOL, rtol=0)
    eager(model)


@torch.inference_mode()
def test_a_kernel_giving_a_transposed_view_is_served(kernel_model, monkeypatch):
    """A kernel may return its rows as a transposed view (TransposedMM: (W @ x.T).T); the compiled
    graph expects the layout it planned for, so the op hands it a contiguous result."""
    from gpt2.speed.fast_linear import TransposedMM
    model = kernel_model
    for layer in kernels.attached(model):
        monkeypatch.setattr(layer, "kernel", TransposedMM(layer.weight))
    prompt, new = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6, 7, 8]])
    expected = step_logits(eager(model), prompt, [new], 12)
    got = step_logits(compile_decode(model), prompt, [new], 12)
    torch.testing.assert_close(got[1], expected[1], atol=ATOL, rtol=0)
    eager(model)


@torch.inference_mode()
def test_a_failing_compiler_falls_back_to_eager_and_says_why(model, monkeypatch, capsys):
    """Where inductor cannot build (no C++ compiler, ...), the call runs eagerly with one line
    saying why, and auto does not pick the compiled path."""
    import gpt2.speed.compiled

    def no_compiler(*args):
        raise torch._dynamo.exc.TorchDynamoException("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", lambda function: no_compiler)
    path = gpt2.speed.compiled.CompiledDecode(model)
    prompt = torch.tensor([[1, 2, 3]])
    expected = model(prompt, model.new_kv_cache(max_len=8))
    cache = model.new_kv_cache(max_len=8)
    torch.testing.assert_close(path(prompt, cache), expected, atol=0, rtol=0)
    assert cache.length == 3 and "No working C++ compiler" in path.failed
    assert "the compiled decode path failed here" in capsys.readouterr().err
    use, why = gpt2.speed.compiled._measure(model)
    assert not use and "compiling failed here" in why and not is_compiled(model)


def test_compiled_code_is_kept_apart_per_cpu_capability():
    """Inductor's cache does not record the vector instructions its code was built for: a native
    run loading code built under ATEN_CPU_CAPABILITY=avx2 (or the reverse) corrupted memory. Each
    capability gets a folder of its own."""
    import os
    from gpt2.speed.compiled import separate_compile_cache
    capability = torch.backends.cpu.get_cpu_capability().lower()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("-" + capability)
    assert separate_compile_cache() == os.environ["TORCHINDUCTOR_CACHE_DIR"]  # set once, not again
