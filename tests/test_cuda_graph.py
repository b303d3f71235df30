"""The CUDA-graph decode path (gpt2/speed/cuda_graph.py, an accelerated model's decode_path) on a
CPU: its static inputs, pooled cache buffers and fixed-size forward give the eager model's logits
and greedy tokens.

A CPU has no CUDA graphs, so these tests record with a stand-in that replays by calling the
recorded forward again and copying its results into the first call's outputs. That is what a
replay does where it matters here: it reads only the static inputs and the cache buffers it was
recorded on, and writes its outputs in place. A forward that read anything else (this call's own
tokens, a mask made for the first call, another cache) gives wrong logits on a later call, here as
on a GPU. tests/test_cuda.py records real CUDA graphs where a GPU is present.
"""

import gc

import pytest
import torch
from conftest import TINY, sibling_tree

from gpt2 import GPT2, load_gpt2
from gpt2.speed import FastGPT2, load_accelerated
from gpt2.speed.compiled import MAX_ROWS
from gpt2.speed.cuda_graph import graph_decode, is_graphed, row_bucket, ungraph
from spec_decoding import (GREEDY, autoregressive_generate, speculative_sampling_greedy,
                           tree_speculative_sampling)
from spec_decoding.algorithms.batched import BatchedKVCache

# Rounding only: attention runs over the whole buffer with a mask, so float32 sums run in another
# order. A wrong mask, a stale input or a wrong cache slot is far above this.
ATOL = 2e-5
COMPILED_RTOL = 1e-5  # a few hundred float32 ulps: rounding, where a wrong mask or slot is off by O(1)


def recorder(log):
    """A stand-in for record_cuda_graph on a CPU; appends each recording to log."""
    def record(forward):
        log.append(forward)
        outputs = forward()

        def replay():
            for static, new in zip(outputs, forward()):
                static.copy_(new)
        return replay, outputs
    return record


@pytest.fixture(scope="module")
def folder(make_checkpoint):
    return make_checkpoint(TINY, seed=3, std=0.3, embedding_std=1.0)


@pytest.fixture
def model(folder):
    return load_accelerated(folder, dtype="float32")


def logits_of(model, prompt, chunks, max_len):
    cache = model.new_kv_cache(max_len=max_len)
    return [model(prompt, cache)] + [model(chunk, cache) for chunk in chunks]


@torch.inference_mode()
def test_graphed_logits_equal_eager_for_steps_and_verifications(model):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, TINY.vocab_size, (1, 7), generator=g)
    # Steps and verifications at growing cache lengths, each shape more than once (replays).
    chunks = [torch.randint(0, TINY.vocab_size, (1, t), generator=g) for t in (1, 5, 1, 2, MAX_ROWS, 1, 5, 1)]
    expected = logits_of(model, prompt, chunks, max_len=40)
    recorded = []
    got = logits_of(graph_decode(model, record=recorder(recorded)), prompt, chunks, max_len=40)
    assert is_graphed(model)
    assert len(recorded) == 4  # 1, 5, 2 and MAX_ROWS rows: each once (the prompt, the first call, runs eagerly)
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_verification_lengths_share_a_few_padded_graphs(model):
    """Every length from 1 to 9 runs on the graphs of ROW_BUCKETS (1, 2, 4, 8, 16 rows), padded,
    with the eager logits, also in the steps after a padded call (its dummy rows' keys sit in the
    slots those steps write next), and up against the end of the buffer, where a bucket no longer
    fits and the call takes a graph of its own length. Fails if the padding rows leak into the
    real ones (a mask that shows them, logits taken from the wrong rows) or if each length gets
    its own graph."""
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, TINY.vocab_size, (1, 3), generator=g)
    lengths = [1, 3, 1, 5, 2, 6, 7, 1, 9, 4, 8]
    chunks = [torch.randint(0, TINY.vocab_size, (1, t), generator=g) for t in lengths]
    max_len = 3 + sum(lengths)  # the cache ends full; its buffers are n_positions long
    expected = logits_of(model, prompt, chunks, max_len)
    recorded = []
    got = logits_of(graph_decode(model, record=recorder(recorded)), prompt, chunks, max_len)
    assert sorted(key[1] for key in model.decode_path.graphs) == [1, 2, 4, 8, 16]
    assert len(recorded) == 5
    for e, c in zip(expected, got):
        assert c.shape == e.shape
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)
    # Near the buffer's end (n_positions slots): 5 rows with 6 slots free cannot pad to 8.
    long_prompt = torch.randint(0, TINY.vocab_size, (1, TINY.n_positions - 6), generator=g)
    tail = [torch.randint(0, TINY.vocab_size, (1, 5), generator=g)]
    expected = logits_of(ungraph(model), long_prompt, tail, TINY.n_positions)
    got = logits_of(graph_decode(model, record=recorder(recorded)), long_prompt, tail, TINY.n_positions)
    assert 5 in [key[1] for key in model.decode_path.graphs] and len(recorded) == 6
    torch.testing.assert_close(got[1], expected[1], atol=ATOL, rtol=0)
    assert (row_bucket(3, 2), row_bucket(3, 3), row_bucket(3, 4), row_bucket(9, 100)) == (3, 3, 4, 16)


