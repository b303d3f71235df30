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
