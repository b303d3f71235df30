"""Assignment 1: the KV cache and cached attention (README.md here; instructor.md: the notes)."""

import random
from unittest.mock import patch

import torch

from ..definition import Assignment, Check, Failed, as_floats
from ..forms import Bool, Int, List, Record, Text, Tensor, Tokens, Tuple, like
from ..probing import PROMPT, load, max_difference, seeded

UPDATE = "gpt2.kv_cache.KVCache.update"
TRUNCATE = "gpt2.kv_cache.KVCache.truncate"
ATTENTION = "gpt2.model.CausalSelfAttention.forward"
ATOL = 1e-4


def _sequence(seed: int) -> list[int]:
    return PROMPT + torch.randint(0, 100, (10,), generator=seeded(100 + seed)).tolist()


# ---- KVCache.update, on its own -------------------------------------------------------------------

def update_inputs(seed):
    g = seeded(200 + seed)
    return {"chunks": [torch.randn(2, 1, 1, n, 3, generator=g).tolist() for n in (3, 2, 1)]}


def update_probe(inputs, data):
    """Write chunks of 3, 2, 1 positions into both layers (advance() after each chunk, as
    GPT2.forward does); return what update() returned and the length seen right after it."""
    from gpt2.kv_cache import KVCache

    cache = KVCache(n_layer=2, batch_size=1, n_head=1, max_len=8, head_dim=3)
    returned, lengths = [], []
    for chunk in inputs["chunks"]:
        k, v = torch.tensor(chunk)
        n = k.shape[2]
        for layer in range(2):
            keys, values = cache.update(layer, k * (layer + 1), v * (layer + 1))
            returned.append([as_floats(keys), as_floats(values)])
            lengths.append(cache.length)
        cache.advance(n)
    return {"returned": returned, "lengths": lengths}


def update_form(inputs, ref):
    """Per call: the keys and values update() returned, [1, n_head 1, positions so far, head_dim 3]
    (the positions are judged, with a hint, by the judge); the length after each call."""
    tensor = Tensor((1, 1, None, 3))
    calls = len(ref["returned"])
    return Record({"returned": List(Tuple((tensor, tensor), what="tensors (keys, values)"), calls, what="calls"),
                   "lengths": List(Int(), calls, what="calls")})


def update_judge(inputs, ref, got):
    if got["lengths"] != ref["lengths"]:
        raise Failed(f"cache.length right after update() was {got['lengths']}, expected {ref['lengths']}: "
                     f"update() writes at [length, length + T) and leaves length alone (advance() moves it, "
                     f"once every layer has been written)")
    for i, ((k, v), (want_k, want_v)) in enumerate(zip(got["returned"], ref["returned"], strict=True)):
        shape, want_shape = list(torch.tensor(k).shape), list(torch.tensor(want_k).shape)
        if shape != want_shape:
            raise Failed(f"call {i + 1} of update() returned keys of shape {shape}, expected {want_shape}: "
                         f"return the keys/values of ALL positions so far, [B, n_head, length + T, head_dim]"
                         + (" (it returned only the new positions)" if shape[2] < want_shape[2] else ""))
        if max(max_difference(k, want_k), max_difference(v, want_v)) > 1e-6:
            raise Failed(f"call {i + 1} of update() returned the wrong keys/values: write each layer's new "
                         f"k, v at positions [length, length + T) of that layer's buffers")


# ---- KVCache.truncate, on its own -----------------------------------------------------------------

def truncate_inputs(seed):
    if seed == 0:
        return {"filled": 6, "to": 4}
    r = random.Random(f"kv_truncate/{seed}")
    filled = r.randint(7, 12)  # within the cache's 12 slots, never the visible inputs'
    return {"filled": filled, "to": r.randint(1, filled - 1)}


def truncate_form(inputs, ref):
    said = Text(200, what="what truncate() did")
    return Record({"length": Int(), "buffers_kept": Bool(), "longer": said, "negative": said, "zero": Int()})


