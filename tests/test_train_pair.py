"""offline.train_pair: a real (trained) draft/target pair, made offline in seconds here.

The quality figures of the default 10-minute run are in docs/trained_pair.md; these tests check
the mechanics: the kept-vocabulary loss is exactly the saved model's loss over GPT-2's whole
vocabulary, the checkpoints load and decode speculatively, writing is atomic, bad input errors.
"""

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_DRAFT, TINY_TARGET, stdlib_texts
from gpt2 import load_gpt2
from offline import train_pair as tp
from spec_decoding import autoregressive_generate, speculative_sampling, speculative_sampling_greedy

FAST = tp.TrainSettings(steps=3, batch_size=4, seed=0)


@pytest.fixture
def tiny_sizes(monkeypatch):
    """The command line trains the default sizes; make them tiny for a seconds-long run."""
    monkeypatch.setattr(tp, "TARGET_CONFIG", TINY_TARGET)
    monkeypatch.setattr(tp, "DRAFT_CONFIG", TINY_DRAFT)
    monkeypatch.setenv("TRAIN_PAIR_PROGRESS", "0")


def test_compact_loss_is_the_full_vocabulary_loss():
    """Expand compact logits to all 50257 tokens the way the saved model does (every token not
    kept gets the "other" row's logit) and compare cross-entropies: they must be equal."""
    g = torch.Generator().manual_seed(0)
    vocab = tp.Vocabulary(torch.randperm(tp.GPT2_VOCAB_SIZE, generator=g)[:300].tolist())
    compact_logits = torch.randn(5, 7, len(vocab.kept) + 1, generator=g) * 3
    full_targets = torch.randint(0, tp.GPT2_VOCAB_SIZE, (5, 7), generator=g)
    full_targets[0, :4] = torch.tensor(vocab.kept[:4])  # some kept tokens too
    full_logits = compact_logits[..., vocab.compact_ids()]  # [5, 7, 50257]
    expected = F.cross_entropy(full_logits.flatten(0, 1), full_targets.flatten())
    got = tp.compact_loss(compact_logits, vocab.compact_ids()[full_targets], vocab)
    torch.testing.assert_close(got, expected)
    # Without the log(n_other) terms the two differ: the test would catch their loss.
    naive = F.cross_entropy(compact_logits.flatten(0, 1), vocab.compact_ids()[full_targets].flatten())
    assert abs(naive.item() - expected.item()) > 0.5


def test_saved_models_score_the_held_out_text_as_training_measured(trained_pair_dirs):
    """The held-out loss written in train_pair.json (computed on the compact model) equals the
    loss of the saved full-vocabulary checkpoint on the same tokens: the export is exact."""
    target_dir, draft_dir = trained_pair_dirs
    info = json.loads((target_dir.parent / tp.MARKER).read_text())
    docs = tp.tokenize_files(tp.corpus_files(stdlib_texts()))
    _, held_out = tp.split_documents(docs)
    for name, folder in (("target", target_dir), ("draft", draft_dir)):
        model = load_gpt2(folder)
        assert model.config.vocab_size == 50257
        loss = tp.held_out_loss(model, torch.tensor(held_out))
        assert loss == pytest.approx(info[name]["held_out_loss"], abs=2e-3)
        assert loss < math.log(50257) - 2, f"the {name} learned nothing (loss {loss:.2f})"
    assert info["target"]["n_layer"] > info["draft"]["n_layer"]


def test_trained_pair_decodes_speculatively_with_real_rejections(trained_pair_dirs):
    target, draft = (load_gpt2(d) for d in trained_pair_dirs)
    prompt = tp.encode("def main(argv):\n    ")
    greedy = speculative_sampling_greedy(target, draft, prompt, 30, gamma=4)
    assert greedy.tokens == autoregressive_generate(target, prompt, 30).tokens
    result = speculative_sampling(target, draft, prompt, 40, gamma=4, temperature=1.0,
                                  generator=torch.Generator().manual_seed(0))
    assert len(result.tokens) == 40
    assert 0 < result.stats.alpha < 1, "a trained pair should disagree sometimes, not always"


