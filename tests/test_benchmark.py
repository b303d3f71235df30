"""benchmark.py on a tiny agreeing pair with GPT-2's vocabulary: the grid run end to end, as
`python benchmark.py ...` in one real process (what a shell sees: the files it writes, its exit
status); the other runs through main() in the test's process (the same code, one start-up less)."""

import contextlib
import csv
import io
import json
import os
import statistics
import subprocess
import sys

import pytest
from PIL import Image

from conftest import ROOT
from spec_decoding.policies.theory import predicted_speedup

REQUIRED_CELL_FIELDS = {
    "gamma", "max_gen", "temperature", "speedup_median", "speedup_min", "speedup_max",
    "target_tokens_per_s", "spec_tokens_per_s", "acceptance_rate", "tokens_per_target_call",
    "acceptance_by_position", "target_calls", "draft_calls", "predicted_speedup", "tokens_match_baseline",
}
PLOTS = ("benchmark_heatmap.png", "benchmark_speedup_vs_gamma.png", "benchmark_acceptance.png")
GAMMAS, MAX_GENS, TEMPERATURES = (1, 2), (8, 16), (0.0, 1.0)


def run_in_process(*args) -> str:
    """What benchmark.main(args), run in this process, printed to stdout."""
    import benchmark

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        benchmark.main([str(a) for a in args])
    return out.getvalue()


