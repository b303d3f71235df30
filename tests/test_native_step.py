"""The CPU's fused decode step (gpt2/speed/native_step.py, gpt2/speed/csrc/block_step.c) against the
eager model: the same logits up to float32 rounding for steps and verifications (int8 weights:
the linear layers are the same kernels, so only the LayerNorms, attention and GELU round
differently); a row's bits do not depend on the rows beside it; greedy speculative decoding on it
equals plain greedy decoding on it, in each build of the kernels; calls it does not serve go to the
eager forward; models it cannot run stay eager with a note that says why."""

import pytest
import torch
from conftest import TINY, sibling_tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpt2.speed.kernels as kernels
from gpt2 import load_gpt2
from gpt2.speed import load_accelerated, native, native_step
from gpt2.speed.native_step import choose_fused, fused_decode, is_fused, unfuse, why_not
from spec_decoding import GREEDY, autoregressive_generate, speculative_sampling_greedy, tree_speculative_sampling

needs_native = pytest.mark.skipif(native.why_not() is not None, reason=f"no C kernel here: {native.why_not()}")
pytestmark = needs_native

# Rounding only: LayerNorm's sums, the attention's and the softmax's run in another order and exp
# is a polynomial. A wrong cache slot, a mask off by one or a wrong GELU is far above this (the
# logits of these models are O(1) to O(10)).
ATOL = 5e-5
ROWS = 16  # the longest verification below (gamma 15)


