"""offline.train_pair: a real (trained) draft/target pair, made offline in seconds here.

The quality figures of the default 10-minute run are in docs/trained_pair.md; these tests check
the mechanics: the kept-vocabulary loss is exactly the saved model's loss over GPT-2's whole
vocabulary, the checkpoints load and decode speculatively, writing is atomic, bad input errors.
"""

import dataclasses
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_DRAFT, TINY_TARGET, stdlib_texts
from gpt2 import load_gpt2
from offline import train_pair as tp
from spec_decoding import (autoregressive_generate, SamplingParams, speculative_sampling,
                           speculative_sampling_greedy)

FAST = tp.TrainSettings(target_steps=3, draft_steps=3, batch_size=4, seed=0)


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
    result = speculative_sampling(target, draft, prompt, 40, gamma=4,
                                  sampling=SamplingParams(temperature=1.0, generator=torch.Generator().manual_seed(0)))
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
    # the same command again (the README's, run twice): the pair it would train is there, kept
    said = []
    assert tp.train_pair(out, texts, FAST, log=said.append) == json.loads((out / tp.MARKER).read_text())
    assert "kept as it is" in said[0] and before == {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # other settings: refused without --overwrite
    with pytest.raises(tp.TrainPairError, match="already holds a trained pair.*--overwrite"):
        tp.train_pair(out, texts, dataclasses.replace(FAST, seed=FAST.seed + 1), log=lambda *a: None)

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
        tp.train_pair(out, texts, tp.TrainSettings(target_steps=3, draft_steps=3, batch_size=4, seed=1), overwrite=True,
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


# Held-out losses of two runs of the test settings (conftest.trained_pair_dirs) with the same seed
# on other CPU kernels and thread counts: the weights differ in their last bits, the losses by far
# less than this (docs/trained_pair.md has the measured differences).
SAME_SEED_TOLERANCE = 1e-3
STEPS_ON_OTHER_KERNELS = 20  # each model's, for the run on other CPU kernels


def test_same_seed_same_steps_and_losses_on_other_cpu_kernels(trained_pair_dirs, tmp_path):
    """The fixture's settings, 20 steps each, here and in a fresh interpreter with torch's plainest
    CPU kernels (ATEN_CPU_CAPABILITY=default: no SIMD): a run that rounds differently, as another
    machine would. Same step counts; losses within SAME_SEED_TOLERANCE. (Other thread counts:
    docs/trained_pair.md.)"""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    settings = dict(json.loads((trained_pair_dirs[0].parent / tp.MARKER).read_text())["settings"],
                    target_steps=STEPS_ON_OTHER_KERNELS, draft_steps=STEPS_ON_OTHER_KERNELS)
    tp.train_pair(tmp_path / "ours", stdlib_texts(), tp.TrainSettings(**settings), TINY_TARGET, TINY_DRAFT,
                  log=lambda *a: None)
    ours = json.loads((tmp_path / "ours" / tp.MARKER).read_text())
    code = f"""
import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
from conftest import TINY_TARGET, TINY_DRAFT, stdlib_texts
from offline.train_pair import TrainSettings, train_pair
info = train_pair({str(tmp_path / 'pair')!r}, stdlib_texts(), TrainSettings(**{settings!r}),
                  TINY_TARGET, TINY_DRAFT, log=lambda *a: None)
import torch; print(torch.backends.cpu.get_cpu_capability())
"""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "TRAIN_PAIR_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "DEFAULT"
    theirs = json.loads((tmp_path / "pair" / tp.MARKER).read_text())
    assert theirs["machine"]["cpu_capability"] == "DEFAULT"
    for name in ("target", "draft"):
        assert theirs[name]["steps"] == ours[name]["steps"] == STEPS_ON_OTHER_KERNELS
        assert theirs[name]["held_out_loss"] == pytest.approx(ours[name]["held_out_loss"], abs=SAME_SEED_TOLERANCE)
        assert theirs[name]["final_train_loss"] == pytest.approx(ours[name]["final_train_loss"], abs=SAME_SEED_TOLERANCE)


def test_minutes_is_a_cap_that_is_reported(tmp_path, tiny_sizes, capsys):
    """By default a run is its steps, whatever the time; --minutes cuts it short and says so, in
    the output, train_pair.json and README.md."""
    out = tmp_path / "pair"
    assert tp.main(["--out", str(out), "--steps", "100000", "--minutes", "0.002",
                    "--text", *stdlib_texts()[:1]]) == 0
    printed = capsys.readouterr().out
    assert "note: --minutes 0.002 cut the target's training short" in printed
    info = json.loads((out / tp.MARKER).read_text())
    assert info["target"]["cut_short"] and info["target"]["steps"] < info["target"]["planned_steps"] == 100000
    readme = (out / "README.md").read_text()
    assert "(of 100000: cut short by --minutes)" in readme and "so this pair is not the default one" in readme
    assert "Machine: " in readme and "load average" in readme
    assert "Not comparable" in printed or "No documented default run" in printed


def test_the_comparison_with_the_documented_run(trained_pair_dirs, tmp_path):
    """compare_with_reference: the same run reads as within the tolerance, a run whose losses moved
    more as not, and one with other settings as not comparable."""
    info = json.loads((trained_pair_dirs[0].parent / tp.MARKER).read_text())
    reference = tmp_path / "reference_run.json"

    def compare(ref):
        reference.write_text(json.dumps(ref))
        return tp.compare_with_reference(info, TINY_TARGET, TINY_DRAFT, reference)

    assert "Same settings and corpus: within the" in compare(info)
    moved = json.loads(json.dumps(info))
    moved["draft"]["held_out_loss"] += 2 * tp.REPRODUCIBLE_WITHIN
    assert "more than 0.02 nats apart" in compare(moved)
    other = json.loads(json.dumps(info))
    other["settings"]["seed"] = 5
    assert "Not comparable: this run differs in seed" in compare(other)
    assert "No documented default run" in tp.compare_with_reference(info, TINY_TARGET, TINY_DRAFT,
                                                                      tmp_path / "missing.json")


def said(estimate: tp.FinishEstimate, step_seconds: list[float]) -> list[tuple[int, float]]:
    """(steps done, seconds left) each time the estimate asks to be printed."""
    out = []
    for seconds in step_seconds:
        if (left := estimate.step_done(seconds)) is not None:
            out.append((estimate.done, left))
    return out


def test_the_estimate_is_said_once_on_a_steady_machine():
    """Steady 1 s steps with a little jitter: said once, after the first window, exactly right."""
    steps = 200
    times = [1.0 + 0.05 * ((i * 7) % 5 - 2) for i in range(steps)]
    printed = said(tp.FinishEstimate(steps, window=20), times)
    assert len(printed) == 1 and printed[0][0] == 20
    assert printed[0][1] == pytest.approx(sum(times[:20]) / 20 * 180)


def test_the_estimate_follows_a_machine_that_gets_busy():
    """The pace quadruples after 40 steps (other jobs start): a first-steps projection would stay
    4x too short (as a fixed estimate did: 13 min said, 46 min taken); the moving window says it
    again, with a time left that matches the new pace, and not at every step. Shown to fail with
    the estimate never said again, and with a pace averaged over all steps (its time left lags)."""
    steps, window = 400, 20
    times = [1.0] * 40 + [4.0] * 360
    printed = said(tp.FinishEstimate(steps, window=window), times)
    assert len(printed) >= 2 and printed[0] == (20, pytest.approx(380.0))
    done, left = printed[-1]
    assert done <= 40 + window and left == pytest.approx(4.0 * (steps - done), rel=0.25)
    assert len(printed) <= 3  # once the new pace fills half the window, then quiet


def test_the_estimate_is_not_said_again_for_a_small_move_or_near_the_end():
    """A pace 20% slower (under REPRINT_SHARE) is not worth a line; nor is a change in the last window."""
    assert len(said(tp.FinishEstimate(300, window=20), [1.0] * 100 + [1.2] * 200)) == 1
    assert len(said(tp.FinishEstimate(300, window=20), [1.0] * 285 + [10.0] * 15)) == 1
    # and a move past the share is said: the same machine twice as slow
    assert len(said(tp.FinishEstimate(300, window=20), [1.0] * 100 + [2.0] * 200)) >= 2