def truncate_probe(inputs, data):
    """Fill a cache's buffers by hand, then truncate; report lengths, whether bad lengths raise
    ValueError, and whether the buffers were left where they were (O(1): only the length moves)."""
    from gpt2.kv_cache import KVCache

    cache = KVCache(n_layer=2, batch_size=1, n_head=1, max_len=12, head_dim=3)
    for buffer in cache.keys + cache.values:
        buffer.copy_(torch.randn(buffer.shape, generator=seeded(1)))
    before = [(b.data_ptr(), float(b.sum())) for b in cache.keys + cache.values]
    cache.length = inputs["filled"]
    cache.truncate(inputs["to"])
    out = {"length": cache.length,
           "buffers_kept": before == [(b.data_ptr(), float(b.sum())) for b in cache.keys + cache.values]}
    for name, bad in (("longer", inputs["to"] + 1), ("negative", -1)):
        try:
            cache.truncate(bad)
            out[name] = f"no error (length now {cache.length})"
        except ValueError:
            out[name] = "ValueError"
        except Exception as error:  # noqa: BLE001
            out[name] = type(error).__name__
    cache.truncate(0)
    out["zero"] = cache.length
    return out


def truncate_judge(inputs, ref, got):
    filled, to = inputs["filled"], inputs["to"]
    if got["length"] != to:
        raise Failed(f"after truncate({to}) on a cache of length {filled}, its length is {got['length']}, not {to}")
    if not got["buffers_kept"]:
        raise Failed("truncate() changed or reallocated the key/value buffers: rolling back is O(1), "
                     "only the length moves (the stale entries are overwritten later)")
    for name, what in (("longer", f"truncate({to + 1}) on a cache of length {to}"), ("negative", "truncate(-1)")):
        if got[name] != "ValueError":
            raise Failed(f"{what} must raise ValueError (a cache cannot grow by truncating, nor go below 0); "
                         f"it gave: {got[name]}")
    if got["zero"] != 0:
        raise Failed(f"truncate(0) left length {got['zero']}: 0 is a valid length (forget everything)")


# ---- CausalSelfAttention.forward and the cache through the model ----------------------------------

def forward_inputs(seed):
    return {"sequence": _sequence(seed)}


def forward_probe(inputs, data):
    target = load(data, "target")
    with torch.inference_mode():
        return as_floats(target(torch.tensor([inputs["sequence"]]))[0])


def _sdpa_variant(mistake):
    original = torch.nn.functional.scaled_dot_product_attention

    def variant(q, k, v, attn_mask=None, **kwargs):
        if mistake == "scale":
            return original(q, k, v, attn_mask=attn_mask, scale=1.0)
        return original(q, k, v)  # no mask at all
    return variant


def forward_reference(inputs, data):
    """The right logits, and those of two classic mistakes (to name them when they show up)."""
    import gpt2.model

    right = forward_probe(inputs, data)
    mistakes = {}
    for mistake, words in (("scale", "attention scores not divided by sqrt(head_dim)"),
                           ("mask", "no causal mask (tokens attend to later tokens)")):
        with patch.object(gpt2.model.F, "scaled_dot_product_attention", _sdpa_variant(mistake)):
            mistakes[words] = forward_probe(inputs, data)
    return {"logits": right, "mistakes": mistakes}


def _judge_logits(got, ref, what):
    diff = max_difference(got, ref["logits"])
    if diff <= ATOL:
        return
    for words, logits in ref.get("mistakes", {}).items():
        if max_difference(got, logits) <= ATOL:
            raise Failed(f"{what}: the logits are those of a known mistake: {words}")
    raise Failed(f"{what}: the logits differ from the reference by up to {diff:.3g} (allowed {ATOL:g})")


def logits_form(inputs, ref):
    return like(ref["logits"])


def forward_judge(inputs, ref, got):
    _judge_logits(got, ref, "a full forward without a cache")


def one_by_one_probe(inputs, data):
    target, sequence = load(data, "target"), inputs["sequence"]
    cache = target.new_kv_cache()
    with torch.inference_mode():
        rows = [target(torch.tensor([[t]]), cache)[0, -1] for t in sequence]
    return {"logits": as_floats(torch.stack(rows)), "length": cache.length}


def one_by_one_reference(inputs, data):
    return {"logits": forward_probe(inputs, data), "length": len(inputs["sequence"])}


def one_by_one_form(inputs, ref):
    return Record({"logits": like(ref["logits"]), "length": Int()})


def one_by_one_judge(inputs, ref, got):
    if got["length"] != ref["length"]:
        raise Failed(f"after feeding the sequence one token at a time the cache's length is {got['length']}, not the "
                     f"number of tokens fed (each forward advances it by the tokens it was given)")
    _judge_logits(got["logits"], ref, "feeding one token at a time through the KV cache (do the new "
                  "query's scores cover every cached position?)")