def on_kernels(folder, fmt):
    """The model in fmt with every linear layer on a kernel (these small layers would not get one)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)
        return load_accelerated(folder, format=fmt)


@pytest.fixture(scope="module")
def checkpoint(make_checkpoint):
    return make_checkpoint(TINY.with_(n_layer=3), seed=3, std=0.3, embedding_std=1.0)


@pytest.fixture(scope="module")
def int8_model(checkpoint):
    return on_kernels(checkpoint, "int8")


def forwards(model, prompt, chunks, max_len, **options):
    """Logits of each forward on one cache: the prompt, then each chunk of new tokens."""
    cache = model.new_kv_cache(max_len=max_len)
    return [model(prompt, cache, **options)] + [model(chunk, cache, **options) for chunk in chunks]


def tokens(g, *lengths):
    return [torch.randint(0, TINY.vocab_size, (1, t), generator=g) for t in lengths]


@torch.inference_mode()
def test_fused_logits_equal_eager_for_steps_and_verifications(int8_model):
    g = torch.Generator().manual_seed(0)
    prompt, *chunks = tokens(g, 7, 1, 5, 1, 2, ROWS, 1, 3)
    expected = forwards(unfuse(int8_model), prompt, chunks, max_len=40)
    got = forwards(fused_decode(int8_model), prompt, chunks, max_len=40)
    assert is_fused(int8_model)
    for e, f in zip(expected, got):
        torch.testing.assert_close(f, e, atol=ATOL, rtol=0)
    assert not torch.equal(got[1], expected[1])  # the step's own code ran, not the eager forward
    unfuse(int8_model)


@torch.inference_mode()
def test_exit_layer_and_features_as_the_eager_forward(int8_model):
    g = torch.Generator().manual_seed(1)
    prompt, *chunks = tokens(g, 5, 1, 4)
    for options in ({"exit_layer": 2}, {"return_features": True}, {"exit_layer": 1, "return_features": True}):
        expected = forwards(unfuse(int8_model), prompt, chunks, max_len=20, **options)
        got = forwards(fused_decode(int8_model), prompt, chunks, max_len=20, **options)
        for e, f in zip(expected, got):
            for a, b in zip(e if isinstance(e, tuple) else (e,), f if isinstance(f, tuple) else (f,)):
                torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    unfuse(int8_model)


@pytest.mark.parametrize("fmt", ["int8", "w8a8"])
@torch.inference_mode()
def test_a_row_gives_the_same_bits_alone_as_among_others(checkpoint, fmt):
    """A verification of T rows computes, row for row, the bits of T steps."""
    model = fused_decode(on_kernels(checkpoint, fmt))
    g = torch.Generator().manual_seed(2)
    prompt, new = tokens(g, 9, ROWS)
    cache = model.new_kv_cache(max_len=40)
    model(prompt, cache)
    together = model(new, cache)
    cache.truncate(prompt.shape[1])
    alone = torch.cat([model(new[:, i:i + 1], cache) for i in range(ROWS)], dim=1)
    assert torch.equal(together, alone)


@pytest.mark.parametrize("fmt", ["int8", "w8a8"])
@torch.inference_mode()
def test_a_prompt_read_at_once_or_in_pieces_gives_the_same_bits(checkpoint, fmt):
    """The prompt goes through the same code as the steps: a speculative run that reads the
    prompt in one forward and then verifies drafts computes what plain decoding's steps compute
    (with the prompt left to the eager forward, greedy outputs parted on the stand-ins)."""
    model = fused_decode(on_kernels(checkpoint, fmt))
    g = torch.Generator().manual_seed(4)
    text, = tokens(g, 40)
    at_once = model(text, model.new_kv_cache(max_len=40))
    cache = model.new_kv_cache(max_len=40)
    pieces = torch.cat([model(text[:, a:b], cache) for a, b in ((0, 23), (23, 24), (24, 29), (29, 40))], dim=1)
    assert torch.equal(at_once, pieces)


def builds():
    """The kernel builds this CPU runs: (name, build)."""
    flags = native.kernel_cache.cpu_flags()
    return [name for name, need in (("avx2", "avx2"), ("avx512", "avx512f")) if need in flags]


@pytest.mark.parametrize("build", ["avx2", "avx512"])
@pytest.mark.parametrize("fmt", ["int8", "w8a8"])
def test_greedy_speculative_equals_plain_greedy_on_the_fused_step(text_pair_dirs, monkeypatch, build, fmt):
    if build not in builds():
        pytest.skip(f"needs a CPU with {build}")
    monkeypatch.setattr(native, "_LIBRARY", native.library(wide_build=build == "avx512"))
    target_dir, draft_dir = text_pair_dirs
    target, draft = (fused_decode(on_kernels(d, fmt)) for d in (target_dir, draft_dir))
    assert is_fused(target) and is_fused(draft)
    prompt = list(range(100, 120))
    plain = autoregressive_generate(target, prompt, 40).tokens
    assert speculative_sampling_greedy(target, draft, prompt, 40, gamma=4).tokens == plain
    assert tree_speculative_sampling(target, draft, prompt, 40, (2, 2), sampling=GREEDY).tokens == plain
    if fmt == "int8":  # the same kernels as eager and rounding-level differences: the same tokens
        assert autoregressive_generate(unfuse(target), prompt, 40).tokens == plain


@torch.inference_mode()
def test_a_token_tree_as_the_eager_forward_and_as_its_chains(int8_model):
    """A tree's mask and positions: eager's logits up to rounding; and each node's logits are, bit
    for bit, those of the same token fed at the end of the chain of its ancestors."""
    prompt, nodes, positions, mask = sibling_tree(TINY.vocab_size)
    results = {}
    for path in (unfuse, fused_decode):
        model = path(int8_model)
        cache = model.new_kv_cache(max_len=20)
        model(prompt, cache)
        results[path] = model(nodes, cache, positions=positions, attn_mask=mask)
    torch.testing.assert_close(results[fused_decode], results[unfuse], atol=ATOL, rtol=0)
    model = fused_decode(int8_model)
    chains = [[0], [1], [0, 2]]  # the nodes on the path to each node (sibling_tree's shape)
    for node, chain in enumerate(chains):
        cache = model.new_kv_cache(max_len=20)
        model(prompt, cache)
        as_chain = model(nodes[:, chain], cache)[:, -1]
        assert torch.equal(as_chain, results[fused_decode][:, node])
    unfuse(int8_model)


@torch.inference_mode()
def test_calls_it_does_not_serve_go_to_the_eager_forward(int8_model):
    """A batch of two, no cache: the eager forward's results, bit for bit."""
    prompt, *_ = sibling_tree(TINY.vocab_size)
    results = {}
    for path in (unfuse, fused_decode):
        model = path(int8_model)
        batch = model(torch.cat([prompt, prompt]), model.new_kv_cache(batch_size=2, max_len=20))
        results[path] = (batch, model(prompt))
    for e, f in zip(results[unfuse], results[fused_decode]):
        assert torch.equal(e, f)
    unfuse(int8_model)


def test_models_it_cannot_run_stay_eager_with_a_reason(checkpoint, capsys):
    plain = load_gpt2(checkpoint)
    assert "plain model" in why_not(plain)
    float32 = load_accelerated(checkpoint, format="float32")  # its layers stay nn.Linear / oneDNN
    reason = why_not(float32)
    assert reason is not None and "h.0.attn.c_attn" in reason and "quantize='int8' or 'w8a8'" in reason
    assert not is_fused(fused_decode(float32))
    assert "the fused CPU step is not for this model" in capsys.readouterr().err