@torch.inference_mode()
def test_graphed_tree_mask_early_exit_and_features_equal_eager(model):
    prompt, nodes, positions, mask = sibling_tree(TINY.vocab_size)
    results = []
    for graphed in (False, True):
        if graphed:
            graph_decode(model, record=recorder([]))
        cache = model.new_kv_cache(max_len=20)
        model(prompt, cache)
        tree = model(nodes, cache, positions=positions, attn_mask=mask)
        cache.truncate(6)
        early, features = model(nodes[:, :1], cache, 1, exit_layer=1, return_features=True)
        results.append((tree, early, features))
    for e, c in zip(*results):
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)


def test_graphed_greedy_tokens_equal_eager_and_later_generations_reuse_the_graphs(model, folder):
    prompt = [5, 17, 3, 99, 42]
    draft = load_accelerated(folder, dtype="float32")  # the same weights: every draft token is accepted...
    with torch.no_grad():
        draft.h[1].mlp.c_proj.weight.mul_(1.5)  # ...unless its last block differs
    expected = autoregressive_generate(model, prompt, 30).tokens
    target_recorded, draft_recorded = [], []
    graph_decode(model, record=recorder(target_recorded))
    graph_decode(draft, record=recorder(draft_recorded))
    assert autoregressive_generate(model, prompt, 30).tokens == expected
    result = speculative_sampling_greedy(model, draft, prompt, 30, gamma=4)
    assert result.tokens == expected and result.stats.target_calls < 30
    assert tree_speculative_sampling(model, draft, prompt, 30, (2, 2), sampling=GREEDY).tokens == expected
    gc.collect()
    recorded = len(target_recorded), len(draft_recorded)
    # A second generation of the same shapes takes the pooled buffers and their graphs.
    assert speculative_sampling_greedy(model, draft, prompt, 30, gamma=4).tokens == expected
    assert (len(target_recorded), len(draft_recorded)) == recorded


@torch.inference_mode()
def test_caches_alive_together_get_their_own_buffers(model):
    """Two caches in use at once must not share buffers (the pool hands out only free ones)."""
    g = torch.Generator().manual_seed(2)
    a_prompt, b_prompt = (torch.randint(0, TINY.vocab_size, (1, 4), generator=g) for _ in range(2))
    steps = [torch.randint(0, TINY.vocab_size, (1, 1), generator=g) for _ in range(6)]
    expected = [logits_of(model, p, steps, 20) for p in (a_prompt, b_prompt)]
    graph_decode(model, record=recorder([]))
    a, b = model.new_kv_cache(max_len=20), model.new_kv_cache(max_len=20)
    assert a.full_buffers[0][0].data_ptr() != b.full_buffers[0][0].data_ptr()
    got = [[model(a_prompt, a)], [model(b_prompt, b)]]
    for step in steps:  # interleaved: each step of one cache between two of the other
        got[0].append(model(step, a))
        got[1].append(model(step, b))
    for e_run, g_run in zip(expected, got):
        for e, c in zip(e_run, g_run):
            torch.testing.assert_close(c, e, atol=ATOL, rtol=0)


def test_buffers_return_to_the_pool_only_when_nothing_holds_them(model):
    graph_decode(model, record=recorder([]))
    cache = model.new_kv_cache(max_len=20)
    first = cache.full_buffers[0][0].data_ptr()
    batched = BatchedKVCache(cache)  # takes the cache's lists of keys and values
    del cache
    gc.collect()
    held = model.new_kv_cache(max_len=20)
    assert held.full_buffers[0][0].data_ptr() != first  # still in use by the batched cache
    del batched
    gc.collect()
    assert model.new_kv_cache(max_len=30).full_buffers[0][0].data_ptr() == first  # free again


