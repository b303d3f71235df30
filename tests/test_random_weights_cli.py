"""python -m offline.random_weights: stand-ins of a chosen size from the command line."""

import json

import pytest
import torch

from gpt2 import load_gpt2
from offline.random_weights import SIZES, file_bytes, main


def test_writes_a_tiny_pair_the_script_can_use(tmp_path, capsys):
    out = tmp_path / "pair"
    assert main(["--size", "tiny", "--draft-layers", "2", "--out", str(out)]) == 0
    target, draft = load_gpt2(out / "target"), load_gpt2(out / "draft")
    assert target.config == SIZES["tiny"] and draft.config == SIZES["tiny"].with_(n_layer=2)
    assert target.config.vocab_size == 50257 and target.config.n_positions == 1024
    # the draft is the target's first blocks
    torch.testing.assert_close(draft.h[1].mlp.c_fc.weight, target.h[1].mlp.c_fc.weight, atol=0, rtol=0)
    assert json.loads((out / "standins.json").read_text())["seed"] == 0
    assert f"--target {out / 'target'} --draft {out / 'draft'}" in capsys.readouterr().out
    assert (out / "target" / "model.safetensors").stat().st_size == pytest.approx(
        file_bytes(SIZES["tiny"]), rel=1e-3)


def test_single_model_and_no_overwrite(tmp_path, capsys):
    out = tmp_path / "one"
    assert main(["--size", "tiny", "--out", str(out), "--seed", "3"]) == 0
    first = (out / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit) as e:
        main(["--size", "tiny", "--out", str(out), "--seed", "4"])
    assert e.value.code == 2 and "already exists; not overwriting" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == first
    assert main(["--size", "tiny", "--out", str(out), "--seed", "4", "--force"]) == 0
    assert (out / "model.safetensors").read_bytes() != first


@pytest.mark.parametrize("argv, words", [
    (["--size", "gpt3"], "invalid choice: 'gpt3'"),
    (["--size", "tiny", "--draft-layers", "4"], "--draft-layers must be between 1 and 3"),
    (["--size", "gpt2-xl", "--draft-layers", "0"], "between 1 and 47"),
])
def test_bad_arguments(argv, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_sizes_are_the_official_shapes():
    from gpt2 import OFFICIAL_CONFIGS
    assert {k: v for k, v in SIZES.items() if k != "tiny"} == OFFICIAL_CONFIGS
    # file_bytes agrees with the real gpt2-large file (3.25 GB with its mask buffers)
    assert file_bytes(SIZES["gpt2-large"]) == pytest.approx(3.25e9, rel=0.01)
