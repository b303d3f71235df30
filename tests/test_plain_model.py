"""The model a learner reads is the model that runs: load_gpt2 returns gpt2/model.py as written,
and speed is one visible step (gpt2.speed.accelerate) whose model says what it changed.

  - load_gpt2's model: nn.Linear layers, float32 parameters, GPT2.head, logits within 1e-4 of
    transformers' GPT-2, and an edit of any weight changes what it computes;
  - one cached forward and one verification forward of it run no project file but gpt2/model.py,
    kv_cache.py and config.py (traced);
  - an accelerated model, in every format: its own module classes, whose repr names the format and
    the kernel; no method replaced on an instance; every tensor it holds an ordinary tensor (no
    subclass reporting a dtype it does not hold); an in-place edit of a weight either raises (an
    error that says how to get the plain model) or changes the logits: never silently ignored.
"""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import hf_gpt2

from gpt2 import GPT2, GPT2Config, load_gpt2

ROOT = Path(__file__).resolve().parents[1]
# Every linear layer at least gpt2.speed.kernels.ONEDNN_MIN_WEIGHTS: kernels are chosen for each, as
# for the real sizes (a smaller model keeps plain layers where a kernel would not pay).
WIDE = GPT2Config(n_layer=1, n_head=8, n_embd=512, n_positions=32, vocab_size=512)


@pytest.fixture(scope="module")
def wide_dir(make_checkpoint):
    return make_checkpoint(WIDE, seed=11, std=0.05, embedding_std=0.3)


def tokens(n: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, WIDE.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))


def logits_of(model, idx) -> torch.Tensor:
    with torch.inference_mode():
        return model(idx).float()


