"""The hand-written GPT-2 against transformers' GPT2LMHeadModel, and the KV cache against the
uncached model."""

import pytest
import torch
from conftest import TINY, hf_gpt2

from gpt2 import GPT2, OFFICIAL_CONFIGS, GPT2Config, load_gpt2


def hf_logits(folder, idx):
    hf = hf_gpt2(folder)
    with torch.no_grad():
        return hf(idx).logits


@pytest.mark.parametrize("layout", ["hub", "transformers"])
def test_tiny_logits_match_transformers(make_checkpoint, layout):
    folder = make_checkpoint(TINY, seed=1, std=0.1, layout=layout, embedding_std=1.0)
    model = load_gpt2(folder)
    idx = torch.randint(0, TINY.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    expected = hf_logits(folder, idx)
    with torch.no_grad():  # F.linear path
        torch.testing.assert_close(model(idx), expected, atol=1e-4, rtol=0)
    with torch.inference_mode():  # the fast oneDNN path generation uses
        torch.testing.assert_close(model(idx), expected, atol=1e-4, rtol=0)


def test_gpt2_small_shape_logits_match_transformers(make_checkpoint):
    """The real GPT-2 Small shape, in the hub's layout (the files the hub serves). The other layout
    (save_pretrained's keys) reads through the same code at any size: the tiny test above."""
    folder = make_checkpoint(OFFICIAL_CONFIGS["gpt2"], seed=7, std=0.02, layout="hub")
    model = load_gpt2(folder, dtype="float32")  # "auto" may pick bfloat16 at this size
    assert model.config == OFFICIAL_CONFIGS["gpt2"]
    assert model.num_parameters() == 124_439_808  # GPT-2 Small, tied head counted once
    idx = torch.randint(0, 50257, (1, 64), generator=torch.Generator().manual_seed(0))
    expected = hf_logits(folder, idx)
    with torch.inference_mode():
        logits = model(idx)
    assert logits.shape == (1, 64, 50257)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def tiny_model(make_checkpoint):
    return load_gpt2(make_checkpoint(TINY, seed=2, std=0.1, embedding_std=1.0))


def test_cached_decoding_matches_full_forward(tiny_model):
    idx = torch.randint(0, TINY.vocab_size, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = tiny_model(idx)
        one_at_a_time = tiny_model.new_kv_cache(batch_size=2)
        steps = [tiny_model(idx[:, t:t + 1], one_at_a_time) for t in range(30)]
        chunked = tiny_model.new_kv_cache(batch_size=2, max_len=30)
        chunks = [tiny_model(idx[:, a:b], chunked) for a, b in [(0, 7), (7, 8), (8, 19), (19, 30)]]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=0)
    assert one_at_a_time.length == chunked.length == 30


def test_truncate_then_new_tokens_matches_fresh_sequence(tiny_model):
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, TINY.vocab_size, (1, 12), generator=g)
    rejected = torch.randint(0, TINY.vocab_size, (1, 6), generator=g)
    replacement = torch.randint(0, TINY.vocab_size, (1, 5), generator=g)
    with torch.inference_mode():
        cache = tiny_model.new_kv_cache()
        tiny_model(prefix, cache)
        tiny_model(rejected, cache)
        assert cache.length == 18
        cache.truncate(14)  # keep 2 of the 6 "draft" tokens
        assert cache.length == 14
        after = tiny_model(replacement, cache)
        fresh = tiny_model(torch.cat([prefix, rejected[:, :2], replacement], 1))
    torch.testing.assert_close(after, fresh[:, -5:], atol=1e-5, rtol=0)
    # the cached keys/values equal those of a fresh cached pass over the new sequence
    with torch.inference_mode():
        fresh_cache = tiny_model.new_kv_cache()
        tiny_model(torch.cat([prefix, rejected[:, :2], replacement], 1), fresh_cache)
    for layer in range(TINY.n_layer):
        torch.testing.assert_close(cache.keys[layer][:, :, :19], fresh_cache.keys[layer][:, :, :19], atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.values[layer][:, :, :19], fresh_cache.values[layer][:, :, :19], atol=1e-5, rtol=0)