def run_benchmark(*args, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(ROOT / "benchmark.py"), *map(str, args)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def benchmark_run(text_pair_dirs, shared):
    """The grid run, once for the whole test run (`shared`): its tests may be spread over the workers."""
    target_dir, draft_dir = text_pair_dirs
    pair = ("--draft", draft_dir, "--target", target_dir)

    def build(folder):
        out = folder / "out"
        return out, run_benchmark(*pair, "--gammas", *GAMMAS, "--max-gens", *MAX_GENS,
                                  "--temperatures", *TEMPERATURES, "--repeats", 1, "--threads", 1, "--out", out,
                                  "--device", "cpu")  # the CPU's formats (a GPU machine's auto is cuda)

    out, proc = shared("benchmark-grid-run", build)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc, pair


def test_writes_all_files(benchmark_run):
    out, proc, _ = benchmark_run
    for name in ("results.csv", "results.json", "summary.md") + PLOTS:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for name in PLOTS:
        with Image.open(out / name) as image:
            image.verify()
            assert image.format == "PNG"
        with Image.open(out / name) as image:
            assert image.size[0] > 100 and image.size[1] > 100
    assert "| Gamma | Avg Speedup |" in proc.stdout  # the summary table
    # the kernel choice: in the script's own lines (after loading, and in the summary), not as a note
    assert "target: accelerated by gpt2.speed (" in proc.stdout and "Kernels (target): accelerated" in proc.stdout
    assert "kernels: gpt2/speed/kernels.py" not in proc.stderr
    assert (out / "summary.md").read_text() in proc.stdout


def test_csv_has_one_row_per_cell(benchmark_run):
    out, _, _ = benchmark_run
    with open(out / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert REQUIRED_CELL_FIELDS <= set(reader.fieldnames)
    assert len(rows) == len(GAMMAS) * len(MAX_GENS) * len(TEMPERATURES)
    assert {(int(r["gamma"]), int(r["max_gen"]), float(r["temperature"])) for r in rows} == {
        (g, m, t) for g in GAMMAS for m in MAX_GENS for t in TEMPERATURES}
    cells = {(c["gamma"], c["max_gen"], c["temperature"]): c
             for c in json.loads((out / "results.json").read_text())["cells"]}
    for r in rows:
        cell = cells[(int(r["gamma"]), int(r["max_gen"]), float(r["temperature"]))]
        assert float(r["speedup_median"]) == pytest.approx(cell["speedup_median"])
        assert len(json.loads(r["acceptance_by_position"])) == cell["gamma"]


def test_json_layout(benchmark_run):
    out, _, _ = benchmark_run
    results = json.loads((out / "results.json").read_text())
    assert {"cells", "costs", "environment", "best_gamma_measured", "best_gamma_predicted"} <= set(results)
    assert results["best_gamma_measured"] in GAMMAS and results["best_gamma_predicted"] in GAMMAS
    costs = results["costs"]
    assert costs["drafters"]["model"]["c"] > 0 and set(costs["verify_cost_by_gamma"]) == {str(g) for g in GAMMAS}
    env = results["environment"]
    for key in ("torch", "device", "device_name", "dtype", "threads", "draft", "target", "date", "command"):
        assert env[key] not in (None, ""), key
    assert env["device"] == "cpu" and env["dtype"] == "float32" and env["threads"] == 1
    assert env["standins"] is False
    for cell in results["cells"]:
        assert REQUIRED_CELL_FIELDS <= set(cell)


def test_numbers_hang_together(benchmark_run):
    out, _, _ = benchmark_run
    results = json.loads((out / "results.json").read_text())
    costs = results["costs"]
    for cell in results["cells"]:
        runs = cell["run_records"]
        assert cell["runs"] == len(runs) == 5  # the five default prompts x 1 repeat
        # Every run makes exactly max_gen tokens, the baseline too.
        assert all(r["generated_tokens"] == r["baseline_tokens"] == cell["max_gen"] for r in runs)
        assert cell["generated_tokens"] == sum(r["generated_tokens"] for r in runs)
        assert cell["target_calls"] == sum(r["target_calls"] for r in runs)
        assert cell["draft_calls"] == sum(r["draft_calls"] for r in runs)
        assert cell["tokens_per_target_call"] == pytest.approx(cell["generated_tokens"] / cell["target_calls"])
        assert 1 <= cell["tokens_per_target_call"] <= cell["gamma"] + 1
        # Speed-up = baseline time / speculative time, run by run; the cell gives their median.
        for r in runs:
            assert r["speedup"] == pytest.approx(r["baseline_seconds"] / r["spec_seconds"])
        speedups = [r["speedup"] for r in runs]
        assert cell["speedup_median"] == pytest.approx(statistics.median(speedups))
        assert cell["speedup_min"] == pytest.approx(min(speedups))
        assert cell["speedup_max"] == pytest.approx(max(speedups))
        assert cell["speedup_min"] <= cell["speedup_q1"] <= cell["speedup_median"] <= cell["speedup_q3"] <= cell["speedup_max"]
        baseline_s = sum(r["baseline_seconds"] for r in runs)
        assert cell["target_tokens_per_s"] == pytest.approx(5 * cell["max_gen"] / baseline_s)
        # Acceptance.
        assert 0 <= cell["acceptance_rate"] <= 1 and 0 <= cell["alpha"] <= 1
        assert cell["acceptance_rate"] <= cell["alpha"] + 1e-12
        assert len(cell["acceptance_by_position"]) == cell["gamma"]
        assert all(a is None or 0 <= a <= 1 for a in cell["acceptance_by_position"])
        if cell["gamma"] == 1:
            assert cell["acceptance_by_position"][0] == pytest.approx(cell["acceptance_rate"])
        assert cell["predicted_speedup"] == pytest.approx(predicted_speedup(
            cell["alpha"], cell["gamma"], costs["drafters"]["model"]["c"],
            costs["verify_cost_by_gamma"][str(cell["gamma"])]))
        # Greedy speculative decoding reproduces the target's own greedy tokens.
        if cell["temperature"] == 0:
            assert cell["tokens_match_baseline"] is True
        else:
            assert cell["tokens_match_baseline"] is None


def test_refuses_to_overwrite_without_force(benchmark_run, capsys):
    """(The arguments are checked before anything is loaded: parse_args here, as the script runs it.)"""
    import benchmark

    out, _, pair = benchmark_run
    before = (out / "results.json").read_text()
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args([*map(str, pair), "--gammas", "1", "--max-gens", "4", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--force" in err and "results.json" in err
    assert (out / "results.json").read_text() == before


@pytest.mark.parametrize("args", [["--gammas", "two"], ["--gammas", "-3"], ["--gammas", "0"], ["--max-gens", "1.5"],
                                  ["--temperatures", "-1"], ["--repeats", "0"]])
def test_bad_numbers_exit_2_with_the_option_named(args, tmp_path, capsys):
    import benchmark

    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args([*args, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument {args[0]}: {args[1]!r} is not" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_offline_error_says_how_to_pass_local_paths(tmp_path):
    proc = run_benchmark("--draft", "gpt2", "--out", tmp_path / "out", timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "--draft DIR --target DIR" in proc.stderr and "--make-standins" in proc.stderr


def test_compare_hf_without_transformers_says_so(tmp_path, capsys, monkeypatch):
    import benchmark

    monkeypatch.setitem(sys.modules, "transformers", None)  # "import transformers" now fails
    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--compare-hf", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--compare-hf needs Hugging Face transformers, which is not installed" in err
    assert "pip install transformers" in err


def test_missing_tokenizer_files_are_a_clear_error_not_a_traceback(monkeypatch, tmp_path, capsys):
    import benchmark

    def offline_encode(text):
        raise RuntimeError("GPT-2's tokenizer file .../vocab.bpe is missing: reinstall the package")

    import benchmarks.common  # where benchmark.py's read_prompts encodes
    monkeypatch.setattr(benchmarks.common, "encode", offline_encode)
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main(["--draft", "x", "--target", "y", "--out", str(tmp_path / "out")])
    assert "error: GPT-2's tokenizer file .../vocab.bpe is missing" in str(exit_info.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        benchmark.read_prompts(tmp_path / "no-such-prompts.txt")
    assert "cannot read the prompts file" in str(exit_info.value)


def test_prompt_longer_than_the_context_window_is_a_clear_error():
    import benchmark

    with pytest.raises(SystemExit, match="a prompt has 130 tokens; the models' context window holds 128"):
        benchmark.check_prompts_fit([[1] * 5, [1] * 130], vocab_size=50257, n_positions=128)
    benchmark.check_prompts_fit([[1] * 127], vocab_size=50257, n_positions=128)  # fits


def test_unavailable_device_is_a_clear_error(tmp_path):
    import torch

    import benchmark

    if torch.cuda.is_available():
        pytest.skip("CUDA exists here")
    with pytest.raises(SystemExit, match="error: device .cuda.: CUDA is not available here"):
        benchmark.main(["--draft", "x", "--target", "y", "--device", "cuda", "--out", str(tmp_path / "o")])


class Loaded(Exception):
    """Raised by a stand-in for benchmark.load_model: the run got as far as loading."""


def test_max_gens_past_the_window_are_clamped_before_any_model_is_loaded(text_pair_dirs, tmp_path,
                                                                         capsys, monkeypatch):
    import benchmark
    import torch
    import gpt2.speed.device
    from gpt2.speed.device import dtype_note
    def stop(*args, **kwargs):
        raise Loaded
    monkeypatch.setattr(benchmark, "load_model", stop)
    monkeypatch.setattr(benchmark, "make_standins", stop)
    longest = max(len(p) for p in benchmark.read_prompts(benchmark.DEFAULT_PROMPTS))
    target_dir, draft_dir = text_pair_dirs  # n_positions 128
    for extra, n_positions in ([["--draft", draft_dir, "--target", target_dir], 128],
                               [["--make-standins", tmp_path / "standins"], 1024]):
        monkeypatch.setattr(gpt2.speed.device, "_NOTES_SHOWN", set())  # said once per process: this one fresh
        with pytest.raises(Loaded):
            benchmark.main([*map(str, extra), "--max-gens", "8", "2000", "--dtype", "bfloat16",
                            "--out", str(tmp_path / "out")])
        out = capsys.readouterr().out
        assert (f"note: --max-gens 2000: the models' context window of {n_positions} tokens leaves "
                f"room for {n_positions - longest} new tokens") in out
        assert f"clamped to {n_positions - longest}" in out
        note = dtype_note(torch.bfloat16, torch.device("cpu"))  # --dtype bfloat16 on a CPU
        assert note in out if note else "note: bfloat16" not in out


def test_clamp_max_gens(capsys):
    import benchmark
    prompts = [[1] * 20, [1] * 30]
    assert benchmark.clamp_max_gens([8, 100, 2000], prompts, 128) == [8, 98]
    assert "clamped to 98" in capsys.readouterr().out
    assert benchmark.clamp_max_gens([8, 98], prompts, 128) == [8, 98]  # fits: nothing to say
    assert capsys.readouterr().out == ""


def test_dtype_defaults_to_auto(tmp_path):
    import benchmark
    assert benchmark.parse_args(["--out", str(tmp_path / "out")]).dtype == "auto"


def test_mismatched_pair_is_named_before_anything_runs(text_pair_dirs, make_checkpoint, tmp_path):
    import benchmark
    from conftest import TINY
    with pytest.raises(SystemExit, match="share one tokenizer"):
        benchmark.main(["--target", str(text_pair_dirs[0]), "--draft", str(make_checkpoint(TINY)),
                        "--max-gens", "4", "--out", str(tmp_path / "out")])


# ---------------------------------------------------------------- --drafters: a grid axis

@pytest.fixture(scope="module")
def drafters_run(text_pair_dirs, shared):
    target_dir, _ = text_pair_dirs

    def build(folder):
        out = folder / "out"
        # no model drafter: --draft is never loaded, so a missing folder is fine
        return out, run_in_process("--target", target_dir, "--draft", "/nonexistent/draft",
                                   "--drafters", "ngram:2", "layerskip:2", "--gammas", 1, 3, "--max-gens", 12,
                                   "--threads", 1, "--out", out)

    return shared("benchmark-drafters-run", build)


def test_drafters_are_a_grid_axis(drafters_run):
    out, stdout = drafters_run
    results = json.loads((out / "results.json").read_text())
    cells = results["cells"]
    assert [(c["drafter"], c["gamma"]) for c in cells] == [
        ("ngram:2", 1), ("ngram:2", 3), ("layerskip:2", 1), ("layerskip:2", 3)]
    with open(out / "results.csv", newline="") as f:
        assert [(r["drafter"], r["gamma"]) for r in csv.DictReader(f)] == [
            (c["drafter"], str(c["gamma"])) for c in cells]
    costs = results["costs"]["drafters"]
    assert set(costs) == {"ngram:2", "layerskip:2"}
    # a lookup costs far less than a forward of two blocks
    assert 0 < costs["ngram:2"]["c"] < costs["layerskip:2"]["c"]
    for cell in cells:
        assert cell["tokens_match_baseline"] is True
        assert cell["drafter"] == cell["run_records"][0]["drafter"]
        assert cell["predicted_speedup"] == pytest.approx(predicted_speedup(
            cell["alpha"], cell["gamma"], costs[cell["drafter"]]["c"],
            results["costs"]["verify_cost_by_gamma"][str(cell["gamma"])]))
        expected_calls = 0 if cell["drafter"] == "ngram:2" else sum(r["tokens_drafted"] for r in cell["run_records"])
        assert cell["draft_calls"] == expected_calls
    assert set(results["by_drafter"]) == {"ngram:2", "layerskip:2"}
    assert "Drafters side by side" in stdout
    assert "### Drafter ngram:2 (prompt lookup, n-grams of up to 2 tokens)" in stdout
    assert "### Drafter layerskip:2 (the target's first 2 blocks)" in stdout
    assert "Loading target" in stdout and "draft" not in stdout.split("\n", 1)[0]
    for name in PLOTS:
        with Image.open(out / name) as image:
            assert image.size[1] > 800  # one row of panels per drafter


@pytest.mark.parametrize("spec, canonical", [("model", "model"), ("ngram", "ngram:3"), ("ngram:5", "ngram:5"),
                                             ("layerskip:6", "layerskip:6")])
def test_drafter_specs(spec, canonical):
    from spec_decoding.cli import drafter_spec

    assert drafter_spec(spec) == canonical


@pytest.mark.parametrize("spec", ["bogus", "layerskip", "layerskip:0", "ngram:x", "model:2", "ngram:-1"])
def test_bad_drafter_specs_exit_2(spec, tmp_path, capsys):
    import benchmark

    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--drafters", "model", spec, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --drafters: {spec!r} is not a drafter: use model, ngram" in err


def test_layerskip_with_all_the_targets_blocks_is_a_clear_error(text_pair_dirs, tmp_path):
    import benchmark

    target_dir, _ = text_pair_dirs
    with pytest.raises(SystemExit, match=r"error: --drafters layerskip:4: n_layers must be an int "
                                         r"between 1 and n_layer - 1 = 3"):
        benchmark.main(["--target", str(target_dir), "--drafters", "layerskip:4", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


def test_gamma_policies_beside_fixed_gammas(text_pair_dirs, tmp_path):
    """--gammas auto heuristic: rows beside the fixed gammas, with the same tokens as the target,
    the g of every round recorded, and the CostModel they used in results.json."""
    target_dir, draft_dir = text_pair_dirs
    out = tmp_path / "out"
    stdout = run_in_process("--draft", draft_dir, "--target", target_dir, "--gammas", "heuristic", 2, "auto",
                            "--gamma-max", 3, "--max-gens", 12, "--prompts", ROOT / "prompts" / "short.txt",
                            "--threads", 1, "--out", out)
    results = json.loads((out / "results.json").read_text())
    assert [c["gamma"] for c in results["cells"]] == [2, "auto", "heuristic"]
    assert len(results["costs"]["cost_models"]["model"]["target_score_s"]) == 4  # k = 1 .. gamma_max + 1
    assert results["best_gamma_measured"] == 2  # the best *fixed* gamma
    for cell in results["cells"]:
        assert cell["tokens_match_baseline"] is True
        for r in cell["run_records"]:
            assert sum(r["gamma_by_round"]) == r["draft_calls"] and len(r["gamma_by_round"]) == r["target_calls"]
            assert max(r["gamma_by_round"]) <= (2 if cell["gamma"] == 2 else 3)
        if cell["gamma"] != 2:
            assert cell["predicted_speedup"] is None and len(cell["acceptance_by_position"]) == 3
        # the speed-up the CostModel gives these rounds: target steps over the rounds' seconds
        costs = results["costs"]["cost_models"]["model"]
        t = costs["target_score_s"]
        rounds = [g for r in cell["run_records"] for g in r["gamma_by_round"]]
        expected = 3 * 12 * t[0] / sum(g * costs["draft_step_s"] + t[g] for g in rounds)
        assert cell["cost_model_speedup"] == pytest.approx(expected)
    assert "| auto |" in stdout and "| heuristic |" in stdout
    assert "Speculation pays" in stdout


def test_machine_info_needs_no_transformers(monkeypatch):
    """Every benchmark records machine_info(); transformers is a test-only reference that a
    runtime install (requirements.txt) lacks, so it must not be needed there."""
    import importlib.metadata
    import sys

    import torch

    from benchmarks.common import machine_info

    real_version = importlib.metadata.version

    def version(name):
        if name == "transformers":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    monkeypatch.setattr(importlib.metadata, "version", version)
    info = machine_info()
    assert info["transformers"] is None and info["torch"] == torch.__version__


@pytest.mark.parametrize("module, words", [("model_speed", "times transformers' GPT-2 beside ours"),
                                           ("speculative_speed", "or pass --no-hf")])
def test_a_comparison_with_transformers_without_it_says_what_to_install(module, words, monkeypatch, capsys):
    import importlib

    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed (requirements.txt only)
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"benchmarks.{module}").main(["--quick"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "pip install -r requirements-dev.txt" in err and words in err


def test_loop_overhead_times_the_loops_with_stub_models(tmp_path):
    """The stubs are what the generators need of a model (a draft with the target's logits is
    accepted every time, the never-drafting policy takes one plain step a token), and the run
    writes one row per loop."""
    import torch

    from benchmarks.loop_overhead import NeverDraft, StubModel, main
    from spec_decoding import SamplingParams, speculative_sampling

    target, draft = StubModel(50, seed=0), StubModel(50, seed=0)
    g = torch.Generator().manual_seed(0)
    result = speculative_sampling(target, draft, [1, 2], 20, 4,
                                  sampling=SamplingParams(temperature=1.0, generator=g))
    assert len(result.tokens) == 20 and result.stats.tokens_accepted == result.stats.tokens_drafted > 0
    plain_rounds = speculative_sampling(target, draft, [1, 2], 20, NeverDraft(),
                                        sampling=SamplingParams(temperature=1.0, generator=g))
    assert plain_rounds.stats.target_calls == 20 and plain_rounds.stats.tokens_drafted == 0
    main(["--quick", "--gammas", "2", "--out", str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    loops = {"plain decoding", "speculative, plain rounds only", "speculative, auto (drafting cannot pay)",
             "speculative, gamma 2"}
    assert all(f"| {loop} |" in md for loop in loops)
    assert set(json.loads((tmp_path / "results.json").read_text())["seconds_per_token"]) == loops


@pytest.mark.parametrize("speedup", [0.942865915982773, 1.0417755992103082, 1.0])
def test_the_heatmap_colour_bar_holds_its_ticks(speedup):
    """A speed-up below 1 whose 0.01-rounded tick fell below the colour bar's end made matplotlib's
    layout divide by zero (a RuntimeWarning, a bar drawn from a singular transform)."""
    import warnings

    import matplotlib.pyplot as plt

    from benchmarks.plots import heatmap

    fig, ax = plt.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        heatmap(ax, [{"gamma": 4, "max_gen": 8, "speedup_median": speedup}], 0.0)
        fig.tight_layout()
    bar = fig.axes[-1]
    lo, hi = bar.get_ylim()
    assert all(lo <= t <= hi for t in bar.get_yticks()) and lo <= speedup <= hi
    plt.close(fig)


@pytest.mark.parametrize("fmt", ["int8", "fp16"])
def test_linear_sequence_times_three_doors_that_compute_the_same(tmp_path, fmt, monkeypatch):
    """benchmarks.linear_sequence calls a step's linear layers through the bare kernel, its Python
    wrapper and the model's nn.Linear path, after checking the three give the same bits; a wrapper
    that computes anything else stops it."""
    from benchmarks import linear_sequence
    from gpt2.speed import native

    if native.why_not():
        pytest.skip(native.why_not())
    linear_sequence.main(["--quick", "--format", fmt, "--rows", "1", "3", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["layers"] == 4 * (36 // 8) + 1 and set(results["rows"]) == {"1", "3"}
    assert all(set(doors) == set(linear_sequence.DOORS) and all(len(s) == 2 for s in doors.values())
               for doors in results["rows"].values())
    assert all(f"| 3 | {door} |" in (tmp_path / "results.md").read_text() for door in linear_sequence.DOORS)
    real = native.rows_linear
    monkeypatch.setattr(native, "rows_linear", lambda *args, **kw: real(*args, **kw) + 1e-6)
    with pytest.raises(AssertionError, match="the wrapper door's output differs from the kernel's"):
        linear_sequence.main(["--quick", "--format", fmt, "--rows", "1", "--out", str(tmp_path / "bad")])


# ---------------------------------------------------------------- loops (spec_decoding/presentation/loops.py)

def ordinary_windows(n: int = 100) -> list[list[int]]:
    """Windows of n tokens of this project's own code and prose, except those mostly whitespace."""
    from gpt2 import decode, encode

    windows = []
    for path in ("spec_decoding/algorithms/decoding.py", "spec_decoding/algorithms/rejection.py", "spec_decoding/algorithms/speculative.py",
                 "gpt2/model.py", "docs/trained_pair.md"):
        ids = encode((ROOT / path).read_text())
        windows += [ids[s:s + n] for s in range(0, len(ids) - n, n)]
    return [w for w in windows if sum(decode([t]).isspace() for t in w) < n / 2]


def test_ordinary_text_is_not_a_loop():
    """Code and prose (whose indentation is runs of one space token) stay below LOOP_SHARE.
    Shown to fail when a unit equal to the one p back counts without a full copy of the period
    (every pair of equal neighbours would be a loop)."""
    from spec_decoding.presentation.loops import LOOP_SHARE, loop_share

    windows = ordinary_windows()
    assert len(windows) > 50
    shares = [loop_share(w) for w in windows]
    assert max(shares) < LOOP_SHARE, max(shares)


@pytest.mark.parametrize("text, is_loop", [
    ("\n" + " " * 39, True),  # the trained pair's greedy output under the README's old example
    (("\n" + " " * 12) * 4, True),  # a line of nothing but indentation, again and again
    ("def parse_args(argv=None):\n" + "    return self.parse_args(argv)\n" * 5, True),
    ("import os\nimport sys\n\n\ndef main():\n    print(os.getcwd())\n" + "x = x + 1\n" * 8, True),
    ("import os\nimport sys\nfrom pathlib import Path\n\n\ndef main(argv=None):\n    args = parse(argv)\n"
     "    for name in args.names:\n        print(Path(name).resolve(), file=sys.stderr)\n" + "x = 1\n" * 2, False),
    ("The draft proposes gamma tokens, the target scores them in one forward pass, and each is "
     "accepted with probability min(1, p/q).", False),
    # indentation that changes from line to line is not a repetition (a sample of the quick pair)
    ("\n" + " " * 13 + '"""\n' + " " * 11 + '"""\n' + " " * 7 + "lines, turtles(),n", False),
])
def test_loops_are_found_and_text_is_not(text, is_loop):
    """Planted loops (a run of spaces, a repeated line, text that ends in a loop) against text
    with a short repetition in it. The last case fails when units are compared by token alone."""
    from gpt2 import encode
    from spec_decoding.presentation.loops import looped

    assert looped(encode(text)) == is_loop


def test_loop_share_counts_the_repeated_stretch_with_its_first_copy():
    from spec_decoding.presentation.loops import loop_share, runs

    assert runs([5, 5, 5, 7, 5]) == [(5, 3), (7, 1), (5, 1)]
    assert loop_share([]) == 0.0 and loop_share([1, 2, 3, 4]) == 0.0
    assert loop_share([1, 2, 3, 4, 5, 6] + [7, 8] * 3) == pytest.approx(6 / 12)  # 7 8 7 8 7 8
    assert loop_share([9] * 31 + [1]) == 0.0 and loop_share([9] * 32) == 1.0  # MAX_RUN in a row
    assert loop_share(list(range(40)) * 2) == 0.0  # a period longer than MAX_PERIOD is not looked for


def summary_cells(results: dict, looped_gamma: int, temperature: float) -> dict:
    """results with every cell of (looped_gamma, temperature) marked looped in all its runs."""
    results = json.loads(json.dumps(results))
    for cell in results["cells"]:
        cell["looped_runs"] = cell["runs"] if (cell["gamma"], cell["temperature"]) == (looped_gamma, temperature) else 0
    return results


def test_the_tables_mark_looped_cells_and_give_best_gamma_per_temperature(benchmark_run):
    """Only the looped cells' rows carry the mark; best gamma is one line per temperature. Shown to
    fail without the Loops column (the mark is nowhere) and with one best gamma for all temperatures."""
    import benchmark
    from spec_decoding.presentation.loops import LOOP_MARK

    out, _, _ = benchmark_run
    results = summary_cells(json.loads((out / "results.json").read_text()), looped_gamma=2, temperature=0.0)
    md = benchmark.summary_markdown(results)
    greedy, sampled = md.split("Measured costs")[0].split("Temperature 1 (sampling)")
    # the gamma table's rows (wide; the max_gen table's rows start the same way)
    wide = {line.split("|")[1].strip(): line for line in greedy.splitlines()
            if line.startswith("| ") and line.count("|") > 8 and "Gamma" not in line}
    assert set(wide) == {"1", "2"}
    assert f"{LOOP_MARK} (10/10 runs)" in wide["2"] and LOOP_MARK not in wide["1"]
    assert "(looped)" in greedy and LOOP_MARK not in sampled and "(looped)" not in sampled
    best = [line for line in md.splitlines() if line.startswith("Best gamma")]
    assert [line.split(":")[0] for line in best] == ["Best gamma at temperature 0", "Best gamma at temperature 1"]
    measured_greedy = int(best[0].split("measured ")[1].split(",")[0])
    assert (LOOP_MARK in best[0]) == (measured_greedy == 2) and LOOP_MARK not in best[1]


def test_the_grid_run_records_each_runs_loop_share(benchmark_run):
    from spec_decoding.presentation.loops import LOOP_SHARE

    out, _, _ = benchmark_run
    for cell in json.loads((out / "results.json").read_text())["cells"]:
        runs = cell["run_records"]
        assert all(0 <= r["loop_share"] <= 1 and r["looped"] == (r["loop_share"] >= LOOP_SHARE) for r in runs)
        assert cell["looped_runs"] == sum(r["looped"] for r in runs)


def test_the_heatmap_panels_share_one_colour_scale_and_mark_loops(benchmark_run):
    """Shown to fail when each panel computes its own scale (the old heatmap)."""
    import matplotlib.pyplot as plt

    from benchmarks.plots import draw_figures

    out, _, _ = benchmark_run
    results = summary_cells(json.loads((out / "results.json").read_text()), looped_gamma=2, temperature=0.0)
    results["cells"][0].update(speedup_median=3.0, speedup_q3=3.0, speedup_max=3.0)  # one panel far above
    figures = draw_figures(results)
    fig = figures["benchmark_heatmap.png"]
    norms = {(im.norm.vmin, im.norm.vcenter, im.norm.vmax) for ax in fig.axes for im in ax.images}
    assert len([im for ax in fig.axes for im in ax.images]) == 2 and len(norms) == 1
    assert next(iter(norms))[2] >= 3.0
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum("looped" in t for t in texts) == len(MAX_GENS)  # gamma 2, greedy: one per max_gen
    acceptance = figures["benchmark_acceptance.png"]
    labels = [line.get_label() for ax in acceptance.axes for line in ax.get_lines()]
    assert sum("output looped" in label for label in labels) == 1
    for f in figures.values():
        plt.close(f)


def test_one_max_gen_draws_bars(benchmark_run):
    """A grid of one max_gen column is drawn as bars per gamma (a heatmap would be one column of
    blocks), on the shared scale, a looped bar hatched and labelled."""
    import matplotlib.pyplot as plt

    from benchmarks.plots import draw_figures

    out, _, _ = benchmark_run
    results = summary_cells(json.loads((out / "results.json").read_text()), looped_gamma=1, temperature=1.0)
    results["cells"] = [c for c in results["cells"] if c["max_gen"] == MAX_GENS[0]]
    fig = draw_figures(results)["benchmark_heatmap.png"]
    panels = [ax for ax in fig.axes if ax.patches]
    assert len(panels) == 2 and not any(ax.images for ax in fig.axes)
    assert all(len(ax.patches) == len(GAMMAS) for ax in panels)
    hatched = [p for ax in panels for p in ax.patches if p.get_hatch()]
    assert len(hatched) == 1
    for f in draw_figures(results).values():
        plt.close(f)
    plt.close(fig)


def test_a_busy_machine_while_timing_is_said_in_the_summary():
    """The load average before and after the grid, above the core count, gives the summary a line
    saying the speed-ups are rough and where their spread is; at or below it, nothing."""
    import benchmark
    assert benchmark.load_note({"load_average": [0.4, 1.9], "cores": 2}) is None
    assert benchmark.load_note({}) is None
    note = benchmark.load_note({"load_average": [0.4, 4.5], "cores": 2})
    assert "load average up to 4.5 on 2 cores" in note and "speedup_q1" in note