def test_load_gpt2_is_the_model_as_written(wide_dir):
    model = load_gpt2(wide_dir)
    assert type(model) is GPT2
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * WIDE.n_layer and all(type(m) is nn.Linear for m in linears)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(type(t) in (torch.Tensor, nn.Parameter) for t in [*model.parameters(), *model.buffers()])
    # nothing attached: no instance attribute in any module but what nn.Module itself keeps
    for module in model.modules():
        assert not {"forward", "head"} & set(vars(module)), type(module).__name__
    # no second copy of any weight: the tied head reads wte's own tensor
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(storages) == len(set(storages))
    torch.testing.assert_close(logits_of(model, tokens()), hf_gpt2(wide_dir)(tokens()).logits.detach(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("edit", ["wte", "c_fc", "ln_f"])
def test_an_edit_of_the_plain_model_changes_its_logits(wide_dir, edit):
    model = load_gpt2(wide_dir)
    before = logits_of(model, tokens())
    weight = {"wte": model.wte.weight, "c_fc": model.h[0].mlp.c_fc.weight, "ln_f": model.ln_f.weight}[edit]
    with torch.no_grad():
        weight.mul_(0)
    assert not torch.equal(before, logits_of(model, tokens()))


def project_files_run(model, calls) -> set[str]:
    """The project's Python files whose code runs during calls() (sys.settrace sees every frame)."""
    seen = set()

    def trace(frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(str(ROOT)) and "/tests/" not in name:
            seen.add(str(Path(name).relative_to(ROOT)))
        return None

    sys.settrace(trace)
    try:
        calls()
    finally:
        sys.settrace(None)
    return seen


def test_a_cached_and_a_verification_forward_run_only_the_model_files(wide_dir):
    """Stepping into the default model lands in gpt2/model.py (and the cache and config it uses),
    never in gpt2/speed/."""
    model = load_gpt2(wide_dir)
    cache = model.new_kv_cache()

    def calls():
        with torch.inference_mode():
            model(tokens(4), cache)  # a prompt, into the cache
            model(tokens(1, seed=1), cache, num_last_logits=1)  # one cached decode step
            model(tokens(5, seed=2), cache, num_last_logits=5)  # a verification of 5 tokens

    run = project_files_run(model, calls)
    assert "gpt2/model.py" in run and "gpt2/kv_cache.py" in run
    assert run <= {"gpt2/model.py", "gpt2/kv_cache.py", "gpt2/config.py"}, run


def test_the_trace_sees_the_speed_files_of_an_accelerated_model(wide_dir):
    """The check above can fail: the same forwards of an accelerated model run gpt2/speed/."""
    from gpt2.speed import accelerate
    model = accelerate(load_gpt2(wide_dir), "float32")
    run = project_files_run(model, lambda: logits_of(model, tokens()))
    assert any(name.startswith("gpt2/speed/") for name in run), run


def accelerated_formats() -> list[str]:
    from gpt2.speed import kernels
    return [fmt for fmt in ("float32", "fp16", "int8", "w8a8", "bfloat16")
            if kernels.candidates(fmt, torch.float32 if fmt != "bfloat16" else torch.bfloat16)]


@pytest.mark.parametrize("fmt", ["float32", "fp16", "int8", "w8a8", "bfloat16"])
def test_an_accelerated_model_shows_what_it_changed(wide_dir, fmt):
    from gpt2.speed import FastGPT2, FastLinear, accelerate, load_accelerated
    if fmt not in accelerated_formats():
        pytest.skip(f"no kernel runs {fmt} weights on this CPU")
    for model in (accelerate(load_gpt2(wide_dir), fmt), load_accelerated(wide_dir, format=fmt)):
        assert isinstance(model, FastGPT2) and model.format == fmt
        fast = [m for m in model.modules() if isinstance(m, FastLinear)]
        assert len(fast) == 4 * WIDE.n_layer + 1 and model.lm_head in fast  # every linear layer and the head
        shown = repr(model)
        assert f"format={fmt}" in shown and "FastLinear(" in shown and "kernel=(" in shown
        for module in model.modules():  # no method replaced on an instance, none hidden by one
            assert not {name for name, value in vars(module).items() if callable(value)
                        and hasattr(type(module), name)}, type(module).__name__
        # every tensor the model holds reports the dtype it holds: plain tensors, no subclass
        held = [*model.parameters(), *model.buffers()] + [
            t for m in model.modules() if getattr(m, "stored", None) is not None
            for t in m.stored.layouts.values() if isinstance(t, torch.Tensor)]
        assert all(type(t) in (torch.Tensor, nn.Parameter) for t in held)
        logits_of(model, tokens())


def edits(model) -> list[tuple[str, object]]:
    """(name, a function that edits one weight of model in place) for the token embedding, the
    tied head's weight, a linear layer's weight and bias, and a LayerNorm's weight."""
    def edit(get):
        def run():
            with torch.no_grad():
                get().mul_(0.5)
        return run
    return [("wte", edit(lambda: model.wte.weight)), ("lm_head", edit(lambda: model.lm_head.weight)),
            ("c_fc", edit(lambda: model.h[0].mlp.c_fc.weight)), ("c_fc bias", edit(lambda: model.h[0].mlp.c_fc.bias)),
            ("ln_1", edit(lambda: model.h[0].ln_1.weight))]


@pytest.mark.parametrize("fmt", ["float32", "fp16", "int8", "w8a8", "bfloat16"])
def test_an_edit_of_an_accelerated_model_raises_or_takes_effect(wide_dir, fmt):
    """For each weight: the edit raises an error that names the way to the plain model, or the
    logits change. A weight whose kernel reads a copy (int8 bytes, packed panels) cannot take the
    edit, so it must raise."""
    from gpt2.speed import accelerate
    if fmt not in accelerated_formats():
        pytest.skip(f"no kernel runs {fmt} weights on this CPU")
    outcomes = {}
    for name, _ in edits(accelerate(load_gpt2(wide_dir), fmt)):
        model = accelerate(load_gpt2(wide_dir), fmt)
        before = logits_of(model, tokens())
        try:
            dict(edits(model))[name]()
        except RuntimeError as e:
            assert "read-only" in str(e) and "load_gpt2" in str(e) and "to_plain()" in str(e), str(e)
            outcomes[name] = "raised"
            continue
        assert not torch.equal(before, logits_of(model, tokens())), f"{fmt}: the edit of {name} was ignored"
        outcomes[name] = "took effect"
    if fmt in ("fp16", "int8"):  # held as int8 bytes or float16 values: the linear weights cannot take an edit
        assert outcomes["c_fc"] == outcomes["wte"] == "raised", outcomes
    assert outcomes["ln_1"] == outcomes["c_fc bias"] == "took effect", outcomes


def test_to_plain_gives_the_model_as_written_with_the_formats_values(wide_dir):
    from gpt2.speed import accelerate
    from gpt2.speed.accelerator import quantized_values
    plain = load_gpt2(wide_dir)
    fast = accelerate(plain, "int8")
    back = fast.to_plain()
    assert type(back) is GPT2 and all(type(m) is nn.Linear for m in back.modules() if isinstance(m, nn.Linear))
    expected = quantized_values(plain.h[0].mlp.c_fc.weight, "int8", torch.float32)
    assert torch.equal(back.h[0].mlp.c_fc.weight, expected)
    torch.testing.assert_close(logits_of(back, tokens()), logits_of(fast, tokens()), atol=1e-4, rtol=0)
    with torch.no_grad():  # the plain copy takes edits; the accelerated model is unchanged by them
        before = logits_of(fast, tokens())
        back.wte.weight.mul_(0)
    assert torch.equal(before, logits_of(fast, tokens()))
    assert not torch.equal(logits_of(back, tokens()), before)