def chunks_probe(inputs, data):
    target, sequence = load(data, "target"), torch.tensor([inputs["sequence"]])
    cache = target.new_kv_cache()
    with torch.inference_mode():
        rows = [target(sequence[:, i:i + 3], cache)[0] for i in range(0, sequence.shape[1], 3)]
    return as_floats(torch.cat(rows))


def chunks_reference(inputs, data):
    return {"logits": forward_probe(inputs, data)}


def chunks_judge(inputs, ref, got):
    _judge_logits(got, ref, "feeding chunks of 3 tokens through the KV cache (a chunk's queries see the "
                  "cached positions and, causally, each other)")


def rollback_inputs(seed):
    return {"sequence": _sequence(seed), "at": 9, "wrong": [3, 3, 50, 61]}


def rollback_probe(inputs, data):
    """Feed a wrong continuation, truncate() back, feed the right one: logits as fresh."""
    target, seq, k = load(data, "target"), inputs["sequence"], inputs["at"]
    cache = target.new_kv_cache()
    with torch.inference_mode():
        target(torch.tensor([seq[:k] + inputs["wrong"]]), cache)
        cache.truncate(k)
        return as_floats(target(torch.tensor([seq[k:]]), cache)[0])


def rollback_reference(inputs, data):
    return {"logits": forward_probe(inputs, data)[inputs["at"]:]}


def rollback_judge(inputs, ref, got):
    _judge_logits(got, ref, f"after truncate({inputs['at']}) and new tokens (the rejected tokens must be forgotten)")


def greedy_inputs(seed):
    if seed == 0:
        return {"prompt": PROMPT, "max_gen": 30}
    r = random.Random(f"kv_greedy/{seed}")
    return {"prompt": [r.randrange(100) for _ in range(r.randint(4, 8))], "max_gen": 30}


def greedy_form(inputs, ref):
    return Tokens(len(ref), 100)


def greedy_probe(inputs, data):
    from spec_decoding import autoregressive_generate

    return autoregressive_generate(load(data, "target"), inputs["prompt"], inputs["max_gen"]).tokens


def greedy_judge(inputs, ref, got):
    if list(got) != list(ref):  # a hidden check: where it differs, never the expected tokens
        i = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        raise Failed(f"greedy generation with the cache differs from the target's own greedy output from token {i} on "
                     f"({len(got)} tokens, {len(ref)} asked for): check attention over the cached positions")


ASSIGNMENT = Assignment(
    name="kv_cache",
    functions=(UPDATE, TRUNCATE, ATTENTION),
    # keep() holds truncate's check and length move (truncate is keep(length, [])); the compiled
    # decode's SlotCache.update writes keys and values in place, as update does; the batched
    # cache's update and truncate are this cache's with a length per row (a KVCache's buffers
    # wrapped in one answer both).
    removed=("gpt2.kv_cache.KVCache.keep", "gpt2.speed.compiled.SlotCache.update",
             "spec_decoding.algorithms.batched.BatchedKVCache.update",
             "spec_decoding.algorithms.batched.BatchedKVCache.truncate"),
    readme="assignments/kv_cache/README.md",
    checks=(
        Check("kv_update", (UPDATE,), update_inputs, update_probe, update_judge, update_form, points=2,
              about="update() on its own: what it writes, what it returns"),
        Check("kv_truncate", (TRUNCATE,), truncate_inputs, truncate_probe, truncate_judge, truncate_form, points=2,
              about="truncate() on its own: the length, bad lengths, O(1)"),
        Check("attention_forward", (ATTENTION,), forward_inputs, forward_probe, forward_judge, logits_form, points=2,
              reference=forward_reference, about="a full forward without a cache"),
        Check("cache_one_by_one", (UPDATE, ATTENTION), forward_inputs, one_by_one_probe, one_by_one_judge,
              one_by_one_form, points=2, visible=False, reference=one_by_one_reference),
        Check("cache_chunks", (UPDATE, ATTENTION), forward_inputs, chunks_probe, chunks_judge, logits_form,
              visible=False,
              reference=chunks_reference),
        Check("cache_rollback", (UPDATE, TRUNCATE, ATTENTION), rollback_inputs, rollback_probe, rollback_judge,
              logits_form, visible=False, reference=rollback_reference),
        Check("baseline_greedy", (UPDATE, ATTENTION), greedy_inputs, greedy_probe, greedy_judge, greedy_form,
              visible=False),
    ),
)
