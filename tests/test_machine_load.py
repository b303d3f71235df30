"""A busy machine is said in one line, with what to do: the main job, benchmark.py and
offline.train_pair note the load (faked here) and PyTorch's threads; train_pair projects its
finish and says when it runs far slower than its reference run."""

import os

import pytest
import torch

from gpt2.speed import machine_load
from offline import train_pair as tp


@pytest.fixture
def busy(monkeypatch):
    """A 2-core machine with a load average of 6.3 (others keep its cores busy), PyTorch on 2 threads."""
    monkeypatch.setattr(os, "getloadavg", lambda: (6.3, 5.0, 4.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_busy_note_names_load_cores_threads_and_the_way_out(busy, monkeypatch):
    note = machine_load.busy_note("--threads 1")
    assert note == ("note: machine busy (load 6.3 on 2 cores): timings will be noisy; try --threads 1 "
                    "(PyTorch runs 2 threads here, which wait for each other when a core is taken)")
    torch.set_num_threads(1)
    assert machine_load.busy_note().endswith("PyTorch already runs one thread")
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))  # below the core count: quiet
    assert machine_load.busy_note() is None


def test_the_main_job_and_the_benchmark_say_it_before_anything_loads(busy, tmp_path, capsys, monkeypatch):
    """Both scripts, with a --target that does not exist: the note comes first, then the error."""
    import benchmark
    import spec_decoding_generate
    monkeypatch.chdir(tmp_path)
    assert spec_decoding_generate.main(["--target", "no/such/target", "--draft", "no/such/draft"]) == 2
    err = capsys.readouterr().err
    assert err.index("note: machine busy (load 6.3 on 2 cores)") < err.index("error:")
    assert "try --threads 1" in err
    with pytest.raises(SystemExit):
        benchmark.main(["--target", "no/such/target", "--draft", "no/such/draft", "--out", "runs/b"])
    assert "note: machine busy (load 6.3 on 2 cores)" in capsys.readouterr().out


def test_main_job_threads_option_sets_torchs_threads(tmp_path, monkeypatch, capsys):
    import spec_decoding_generate
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    try:
        spec_decoding_generate.main(["--threads", "1", "--target", "no/such/target"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_train_pair_on_a_quiet_slow_machine_advises_fewer_threads_only_when_it_has_more(monkeypatch):
    """Slower than the reference run with the machine quiet: two threads get the advice to try one;
    a run already on one thread is not told to try --threads 1."""
    import json
    ref = json.loads(tp.REFERENCE_RUN.read_text())
    per_step = ref["target"]["seconds"] / ref["target"]["steps"]
    batch = tp.TrainSettings().batch_size
    notes = {}
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        notes[threads] = tp.pace_note("target", tp.TARGET_CONFIG, batch, 20, 3 * 20 * per_step, tp.TARGET_STEPS)
    assert "\nnote: 3.0x slower than the reference run: a slower CPU, or other programs on it" in notes[1]
    assert "--threads" not in notes[1]
    assert notes[2].endswith("a slower CPU, or other programs on it; with 2 threads, try --threads 1")


def test_train_pair_projects_its_finish_beside_the_reference_run(busy):
    """The default target's first 20 steps: at the reference run's pace, a projection and the
    reference's time; three times slower, a note with the load and the thread advice. A model of
    other sizes gets the projection alone (no reference to compare with)."""
    import json
    ref = json.loads(tp.REFERENCE_RUN.read_text())
    per_step = ref["target"]["seconds"] / ref["target"]["steps"]
    batch = tp.TrainSettings().batch_size
    line = tp.pace_note("target", tp.TARGET_CONFIG, batch, 20, 20 * per_step, tp.TARGET_STEPS)
    assert line.startswith(f"target: 20 steps in {20 * per_step:.0f} s, so the {tp.TARGET_STEPS} steps "
                           f"should take about {per_step * tp.TARGET_STEPS / 60:.0f} min (the reference run:")
    assert "slower" not in line
    slow = tp.pace_note("target", tp.TARGET_CONFIG, batch, 20, 3 * 20 * per_step, tp.TARGET_STEPS)
    assert "\nnote: 3.0x slower than the reference run: machine busy (load 6.3 on 2 cores)" in slow
    assert "try --threads 1" in slow
    other = tp.pace_note("target", tp.TARGET_CONFIG.with_(n_embd=64), batch, 20, 60.0, 100)
    assert other == "target: 20 steps in 60 s, so the 100 steps should take about 5 min"
