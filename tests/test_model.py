"""The hand-written GPT-2 against transformers' GPT2LMHeadModel, and the KV cache against the
uncached model."""

import pytest
import torch
from conftest import TINY
from transformers import GPT2LMHeadModel

from gpt2 import OFFICIAL_CONFIGS, GPT2Config, load_gpt2


def hf_logits(folder, idx):
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
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


@pytest.fixture(scope="module")
def gpt2_small_shape(make_checkpoint):
    cfg = OFFICIAL_CONFIGS["gpt2"]
    return {layout: make_checkpoint(cfg, seed=7, std=0.02, layout=layout) for layout in ("hub", "transformers")}


@pytest.mark.parametrize("layout", ["hub", "transformers"])
def test_gpt2_small_shape_logits_match_transformers(gpt2_small_shape, layout):
    folder = gpt2_small_shape[layout]
    model = load_gpt2(folder)
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
    (lambda: torch.tensor([[3, 100]]), "Token id 100 is outside the vocabulary"),
    (lambda: torch.tensor([[-1, 3]]), "Token id -1 is outside the vocabulary"),
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


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_fast_linear_path_equals_f_linear(dtype, tol):
    """linear() sends real-size layers through oneDNN at inference; same math as F.linear."""
    from gpt2 import model as gpt2_model

    g = torch.Generator().manual_seed(0)
    w = torch.randn(1024, 512, generator=g).to(dtype)  # above ONEDNN_MIN_WEIGHTS
    b = torch.randn(1024, generator=g).to(dtype)
    for rows in (1, 5):
        x = torch.randn(1, rows, 512, generator=g).to(dtype)
        with torch.inference_mode():
            fast = gpt2_model.linear(x, w, b)
        torch.testing.assert_close(fast.float(), torch.nn.functional.linear(x, w, b).float(), atol=tol, rtol=0.02)