@torch.inference_mode()
def test_calls_it_does_not_serve_run_eagerly_with_their_messages(model):
    recorded = []
    graph_decode(model, record=recorder(recorded))
    long_prompt = torch.arange(MAX_ROWS + 4)[None] % TINY.vocab_size
    cache = model.new_kv_cache(max_len=MAX_ROWS + 5)
    model(long_prompt[:, :3], cache)  # a cache's first call (the prompt): eager
    model(long_prompt[:, 3:], cache)  # more than MAX_ROWS new rows: eager
    model(long_prompt)  # no cache: eager
    assert recorded == []
    with pytest.raises(ValueError, match="has room for"):  # the eager path's own message
        model(torch.tensor([[1, 2]]), cache)
    assert recorded == []
    ungraph(model)
    assert not is_graphed(model)
    model(torch.tensor([[1]]), cache)  # a pooled cache keeps working eagerly


def test_load_compile_graph_on_a_cpu_stays_eager_and_says_so(folder, capsys, monkeypatch):
    import gpt2.speed.device
    monkeypatch.setattr(gpt2.speed.device, "_NOTES_SHOWN", set())  # said once a process: not yet here
    assert not is_graphed(load_gpt2(folder, compile="graph"))
    assert "CUDA graphs are for CUDA GPUs" in capsys.readouterr().err


@torch.inference_mode()
def test_a_plain_model_is_held_by_a_new_graphed_model_and_left_as_written(folder):
    """graph_decode of a plain GPT2 gives a new FastGPT2 on its tensors, with the graphed path and
    the eager logits; the plain model stays gpt2/model.py as written, with no decode path."""
    plain = load_gpt2(folder)
    chunks = [torch.tensor([[4]]), torch.tensor([[5, 6, 7]]), torch.tensor([[8]])]
    expected = logits_of(plain, torch.tensor([[1, 2, 3]]), chunks, 20)
    recorded = []
    graphed = graph_decode(plain, record=recorder(recorded))
    assert isinstance(graphed, FastGPT2) and is_graphed(graphed) and graphed is not plain
    assert type(plain) is GPT2 and not is_graphed(plain)
    got = logits_of(graphed, torch.tensor([[1, 2, 3]]), chunks, 20)
    assert len(recorded) == 2  # 1 row and 3 rows
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_switching_off_and_on_keeps_the_recorded_graphs(model):
    recorded = []
    graph_decode(model, record=recorder(recorded))
    chunks = [torch.tensor([[4]]), torch.tensor([[5, 6, 7]])]
    expected = logits_of(model, torch.tensor([[1, 2, 3]]), chunks, 20)
    cache_buffers = model.decode_path.free
    assert len(recorded) == 2
    ungraph(model)
    torch.testing.assert_close(logits_of(model, torch.tensor([[1, 2, 3]]), chunks, 20)[2], expected[2],
                               atol=ATOL, rtol=0)
    graph_decode(model, record=recorder(recorded))
    assert model.decode_path.free is cache_buffers
    got = logits_of(model, torch.tensor([[1, 2, 3]]), chunks, 20)
    assert len(recorded) == 2  # the same pool, the same graphs, replayed
    for e, c in zip(expected, got):
        torch.testing.assert_close(c, e, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_the_recorded_compiled_block_equals_eager(folder):
    """compiled=True records torch.compile's fused block (on a CPU, inductor's C++ here) with the
    same static inputs: a step and verifications of two lengths share its two compiled graphs."""
    model = load_accelerated(folder, dtype="float32")
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, TINY.vocab_size, (1, 5), generator=g)
    chunks = [torch.randint(0, TINY.vocab_size, (1, t), generator=g) for t in (1, 4, 1, 3, 4)]
    expected = logits_of(model, prompt, chunks, 30)
    got = logits_of(graph_decode(model, record=recorder([]), compiled=True), prompt, chunks, 30)
    assert model.decode_path.compiled
    for e, c in zip(expected, got):
        # inductor's fused block sums in its own order (which depends on the CPU's vector width):
        # a float32 rounding difference grows with the logit, so allow a relative part too
        torch.testing.assert_close(c, e, atol=ATOL, rtol=COMPILED_RTOL)


def test_outputs_are_plain_tensors_a_drafter_can_train_on(model):
    """Outside inference mode the graphed path returns what the eager forward returns: tensors
    autograd can use (a feature drafter trains on the target's features)."""
    graph_decode(model, record=recorder([]))
    cache = model.new_kv_cache(max_len=10)
    model(torch.tensor([[1, 2, 3]]), cache)
    logits, features = model(torch.tensor([[4]]), cache, return_features=True)
    assert not features.is_inference() and not logits.is_inference()
    head = torch.nn.Linear(features.shape[-1], 2)
    head(features).sum().backward()  # inference tensors cannot be saved for backward
    assert head.weight.grad is not None