def test_truncate_is_o1_and_checked(tiny_model):
    cache = tiny_model.new_kv_cache(max_len=16)
    with torch.inference_mode():
        tiny_model(torch.tensor([[1, 2, 3, 4]]), cache)
    before = [k.data_ptr() for k in cache.keys]
    cache.truncate(1)
    assert cache.length == 1 and [k.data_ptr() for k in cache.keys] == before
    with pytest.raises(ValueError, match="between 0 and the current length"):
        cache.truncate(5)
    with pytest.raises(ValueError, match="between 0 and the current length"):
        cache.truncate(-1)


def test_num_last_logits(tiny_model):
    idx = torch.randint(0, TINY.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        full = tiny_model(idx)
        last3 = tiny_model(idx, num_last_logits=3)
    torch.testing.assert_close(last3, full[:, -3:], atol=1e-5, rtol=0)


def test_bfloat16_runs_and_roughly_agrees(make_checkpoint):
    folder = make_checkpoint(TINY, seed=2, std=0.1, embedding_std=1.0)
    m32, m16 = load_gpt2(folder), load_gpt2(folder, dtype=torch.bfloat16)
    assert m16.wte.weight.dtype == torch.bfloat16
    idx = torch.randint(0, TINY.vocab_size, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        a, b = m32(idx), m16(idx).float()
    assert (a - b).abs().max() < 0.1 * a.abs().max()


@pytest.mark.parametrize("make_input, message", [
    (lambda: torch.zeros(1, 65, dtype=torch.long), "context window of n_positions=64"),
    (lambda: torch.zeros(1, 3), "LongTensor"),
    (lambda: torch.zeros(3, dtype=torch.long), r"shape \[B, T\]"),
    (lambda: torch.zeros(1, 0, dtype=torch.long), "no tokens"),
])
def test_bad_model_input_gives_clear_error(tiny_model, make_input, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(make_input())


def test_cache_room_and_position_errors(tiny_model):
    cache = tiny_model.new_kv_cache(max_len=8)
    with torch.inference_mode():
        tiny_model(torch.zeros(1, 6, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="room for 8"):
            tiny_model(torch.zeros(1, 3, dtype=torch.long), cache)
        assert cache.length == 6  # a refused call leaves the cache as it was
        full = tiny_model.new_kv_cache()
        tiny_model(torch.zeros(1, 64, dtype=torch.long), full)
        with pytest.raises(ValueError, match="n_positions=64"):
            tiny_model(torch.zeros(1, 1, dtype=torch.long), full)
    with pytest.raises(ValueError, match="batch size 2"):
        tiny_model(torch.zeros(2, 1, dtype=torch.long), tiny_model.new_kv_cache())
    with pytest.raises(ValueError, match="max_len"):
        tiny_model.new_kv_cache(max_len=65)


def test_official_configs():
    sizes = {name: (c.n_layer, c.n_head, c.n_embd) for name, c in OFFICIAL_CONFIGS.items()}
    assert sizes == {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024),
                     "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600)}
    for c in OFFICIAL_CONFIGS.values():
        assert (c.n_positions, c.vocab_size, c.layer_norm_epsilon) == (1024, 50257, 1e-5)
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(n_embd=100, n_head=3)


def test_one_forward_holds_every_option():
    """GPT2 has one forward: plain decoding's arguments (idx, cache, num_last_logits), then the
    keywords trees, early exit and feature drafters need; no second copy of the block's loop."""
    import inspect
    assert list(inspect.signature(GPT2.forward).parameters) == [
        "self", "idx", "cache", "num_last_logits", "positions", "attn_mask", "exit_layer", "return_features"]
    assert not hasattr(GPT2, "forward_with")


def test_forward_reads_no_token_values(tiny_model):
    """forward checks shapes and types only: an id outside the vocabulary is the generators' check
    (tests/test_generation.py), so forward never waits on a GPU to read a value. Here it reaches
    the embedding, which refuses it with PyTorch's own IndexError."""
    with pytest.raises(IndexError):
        tiny_model(torch.tensor([[3, TINY.vocab_size]]))


# ---------------------------------------------------------------- token trees: positions, mask, keep

def test_explicit_positions_and_causal_mask_equal_the_plain_model(tiny_model):
    idx = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        plain_cache, explicit_cache = tiny_model.new_kv_cache(), tiny_model.new_kv_cache()
        tiny_model(idx[:, :5], plain_cache)
        tiny_model(idx[:, :5], explicit_cache)
        plain = tiny_model(idx[:, 5:], plain_cache)
        causal = torch.ones(7, 12, dtype=torch.bool).tril(diagonal=5)
        explicit = tiny_model(idx[:, 5:], explicit_cache, positions=torch.arange(5, 12), attn_mask=causal)
    torch.testing.assert_close(explicit, plain, atol=0, rtol=0)
    for layer in range(TINY.n_layer):
        torch.testing.assert_close(explicit_cache.keys[layer], plain_cache.keys[layer], atol=0, rtol=0)


def test_two_branches_in_one_forward_equal_each_branch_alone(tiny_model):
    """Siblings share a position and never see each other: a prefix, then branch a = (a1, a2)
    and branch b = (b1) in one forward give each branch's own logits."""
    prefix, a1, a2, b1 = [3, 14, 15, 92], 65, 35, 89
    # new tokens: a1 (pos 4), b1 (pos 4), a2 (pos 5, child of a1)
    mask = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    with torch.inference_mode():
        cache = tiny_model.new_kv_cache()
        tiny_model(torch.tensor([prefix]), cache)
        tree = tiny_model(torch.tensor([[a1, b1, a2]]), cache, positions=torch.tensor([4, 4, 5]),
                          attn_mask=torch.cat([torch.ones(3, 4, dtype=torch.bool), mask], 1))
        branch_a = tiny_model(torch.tensor([prefix + [a1, a2]]))[:, 4:]
        branch_b = tiny_model(torch.tensor([prefix + [b1]]))[:, 4:]
        # the mask matters: without it, b1 and a2 would see tokens not on their path
        unmasked = tiny_model(torch.tensor([prefix + [a1, b1, a2]]))[:, 4:]
    torch.testing.assert_close(tree[:, [0, 2]], branch_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(tree[:, 1], branch_b[:, 0], atol=1e-5, rtol=0)
    assert not torch.allclose(unmasked[:, 2], branch_a[:, 1], atol=1e-3)


def test_keep_compacts_the_accepted_path(tiny_model):
    """Score a tree, keep one root-to-node path: the cache equals a fresh pass over that path."""
    prefix, nodes = [7, 1, 8, 2], [11, 12, 13, 14, 15]
    parents = [-1, -1, 0, 1, 2]  # 11 and 12 at depth 1, 13 under 11, 14 under 12, 15 under 13
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i, parent in enumerate(parents):
        mask[i] = mask[parent] if parent >= 0 else False
        mask[i, i] = True
    depth = mask.sum(1)
    with torch.inference_mode():
        cache = tiny_model.new_kv_cache(max_len=16)
        tiny_model(torch.tensor([prefix]), cache)
        tiny_model(torch.tensor([nodes]), cache, positions=3 + depth,
                   attn_mask=torch.cat([torch.ones(5, 4, dtype=torch.bool), mask], 1))
        assert cache.length == 9
        before = [k.data_ptr() for k in cache.keys]
        cache.keep(4, [4, 6, 8])  # the path 11 -> 13 -> 15
        assert cache.length == 7 and [k.data_ptr() for k in cache.keys] == before
        fresh = tiny_model.new_kv_cache(max_len=16)
        tiny_model(torch.tensor([prefix + [11, 13, 15]]), fresh)
        for layer in range(TINY.n_layer):
            for got, want in ((cache.keys[layer], fresh.keys[layer]), (cache.values[layer], fresh.values[layer])):
                torch.testing.assert_close(got[:, :, :7], want[:, :, :7], atol=1e-5, rtol=0)
        # a path that needs no move (the first slots) and an empty one
        cache.keep(5, [5])
        assert cache.length == 6
        cache.keep(6, [])
        assert cache.length == 6
    with pytest.raises(ValueError, match="slots must increase"):
        cache.keep(2, [4, 3])
    with pytest.raises(ValueError, match="slots must increase"):
        cache.keep(2, [1])
    with pytest.raises(ValueError, match="length must be between"):
        cache.keep(7, [])


def test_bad_positions_and_masks_give_clear_errors(tiny_model):
    idx = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="positions must be a LongTensor of shape"):
        tiny_model(idx, positions=torch.tensor([0]))
    with pytest.raises(ValueError, match="attn_mask must be a bool tensor"):
        tiny_model(idx, attn_mask=torch.ones(2, 3, dtype=torch.bool))
    cache = tiny_model.new_kv_cache(max_len=8, extra_slots=4)
    assert cache.max_len == 12
