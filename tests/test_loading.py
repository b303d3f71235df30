"""load_gpt2: every source it takes, both key layouts, the hub path through huggingface_hub's
cache offline, and a clear error for each way a checkpoint can be wrong."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, TINY
from gpt2 import GPT2Config
from safetensors.torch import load_file, save_file

from gpt2 import CheckpointError, decode, encode, load_gpt2, EOT_ID


def same_logits(a, b):
    idx = torch.arange(20).view(1, 20) % TINY.vocab_size
    with torch.inference_mode():
        torch.testing.assert_close(a(idx), b(idx), atol=0, rtol=0)


@pytest.fixture(scope="module")
def folder(make_checkpoint):
    return make_checkpoint(TINY, seed=5, std=0.1)


def test_loads_folder_file_and_both_layouts(folder, make_checkpoint, tmp_path):
    from_folder = load_gpt2(folder)
    assert not from_folder.training and not any(p.requires_grad for p in from_folder.parameters())
    # one .safetensors file: the config is inferred from the shapes, with head size 64
    wide = TINY.with_(n_embd=128)  # 2 heads of 64
    wide_folder = make_checkpoint(wide, seed=5, std=0.1)
    single = load_gpt2(wide_folder / "model.safetensors")
    assert single.config == wide
    same_logits(single, load_gpt2(wide_folder))
    # a head size other than 64 can't be inferred: say so
    with pytest.raises(CheckpointError, match="put a config.json beside the weights"):
        load_gpt2(folder / "model.safetensors")
    # the same weights written as transformers' save_pretrained does
    same_logits(from_folder, load_gpt2(make_checkpoint(TINY, seed=5, std=0.1, layout="transformers")))
    # a folder without config.json
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "model.safetensors", bare)
    with pytest.raises(CheckpointError, match="put a config.json beside the weights"):
        load_gpt2(bare)  # n_embd 32: head count can't be inferred
    shutil.copy(wide_folder / "model.safetensors", bare)
    assert load_gpt2(bare).config == wide


def test_never_reads_the_mask_buffers(folder):
    # the hub files carry h.N.attn.bias [1, 1, n_positions, n_positions]; they are not parameters
    tensors = load_file(folder / "model.safetensors")
    assert tensors["h.0.attn.bias"].shape == (1, 1, 64, 64)
    assert "h.0.attn.bias" not in dict(load_gpt2(folder).named_parameters())


def test_dtype_and_device(folder):
    m = load_gpt2(folder, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in m.parameters()} == {"cpu"}


def write_fake_hub_cache(cache_dir, repo_id, folder):
    """The layout huggingface_hub keeps: models--owner--name/{refs/main, snapshots/<sha>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(folder / name, snapshot / name)


def run_python(code, env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_hub_name_resolves_through_huggingface_hub_cache_offline(folder, tmp_path):
    cache = tmp_path / "hub"
    write_fake_hub_cache(cache, "openai-community/gpt2", folder)
    write_fake_hub_cache(cache, "someone/tiny-gpt2", folder)
    code = """
        import torch
        from gpt2 import load_gpt2
        idx = torch.arange(20).view(1, 20)
        ref = load_gpt2(%r)(idx)
        for name in ("gpt2", "someone/tiny-gpt2"):
            m = load_gpt2(name)
            assert torch.equal(m(idx), ref), name
        print("ok")
    """ % str(folder)
    result = run_python(code, {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_offline_without_weights_says_how_to_pass_a_local_path(tmp_path):
    code = """
        from gpt2 import load_gpt2, CheckpointError
        try:
            load_gpt2("gpt2-large")
        except CheckpointError as e:
            print(e)
    """
    result = run_python(code, {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert "openai-community/gpt2-large" in result.stdout
    assert "pass their folder instead" in result.stdout


@pytest.mark.parametrize("name", ["gpt3", "gpt2-huge", "not a model"])
def test_unknown_model_name(name):
    with pytest.raises(CheckpointError, match="Unknown model .* Use one of gpt2, gpt2-medium"):
        load_gpt2(name)


def test_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="No such file or folder"):
        load_gpt2(tmp_path / "nowhere" / "model.safetensors")
    with pytest.raises(CheckpointError, match="No such file or folder"):
        load_gpt2(str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_gpt2(tmp_path)
    pickle_file = tmp_path / "pytorch_model.bin"
    pickle_file.write_bytes(b"not read")
    with pytest.raises(CheckpointError, match="not a .safetensors file"):
        load_gpt2(pickle_file)


def test_corrupt_files(folder, tmp_path):
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    shutil.copy(folder / "config.json", truncated)
    data = (folder / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_gpt2(truncated)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_gpt2(garbage)
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    shutil.copy(folder / "model.safetensors", bad_json)
    (bad_json / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_gpt2(bad_json)


def edited_checkpoint(folder, tmp_path, edit):
    tensors = load_file(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    edit(tensors, config)
    out = tmp_path / "edited"
    out.mkdir(parents=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_missing_tensor(folder, tmp_path):
    out = edited_checkpoint(folder, tmp_path, lambda t, c: t.pop("h.1.mlp.c_fc.bias"))
    with pytest.raises(CheckpointError, match="missing the tensor 'h.1.mlp.c_fc.bias'"):
        load_gpt2(out)


def test_wrong_shape(folder, tmp_path):
    def edit(t, c):
        t["h.0.attn.c_attn.weight"] = torch.zeros(32, 64)
    with pytest.raises(CheckpointError, match=r"'h.0.attn.c_attn.weight' has shape \[32, 64\], expected \[32, 96\]"):
        load_gpt2(edited_checkpoint(folder, tmp_path, edit))


def test_config_that_does_not_match_the_weights(folder, tmp_path):
    def edit(t, c):
        c["n_layer"] = 1
    with pytest.raises(CheckpointError, match="tensors this GPT-2 config does not have"):
        load_gpt2(edited_checkpoint(folder, tmp_path, edit))
    def edit_missing_field(t, c):
        del c["n_embd"]
    with pytest.raises(CheckpointError, match="missing the GPT-2 field 'n_embd'"):
        load_gpt2(edited_checkpoint(folder, tmp_path / "x", edit_missing_field))


def test_tokenizer_roundtrip():
    assert encode("Hello world") == [15496, 995]
    assert decode([15496, 995]) == "Hello world"
    assert encode("<|endoftext|>") == [EOT_ID] == [50256]


# ---------------------------------------------------------------------------------------------
# device and dtype: names, "auto", and clear errors before anything is read


def test_dtype_names_and_auto(folder):
    for name, dtype in [("float16", torch.float16), ("bf16", torch.bfloat16), ("torch.float32", torch.float32),
                        (torch.float16, torch.float16)]:
        assert {p.dtype for p in load_gpt2(folder, dtype=name).parameters()} == {dtype}, name
    # the default is float32, the model as written; "auto" (gpt2.speed's step) is float32 on a CPU
    # for a model this small
    assert {p.dtype for p in load_gpt2(folder).parameters()} == {torch.float32}
    auto = load_gpt2(folder, dtype="auto", device="cpu")
    assert {p.dtype for p in auto.parameters()} == {torch.float32} and auto.format == "float32"


def test_auto_on_cpu_picks_the_format_measured_fastest_here(make_checkpoint, kernel_cache_file, monkeypatch,
                                                            capsys):
    """dtype="auto" (gpt2.speed's step, taken by load_gpt2) on a CPU loads the format that
    kernels.fastest_format measured fastest for the model's shapes (here its measurement is
    replaced by chosen times), and says so in one line; a
    16-bit format that wins by less than the margin, or that has no fast path here, is not picked.
    The choice is kept: a later load reads it, whatever the timings say then."""
    import gpt2.speed.device as device
    import gpt2.speed.kernel_cache as kernel_cache
    import gpt2.speed.kernels as kernels
    wide = GPT2Config(n_layer=1, n_head=2, n_embd=64, n_positions=16, vocab_size=64)
    folder = make_checkpoint(wide, seed=3, std=0.1)
    monkeypatch.setattr(kernels, "ONEDNN_MIN_WEIGHTS", 1)  # measure even this tiny model
    costs = {}  # format -> seconds of a 1-row and a 5-row pass, whatever the path

    def fake_times(named_kernels, in_features, dtype, rows=kernels.ROW_COUNTS, repeats=5):
        # "format/path" when formats are compared; a bare path when one format's kernels are
        return {name: {m: costs.get(name.split("/")[0], 1.0) for m in rows} for name in named_kernels}

    monkeypatch.setattr(kernels, "time_kernels", fake_times)
    monkeypatch.setattr(kernels, "format_paths", lambda: {"float32": ["onednn"], "fp16": ["fbgemm-fp16"],
                                                          "int8": ["native-int8"]})
    for times, expected in [({"float32": 1.0, "fp16": 0.5, "int8": 2.0}, "fp16"),
                            ({"float32": 1.0, "fp16": 0.8, "int8": 0.5}, "int8"),
                            # int8 a near-tie with float16 weights: the more exact format keeps it
                            ({"float32": 1.0, "fp16": 0.5, "int8": 0.48}, "fp16"),
                            ({"float32": 1.0, "fp16": 0.95, "int8": 0.95}, "float32")]:  # within the margin
        costs.update(times)
        kernel_cache.forget()
        device._NOTES_SHOWN.clear()
        assert kernels.fastest_format(wide)[0] == expected
        kernel_cache.forget()
        model = load_gpt2(folder, dtype="auto")
        err = capsys.readouterr().err
        notes = [line for line in err.splitlines() if line.startswith("note: dtype auto")]
        assert len(notes) == 1 and "measured fastest here" in notes[0], err
        dtype, quantize = kernels.AUTO_FORMATS[expected]
        assert {p.dtype for p in model.parameters()} == {dtype} and model.format == expected
        weights = [layer.weight for layer in kernels.attached(model)]  # every linear layer and the head
        assert len(weights) == 4 * wide.n_layer + 1 and {w.dtype for w in weights} == {dtype}
        if quantize == "fp16":  # float16 weights in a float32 model
            assert "float16 weights" in notes[0]
            assert all(torch.equal(w, w.half().float()) for w in weights)
        if quantize == "int8":  # int8 weights (their dequantized values) in a float32 model
            assert "int8 weights" in notes[0]
            assert all(layer.stored is not None and layer.stored.format == "int8" for layer in kernels.attached(model))
    costs.update({"float32": 1.0, "fp16": 0.1, "int8": 0.1})  # a later run: the kept choice stands
    assert load_gpt2(folder, dtype="auto").format == "float32"
    monkeypatch.setattr(kernel_cache, "_KEPT", {})
    assert load_gpt2(folder, dtype="auto").format == "float32"
    # a format without its fast path is never a candidate (a real probe result, not faked)
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "_PROBED", {"fbgemm-fp16": "absent for this test"})
    assert kernels.format_paths()["fp16"] == []
    # unmeasured: a model too small for any format to pay, or an unknown size
    assert kernels.fastest_format(wide)[0] == "float32"
    assert device.auto_dtype(torch.device("cpu")) == torch.float32


def test_auto_dtype_per_device(monkeypatch):
    from gpt2.speed.device import auto_dtype
    assert auto_dtype(torch.device("cpu")) == torch.float32
    assert auto_dtype(torch.device("mps")) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert auto_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)  # e.g. a V100
    assert auto_dtype(torch.device("cuda")) == torch.float16


def test_dtype_note_for_a_16_bit_dtype_without_a_fast_path(monkeypatch):
    import gpt2.speed.device as device
    import gpt2.speed.kernels as kernels
    cpu = torch.device("cpu")
    assert device.dtype_note(torch.float32, cpu) is None
    assert device.dtype_note(torch.bfloat16, torch.device("cuda")) is None
    monkeypatch.setattr(kernels, "_PROBED", {"onednn-bf16": None})
    assert device.dtype_note(torch.bfloat16, cpu) is None  # the fast path exists: nothing to say
    monkeypatch.setattr(kernels, "_PROBED", {"onednn-bf16": "RuntimeError: needs avx512bw"})
    note = device.dtype_note(torch.bfloat16, cpu)
    assert "\n" not in note and note.startswith("note: bfloat16 has no fast kernel on this CPU")
    assert "needs avx512bw" in note and "Faster here:" in note
    note = device.dtype_note(torch.float16, cpu)
    assert "\n" not in note and note.startswith("note: float16") and "Faster here:" in note


@pytest.mark.parametrize("kwargs, words", [
    ({"dtype": torch.int8}, 'dtype torch.int8 is not supported: use float32 (the default), bfloat16 or float16, or "auto"'),
    ({"dtype": "int8"}, "dtype 'int8' is not supported"),
    ({"dtype": "float64"}, "dtype 'float64' is not supported"),
    ({"device": "tpu"}, "unknown device 'tpu': use auto, cpu, cuda, cuda:N or mps"),
    ({"device": "meta"}, "device 'meta': only cpu, cuda and mps are supported"),
    ({"device": "nonsense"}, "unknown device 'nonsense': use auto, cpu, cuda, cuda:N or mps"),
])
def test_bad_dtype_or_device_is_a_clear_error_before_loading(kwargs, words, tmp_path):
    # The path does not exist: the argument is checked first, so its error comes, not the path's.
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_gpt2(tmp_path / "nowhere", **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clear_error(folder):
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available here .* Use cpu or auto"):
        load_gpt2(folder, device="cuda")


def test_inferred_config_is_said_on_stderr(make_checkpoint, folder, capsys):
    wide = TINY.with_(n_embd=128)
    load_gpt2(make_checkpoint(wide, seed=5, std=0.1) / "model.safetensors")
    err = capsys.readouterr().err
    assert "note: no config.json for" in err and "n_head = n_embd / 64 = 2" in err
    assert "n_layer=2, n_embd=128, n_positions=64, vocab_size=100" in err
    load_gpt2(folder)  # with its config.json: nothing to say
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------------------------
# The hub out of reach: give up on a short timeout (not retried), and say what was looked for locally

LOADS = """
    import sys
    from gpt2 import load_gpt2, CheckpointError
    for name in sys.argv[1:]:
        try:
            model = load_gpt2(name)
            print("loaded", name, model.config.n_layer)
        except CheckpointError as e:
            print("error:", e)
"""


def run_loads(names, env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update({"HF_HUB_CACHE": str(tmp_path / "hub"), **env_extra})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(LOADS), *names], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)


def test_unreachable_hub_fails_fast_and_names_the_local_folder_too(folder, tmp_path):
    write_fake_hub_cache(tmp_path / "hub", "someone/cached-gpt2", folder)
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    result = run_loads(["checkpoints/tagret", "someone/cached-gpt2"],
                       {"HF_ENDPOINT": "http://127.0.0.1:9"}, tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "there is no folder checkpoints/tagret here" in out
    assert "the Hugging Face hub could not be reached (http://127.0.0.1:9" in out
    assert "HF_HUB_OFFLINE=1" in out and "pass their folder instead" in out
    assert "Retrying" not in result.stderr  # no retry ladder
    # files already in the hub cache still load when the hub is out of reach
    assert f"loaded someone/cached-gpt2 {TINY.n_layer}" in out


def test_silent_hub_times_out_within_seconds(tmp_path):
    import socket
    with socket.socket() as server:  # accepts connections (the kernel does) but never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        result = run_loads(["owner/model"], {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, tmp_path)
    # It gave up on its own (the probe's timeout; no wall time is asserted: a busy machine makes
    # any limit flaky) and said so, instead of waiting on the silent server.
    assert "could not be reached" in result.stdout and "there is no folder owner/model here" in result.stdout
    assert "Timeout" in result.stdout, result.stdout


def test_hub_offline_error_names_the_folder_it_looked_for(tmp_path):
    (tmp_path / "checkpoints" / "target").mkdir(parents=True)  # exists, but holds no weights
    code = """
        from gpt2 import load_gpt2, CheckpointError
        for name in ("checkpoints/tagret", "checkpoints/target"):
            try:
                load_gpt2(name)
            except CheckpointError as e:
                print(e)
    """
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HF_HUB_OFFLINE is set" in result.stdout
    assert "there is no folder checkpoints/tagret here" in result.stdout
    assert "the folder checkpoints/target here has no model.safetensors" in result.stdout


def test_peek_config_reads_no_weights(folder, tmp_path):
    from gpt2 import OFFICIAL_CONFIGS
    from gpt2.loading import peek_config
    assert peek_config(folder) == TINY
    assert peek_config("gpt2-xl") == OFFICIAL_CONFIGS["gpt2-xl"]
    assert peek_config("someone/unknown") is None and peek_config(tmp_path) is None