def test_a_head_size_not_a_multiple_of_8_is_refused(make_checkpoint):
    odd = on_kernels(make_checkpoint(TINY.with_(n_head=4, n_embd=40), seed=1), "int8")  # head size 10
    assert "head size 10" in why_not(odd)


def test_load_compile_fused_on_a_cpu_and_auto_keeps_its_choice(checkpoint, kernel_cache_file, monkeypatch):
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)
    assert is_fused(load_gpt2(checkpoint, quantize="int8", compile="fused"))
    model = on_kernels(checkpoint, "int8")
    use, why = choose_fused(model)
    assert is_fused(model) == use and "ms a step" in why
    measured = []
    monkeypatch.setattr(native_step, "_measure", lambda m: measured.append(m) or (not use, "other"))
    again, why_again = choose_fused(unfuse(model))
    assert measured == [] and again == use and is_fused(model) == use  # read back, not measured again
    assert "measured here before" in why_again
    auto = load_gpt2(checkpoint, quantize="int8", compile="auto")
    assert is_fused(auto) == use
    from gpt2.speed.kernel_report import report
    kept = [line for line in report().splitlines() if "fused_cpu" in line]
    assert len(kept) == 1 and ("taken: fused CPU step faster" if use else "eager kept: fused CPU step not faster") in kept[0]


@torch.inference_mode()
def test_a_cache_too_short_gets_the_eager_message(int8_model):
    model = fused_decode(int8_model)
    cache = model.new_kv_cache(max_len=4)
    model(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ValueError, match="has room for 4"):
        model(torch.tensor([[4, 5]]), cache)
    assert cache.length == 3
    unfuse(model)


def test_the_benchmark_runs_both_paths_and_checks_their_tokens(text_pair_dirs, tmp_path, monkeypatch):
    """benchmarks.fused_cpu_speed: eager and fused in turns, each method's tokens checked against
    its path's plain decoding (here all equal: this pair has no near-ties)."""
    import json

    from benchmarks.fused_cpu_speed import main
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 0)
    target_dir, draft_dir = text_pair_dirs
    main(["--target", str(target_dir), "--draft", str(draft_dir), "--format", "w8a8", "--new-tokens", "12",
          "--prompt-len", "20", "--rounds", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["ran"] == {"eager": "eager", "fused": "fused"}
    for path in ("eager", "fused"):
        assert [len(r["seconds"]) for r in res["paths"][path].values()] == [1, 1, 1]
        assert all(r["equal_to_plain"] for r in res["paths"][path].values())
    assert "| fused (ran: fused) | tree (2, 2) |" in (tmp_path / "results.md").read_text()


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_cache_length_rows_and_tree_mask_as_the_eager_forward(int8_model, data):
    """Drawn: the cached length, the new rows, the cache's spare room, and (half the time) a token
    tree's mask (the cached slots and each node itself visible, each earlier node at random) with
    the positions it implies. The fused step's logits are eager's within rounding (ATOL, and a
    relative 1e-4 for the larger logits some draws give: float32 sums in another order)."""
    start, T = data.draw(st.integers(1, 30), "cached"), data.draw(st.integers(1, 12), "rows")
    spare = data.draw(st.integers(0, 4), "spare slots")
    ids = torch.tensor([data.draw(st.lists(st.integers(0, TINY.vocab_size - 1), min_size=start + T,
                                           max_size=start + T), "tokens")])
    options = {}
    if data.draw(st.booleans(), "a tree"):
        mask = torch.zeros(T, start + T, dtype=torch.bool)
        mask[:, :start] = True
        for t in range(T):
            mask[t, start + t] = True
            for u in range(t):
                mask[t, start + u] = data.draw(st.booleans())
        positions = torch.tensor([start + int(mask[t, start:].sum()) - 1 for t in range(T)])
        options = {"attn_mask": mask, "positions": positions}
    logits = []
    with torch.inference_mode():
        for path in (unfuse, fused_decode):
            model = path(int8_model)
            cache = model.new_kv_cache(max_len=start + T + spare)
            model.eager_forward(ids[:, :start], cache)
            logits.append(model(ids[:, start:], cache, **options))
    unfuse(int8_model)
    torch.testing.assert_close(logits[1], logits[0], atol=ATOL, rtol=1e-4)