def test_command_line_end_to_end(tmp_path, tiny_sizes, capsys):
    out = tmp_path / "pair"
    assert tp.main(["--out", str(out), "--steps", "2", "--text", *stdlib_texts()[:3]]) == 0
    for name in ("target", "draft"):
        assert sorted(p.name for p in (out / name).iterdir()) == ["config.json", "model.safetensors"]
        load_gpt2(out / name)
    readme = (out / "README.md").read_text()
    assert "python -m offline.train_pair --out" in readme and "unigram" in readme
    info = json.loads((out / tp.MARKER).read_text())
    assert info["target"]["steps"] == info["draft"]["steps"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["pair"]  # no temporary folder left behind


def test_same_seed_same_weights(tmp_path, tiny_sizes):
    texts = stdlib_texts()[:2]
    for name in ("a", "b"):
        tp.train_pair(tmp_path / name, texts, FAST, log=lambda *a: None)
    for model in ("target", "draft"):
        a = (tmp_path / "a" / model / "model.safetensors").read_bytes()
        assert a == (tmp_path / "b" / model / "model.safetensors").read_bytes()


def test_an_existing_pair_needs_overwrite_and_is_never_half_replaced(tmp_path, tiny_sizes, monkeypatch):
    texts = stdlib_texts()[:2]
    out = tmp_path / "pair"
    tp.train_pair(out, texts, FAST, log=lambda *a: None)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(tp.TrainPairError, match="already holds a trained pair.*--overwrite"):
        tp.train_pair(out, texts, FAST, log=lambda *a: None)

    # Replacing it fails while writing the second checkpoint (a full disk, say): the old pair stays.
    real_save = tp.save_checkpoint
    calls = []

    def save_then_fail(directory, state, config):
        calls.append(directory)
        if len(calls) == 2:
            (directory).mkdir(parents=True)
            (directory / "model.safetensors").write_bytes(b"half")
            raise OSError("No space left on device")
        return real_save(directory, state, config)

    monkeypatch.setattr(tp, "save_checkpoint", save_then_fail)
    with pytest.raises(OSError, match="No space"):
        tp.train_pair(out, texts, tp.TrainSettings(steps=3, batch_size=4, seed=1), overwrite=True,
                      log=lambda *a: None)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["pair"]


def test_interrupted_training_writes_nothing(tmp_path, tiny_sizes, monkeypatch, capsys):
    real_train_one = tp.train_one

    def interrupted(name, *args, **kwargs):
        if name == "draft":
            raise KeyboardInterrupt  # Ctrl-C while the draft trains
        return real_train_one(name, *args, **kwargs)

    monkeypatch.setattr(tp, "train_one", interrupted)
    out = tmp_path / "pair"
    assert tp.main(["--out", str(out), "--steps", "2", "--text", *stdlib_texts()[:2]]) == 130
    assert "nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, args, message", [
    (lambda d: (d / "empty").mkdir() or (d / "empty" / "a.txt").write_text(""),
     ["--text", "{d}/empty"], "empty or too small"),
    (lambda d: None, ["--text", "{d}/missing.txt"], "no such file or folder"),
    (lambda d: (d / "other").mkdir() or (d / "other" / "weights.bin").write_bytes(b"x"),
     ["--out", "{d}/other"], "already holds other files"),
    (lambda d: (d / "a_file").write_text("x"), ["--out", "{d}/a_file"], "is a file"),
])
def test_bad_input_is_a_clear_error(tmp_path, tiny_sizes, capsys, make, args, message):
    make(tmp_path)
    args = [a.format(d=tmp_path) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "pair")]
    if "--text" not in args:
        args += ["--text", *stdlib_texts()[:1]]
    assert tp.main(args + ["--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not (tmp_path / "pair").exists()


def test_evaluate_scores_a_saved_pair_on_other_text(trained_pair_dirs, tmp_path, capsys):
    folder = trained_pair_dirs[0].parent
    other = [str(p) for p in sorted((tp.Path(tp.__file__).parent).glob("*.py"))[:3]]  # offline/*.py
    assert tp.main(["--evaluate", str(folder), "--text", *other]) == 0
    line = capsys.readouterr().out
    numbers = [float(x) for x in re.findall(r"(?:target|draft|unigram) (\d+\.\d+)", line)]
    assert len(numbers) == 3 and all(0 < x < 12 for x in numbers), line
    assert tp.main(["--evaluate", str(tmp_path), "--text", *other]) == 2
    assert "holds no pair made by offline.train_pair" in capsys.readouterr().err
