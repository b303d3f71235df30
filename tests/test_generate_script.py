"""spec_decoding_generate.py, the command-line script: run as a subprocess on the random-weight
text_pair checkpoints (GPT-2's real vocabulary), plus in-process checks of its pieces.

Starting Python + torch costs seconds, so the subprocess runs are started together (they overlap)
by the `runs` fixture, and the cheaper checks call main() in-process."""

import contextlib
import inspect
import io
import json
import os
import pty
import random
import re
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import spec_decoding_generate as script
from gpt2 import EOT_ID, decode, encode
from spec_decoding import autoregressive_generate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "spec_decoding_generate.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PROMPT = "The capital of France is"
MAX_GEN = 24
STATS_KEYS = {"target_calls", "draft_calls", "rounds", "tokens_drafted", "tokens_accepted",
              "token_sources", "stop_reason", "seconds", "tokens_generated", "acceptance_rate",
              "tokens_per_target_call", "tokens_per_second"}


def script_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


class Run:
    """A started run of the script; .result() waits and returns (returncode, stdout, stderr)."""

    def __init__(self, args, env=None, terminal=False):
        cmd = [sys.executable, str(SCRIPT), *map(str, args)]
        env = env or script_env()
        self.chunks = []
        if terminal:  # stdout is a pseudo-terminal, so isatty() is True in the script
            master, slave = pty.openpty()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave,
                                         stderr=subprocess.PIPE, env=env)
            os.close(slave)
            self.reader = threading.Thread(target=self._read_pty, args=(master,), daemon=True)
            self.reader.start()
        else:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env)
            self.reader = None
        self._result = None

    def _read_pty(self, master):
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO once the child has closed the terminal
                break
            if not data:
                break
            self.chunks.append(data)
        os.close(master)

    def result(self):
        if self._result is None:
            out, err = self.proc.communicate(timeout=120)
            if self.reader:
                self.reader.join(timeout=10)
                out = b"".join(self.chunks)
            self._result = (self.proc.returncode, out.decode("utf-8", "replace"),
                            err.decode("utf-8", "replace"))
        return self._result


def main_in_this_process(argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of script.main(argv) run here, in the environment script_env
    gives a real run (no NO_COLOR)."""
    out, err = io.StringIO(), io.StringIO()
    no_color = os.environ.pop("NO_COLOR", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = script.main([str(a) for a in argv])
            except SystemExit as e:
                code = e.code
    finally:
        if no_color is not None:
            os.environ["NO_COLOR"] = no_color
    return code, out.getvalue(), err.getvalue()


def start_and_finish_runs(text_pair_dirs, folder) -> dict:
    """{name: (returncode, stdout, stderr)} of the runs the tests read. What the output says is
    main()'s, run in this process; what a shell sees (a terminal's colours, an error's exit status
    and no traceback, a machine without the hub) comes from real processes, started together."""
    target, draft = text_pair_dirs
    pair = ["--target", target, "--draft", draft, "--prompt", PROMPT, "--max-gen", MAX_GEN]
    empty_hf_home = folder / "empty-hf-home"
    empty_hf_home.mkdir()
    offline_env = script_env(HF_HOME=str(empty_hf_home), HF_HUB_CACHE=str(empty_hf_home / "hub"))
    started = {
        "terminal": Run([*pair, "--max-gen", 8, "--plain"], terminal=True),
        "missing_folder": Run(["--target", "/nonexistent/folder", "--draft", draft]),
        "offline": Run(["--target", "gpt2-large", "--draft", draft], env=offline_env),
        "gamma0": Run([*pair, "--gamma", 0]),  # argparse's error, through the real exit path
    }
    try:
        results = {"json": main_in_this_process([*pair, "--gamma", 3, "--compare-baseline", "--json"]),
                   "plain": main_in_this_process([*pair, "--gamma", 3, "--compare-baseline"])}
        return results | {name: run.result() for name, run in started.items()}
    finally:
        for run in started.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()


@pytest.fixture(scope="module")
def runs(text_pair_dirs, shared):
    """The runs' results, once for the whole test run (`shared`): the tests reading them may be
    spread over the xdist workers."""
    return shared("generate-script-runs", lambda folder: start_and_finish_runs(text_pair_dirs, folder))


@pytest.fixture(scope="module")
def json_report(runs):
    code, out, err = runs["json"]
    assert code == 0, err
    return json.loads(out)  # stdout is exactly one JSON object


def test_json_greedy_run(json_report, text_pair):
    tokens = json_report["tokens"]
    stats = json_report["stats"]
    assert len(tokens) == MAX_GEN or (tokens[-1] == EOT_ID and stats["stop_reason"] == "eos")
    assert json_report["text"] == decode(tokens)
    assert STATS_KEYS <= stats.keys()
    assert stats["tokens_generated"] == len(tokens) == len(stats["token_sources"])
    assert json_report["prompt_tokens"] == encode(PROMPT)
    # Greedy speculative decoding is lossless: the target alone, in this process, gives the same.
    target, _ = text_pair
    expected = autoregressive_generate(target, encode(PROMPT), MAX_GEN, eos_id=EOT_ID)
    assert tokens == expected.tokens


def test_json_compare_baseline(json_report):
    assert json_report["baseline"]["tokens"] == json_report["tokens"]
    assert json_report["identical_to_baseline"] is True
    assert json_report["speedup"] > 0
    assert STATS_KEYS <= json_report["baseline"]["stats"].keys()


def test_piped_output_is_plain_text_with_stats(runs, json_report):
    code, out, err = runs["plain"]
    assert code == 0, err
    assert "\x1b[" not in out
    # The streamed text, round by round, is exactly the decode of all the tokens.
    assert out.startswith(PROMPT + json_report["text"] + "\n")
    for line in ("acceptance rate:", "tokens per target call:", "tokens/s", "target / draft calls:",
                 "stopped:", "baseline (target alone):", "speedup:", "identical tokens",
                 "alpha (theory):"):
        assert line in out
    assert "Loading target" in err and "Loading draft" in err
    # the speed step the script takes by default, in each load's own line (not a note printed by
    # the loader), with the flag that leaves it out
    loads = [line for line in err.splitlines() if "M parameters" in line]
    assert len(loads) == 2 and all("; accelerated by gpt2.speed (" in line and "--plain" in line
                                   for line in loads), err
    assert "kernels: gpt2/speed/kernels.py" not in err


def test_the_summary_says_when_the_output_looped(json_report, capsys):
    """A looped output gets the mark under its stats (its acceptance measures the loop); the
    JSON carries the measure. Shown to fail with the mark left out of print_stats."""
    from spec_decoding.presentation.loops import LOOP_MARK, loop_share
    from spec_decoding.result import GenerationStats

    stats = GenerationStats(target_calls=10, draft_calls=30, rounds=10, token_sources=["target"] * 40,
                            gamma_by_round=[3] * 10, seconds=1.0)
    script.print_stats(stats, 3, tokens=encode("\n" + " " * 39))  # the old README example's output
    assert LOOP_MARK in capsys.readouterr().out
    script.print_stats(stats, 3, tokens=encode(PROMPT + " return parser.parse_args(argv)"))
    assert LOOP_MARK not in capsys.readouterr().out
    assert json_report["loop_share"] == loop_share(json_report["tokens"])


def test_terminal_output_is_coloured_with_legend(runs):
    code, out, err = runs["terminal"]
    assert code == 0, err
    loads = [line for line in err.splitlines() if "M parameters" in line]  # --plain: the model as written
    assert len(loads) == 2 and all("; plain: gpt2/model.py as written" in line for line in loads), err
    assert ANSI.search(out)
    assert "draft token accepted" in out and "bonus token" in out
    assert "target's own token (nothing drafted)" in out and "target alone" not in out
    assert "acceptance rate:" in out


@pytest.mark.parametrize("name, words", [
    ("missing_folder", ["/nonexistent/folder"]),
    ("offline", ["gpt2-large", "--target"]),
    ("gamma0", ["--gamma"]),
])
def test_errors_exit_2_without_traceback(runs, name, words):
    code, out, err = runs[name]
    assert code == 2
    assert "error:" in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert out == ""


# ---------------------------------------------------------------------------------------------
# In-process: main(argv) on the same checkpoints.


def run_main(argv, capsys):
    code = script.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_seeded_sampling_is_reproducible(text_pair_dirs, capsys):
    target, draft = text_pair_dirs
    argv = ["--target", target, "--draft", draft, "--prompt", PROMPT, "--max-gen", 12,
            "--temperature", 0.8, "--top-k", 50, "--seed", 1, "--json"]
    reports = []
    for _ in range(2):
        code, out, err = run_main(argv, capsys)
        assert code == 0, err
        reports.append(json.loads(out))
    assert reports[0]["tokens"] == reports[1]["tokens"]
    assert reports[0]["settings"]["seed"] == 1


def test_seeded_gamma_auto_sampling_is_reproducible_however_fast_the_models_run(text_pair_dirs, tmp_path,
                                                                               capsys, monkeypatch):
    """The same seeded --gamma auto sampling command twice, with the same --cost-model (it says
    the draft costs a tenth of the target), once with the target 20 ms slower a call, once with the
    draft 20 ms slower a token (a machine busy in other ways): the same gammas and tokens, as gamma
    auto decides from the costs, not from this run's timings. (Refitting the costs from the
    rounds' wall time, the second run stopped drafting: other gammas, other random draws, other
    tokens, and this test failed.)"""
    import time
    import spec_decoding.algorithms.speculative
    from spec_decoding import CostModel
    from spec_decoding.policies.costs import describe_model
    from spec_decoding.drafters import ModelDrafter
    from gpt2 import load_gpt2
    target, draft = text_pair_dirs
    costs = tmp_path / "costs.json"
    CostModel(target=describe_model(load_gpt2(target, dtype="float32")),
              draft=describe_model(load_gpt2(draft, dtype="float32")), draft_step_s=1e-4,
              target_score_s=[1e-3 * (1 + 0.1 * k) for k in range(9)]).save(costs)
    argv = ["--target", target, "--draft", draft, "--dtype", "float32", "--prompt", PROMPT, "--max-gen", 40,
            "--gamma", "auto", "--temperature", 1, "--top-k", 3, "--seed", 3, "--cost-model", costs, "--json",
            "--device", "cpu"]  # where the cost model was made (a GPU machine's auto is cuda)
    reports = []
    for target_delay, draft_delay in ((0.02, 0.0), (0.0, 0.02)):
        propose, target_forward = ModelDrafter.propose, spec_decoding.algorithms.speculative.target_forward
        monkeypatch.setattr(ModelDrafter, "propose", lambda self, tokens, n, *a, **k:
                            time.sleep(draft_delay * n) or propose(self, tokens, n, *a, **k))
        monkeypatch.setattr(spec_decoding.algorithms.speculative, "target_forward",
                            lambda *a, **k: time.sleep(target_delay) or target_forward(*a, **k))
        code, out, err = run_main(argv, capsys)
        assert code == 0, err
        reports.append(json.loads(out))
        monkeypatch.undo()
    assert reports[0]["tokens"] == reports[1]["tokens"]
    assert reports[0]["stats"]["gamma_by_round"] == reports[1]["stats"]["gamma_by_round"]
    assert sum(reports[0]["stats"]["gamma_by_round"]) > 0  # it drafted: the timings could have mattered


def ticking_at_random(seed):
    """A fake clock whose every interval is random (0-1 s), from random.Random(seed): as on a
    machine whose load comes and goes, each timing differs from run to run."""
    ticks, now = random.Random(seed), [0.0]

    def clock():
        now[0] += ticks.random()
        return now[0]
    return clock


# A new process running spec_decoding_generate.main(argv) with that clock in the CostModel's
# timing: python -c FAKE_CLOCK_CHILD clock_seed argv...
FAKE_CLOCK_CHILD = f"""
import random, sys, types
import spec_decoding.calibration, spec_decoding_generate
{inspect.getsource(ticking_at_random)}
spec_decoding.calibration.time = types.SimpleNamespace(perf_counter=ticking_at_random(int(sys.argv[1])))
sys.exit(spec_decoding_generate.main(sys.argv[2:]))
"""


def test_a_seeded_gamma_auto_command_repeats_its_tokens_in_a_new_process(text_pair_dirs, tmp_path, capsys,
                                                                        monkeypatch):
    """The same seeded --gamma auto sampling command in two new processes whose clocks tick
    differently: the first measures the pair's costs and keeps them in the kernel cache, the second
    reads them, so both choose the same gammas and sample the same tokens. The second clock's own
    costs (measured into a new cache) give other gammas: measuring in every run (as before the
    costs were kept), the two runs differed and this test failed."""
    target, draft = text_pair_dirs
    argv = ["--target", target, "--draft", draft, "--prompt", PROMPT, "--max-gen", 40, "--gamma", "auto",
            "--gamma-max", 4, "--temperature", 1, "--top-k", 3, "--seed", 3, "--json"]
    kept = tmp_path / "kept" / "kernels.json"

    def run_in_a_new_process(clock_seed):
        done = subprocess.run([sys.executable, "-c", FAKE_CLOCK_CHILD, str(clock_seed), *map(str, argv)],
                              cwd=ROOT, env=script_env(GPT2_KERNEL_CACHE=str(kept)), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), done.stderr

    (first, first_err), (second, second_err) = run_in_a_new_process(1), run_in_a_new_process(4)
    assert second["stats"]["gamma_by_round"] == first["stats"]["gamma_by_round"]
    assert second["tokens"] == first["tokens"]
    assert "measuring this pair's per-call costs" in first_err and "measuring" not in second_err
    assert sum(first["stats"]["gamma_by_round"]) > 0  # it drafted: the costs could have mattered

    import spec_decoding.calibration  # clock 4 measuring its own costs (here, in this process: cheaper)
    monkeypatch.setattr(spec_decoding.calibration, "time", types.SimpleNamespace(perf_counter=ticking_at_random(4)))
    monkeypatch.setenv("GPT2_KERNEL_CACHE", str(tmp_path / "new" / "kernels.json"))
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert json.loads(out)["stats"]["gamma_by_round"] != first["stats"]["gamma_by_round"]


def test_top_p_runs(text_pair_dirs, capsys):
    target, draft = text_pair_dirs
    code, out, err = run_main(["--target", target, "--draft", draft, "--prompt", PROMPT,
                               "--max-gen", 6, "--temperature", 1.0, "--top-p", 0.9], capsys)
    assert code == 0, err
    assert out.startswith(PROMPT) and "acceptance rate:" in out


@pytest.mark.parametrize("argv, words", [
    (["--gamma", "0"], ["--gamma", ">= 1"]),
    (["--temperature", "-1"], ["--temperature", ">= 0"]),
    (["--top-p", "1.5"], ["--top-p", "(0, 1]"]),
    (["--top-p", "0"], ["--top-p"]),
    (["--top-k", "0"], ["--top-k"]),
    (["--max-gen", "-3"], ["--max-gen"]),
    (["--prompt", ""], ["--prompt is empty"]),
    (["--dtype", "float64"], ["--dtype"]),
    (["--gamma", "fast"], ["--gamma", "auto or heuristic"]),
    (["--gamma", "3", "--cost-model", "x.json"], ["--cost-model is for --gamma auto"]),
    (["--gamma-max", "0"], ["--gamma-max", ">= 1"]),
    (["--drafter", "bogus"], ["--drafter", "'bogus' is not a drafter", "medusa:DIR"]),
    (["--drafter", "eagle"], ["--drafter", "'eagle' needs a folder: eagle:DIR"]),
    (["--drafter", "ngram", "--ngram", "0"], ["--ngram", ">= 1"]),
    (["--drafter", "layerskip", "--draft-layers", "0"], ["--draft-layers", ">= 1"]),
])
def test_bad_arguments_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err
    for word in words:
        assert word in err


@pytest.mark.parametrize("device", ["cuda", "cuda:7", "mps", "tpu", "bogus"])
def test_unavailable_device_is_a_clear_error(device, text_pair_dirs, capsys):
    import torch
    if device.startswith("cuda") and torch.cuda.is_available() or device == "mps" and torch.backends.mps.is_available():
        pytest.skip(f"{device} exists here")
    target, draft = text_pair_dirs
    code, out, err = run_main(["--target", target, "--draft", draft, "--device", device], capsys)
    assert code == 2
    assert err.startswith("error:") and device in err


def test_missing_tokenizer_files_are_a_clear_error(monkeypatch, capsys):
    def no_tokenizer(text):
        raise RuntimeError("GPT-2's tokenizer file .../vocab.bpe is missing: reinstall the package ...")
    monkeypatch.setattr(script, "encode", no_tokenizer)
    code, out, err = run_main(["--device", "cpu"], capsys)
    assert code == 2
    assert err.startswith("error: GPT-2's tokenizer file") and "Traceback" not in err


def test_mismatched_vocabularies_are_a_clear_error(text_pair_dirs, make_checkpoint, capsys):
    from conftest import TINY
    target, _ = text_pair_dirs
    code, out, err = run_main(["--target", target, "--draft", make_checkpoint(TINY), "--max-gen", 2], capsys)
    assert code == 2
    # the pair is checked before anything runs (once, the warm-up failed first on a token id)
    assert "error:" in err and "share one tokenizer" in err and "outside the vocabulary" not in err


# ---------------------------------------------------------------------------------------------
# The streaming printer


@pytest.mark.parametrize("text", ["naïve café 😀 — 日本語", "🙂🙂🙂 ∑∫ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"])
def test_printer_never_splits_characters(text):
    """Tokens that hold part of a character are held back until it is complete."""
    tokens = encode(text)
    assert any("\ufffd" in decode([t]) for t in tokens)  # some token alone is part of a character
    out = io.StringIO()
    printer = script.TokenPrinter(out, colour=False)
    for t in tokens:
        printer([t], ["draft"])
        assert "\ufffd" not in out.getvalue()
    printer.finish()
    assert out.getvalue() == text + "\n"


def test_printer_matches_decode_on_random_tokens():
    """Even invalid UTF-8 (random tokens) prints exactly as decode() renders it."""
    rng = random.Random(0)
    for _ in range(50):
        tokens = [rng.randrange(50257) for _ in range(rng.randrange(1, 30))]
        out = io.StringIO()
        printer = script.TokenPrinter(out, colour=False)
        for i in range(0, len(tokens), 3):  # rounds of up to 3 tokens
            printer(tokens[i:i + 3], ["draft"] * 3)
        printer.finish()
        assert out.getvalue() == decode(tokens) + "\n"


def test_colours_follow_token_sources():
    out = io.StringIO()
    printer = script.TokenPrinter(out, colour=True)
    printer(encode(" one two three"), ["draft", "correction", "bonus"])
    printer.finish()
    text = out.getvalue()
    assert script.COLOURS["draft"] + " one" in text
    assert script.COLOURS["correction"] + " two" in text
    assert script.COLOURS["bonus"] + " three" in text
    assert ANSI.sub("", text) == " one two three\n"


def test_gamma_auto_measures_saves_and_reuses_the_cost_model(text_pair_dirs, text_pair, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("GPT2_KERNEL_CACHE", str(tmp_path / "kernels.json"))  # nothing kept yet
    target_dir, draft_dir = text_pair_dirs
    costs = tmp_path / "costs.json"
    argv = ["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT, "--max-gen", MAX_GEN,
            "--gamma", "auto", "--gamma-max", 5, "--cost-model", costs]
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert "measuring this pair's per-call costs" in err and "c = " in err and costs.is_file()
    assert re.search(r"gamma of each round: +[0-5]( [0-5])* \(--gamma auto\)", out)
    written = costs.read_text()
    code, out, err = run_main(argv + ["--json"], capsys)  # now read, not measured again
    assert code == 0, err
    assert "measuring" not in err and costs.read_text() == written
    report = json.loads(out)
    assert report["settings"]["gamma"] == "auto" and report["settings"]["gamma_max"] == 5
    rounds = report["stats"]["gamma_by_round"]
    assert len(rounds) == report["stats"]["target_calls"] and max(rounds) <= 5
    expected = autoregressive_generate(text_pair[0], encode(PROMPT), MAX_GEN, eos_id=EOT_ID)
    assert report["tokens"] == expected.tokens


def test_gamma_heuristic_runs(text_pair_dirs, capsys):
    target_dir, draft_dir = text_pair_dirs
    code, out, err = run_main(["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT,
                               "--max-gen", 12, "--gamma", "heuristic", "--gamma-max", 3], capsys)
    assert code == 0, err
    assert "gamma of each round:" in out and "(--gamma heuristic" in out


def test_a_cost_model_for_other_models_is_a_clear_error(text_pair_dirs, tmp_path, capsys):
    target_dir, draft_dir = text_pair_dirs
    costs = tmp_path / "costs.json"
    # measured with the draft as the target: the wrong models for the real pair
    assert run_main(["--target", draft_dir, "--draft", draft_dir, "--prompt", PROMPT, "--max-gen", 4,
                     "--gamma", "auto", "--gamma-max", 2, "--cost-model", costs], capsys)[0] == 0
    code, out, err = run_main(["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT,
                               "--max-gen", 4, "--gamma", "auto", "--cost-model", costs], capsys)
    assert code == 2 and "error: This CostModel was measured with the target" in err
    assert "Traceback" not in err


def test_stats_show_acceptance_rate_and_alpha_as_in_the_json(runs, json_report):
    code, out, err = runs["plain"]
    stats = json_report["stats"]
    lines = {line.split(":")[0]: line for line in out.splitlines() if ":" in line}
    judged = stats["tokens_accepted"] + stats["rejections"]
    assert lines["acceptance rate"].split(":", 1)[1].split()[:3] == [
        f"{stats['acceptance_rate']:.1%}", "of", str(stats["tokens_drafted"])]
    assert lines["alpha (theory)"].split(":", 1)[1].split()[:3] == [f"{stats['alpha']:.1%}", "of", str(judged)]


def test_top_k_and_top_p_at_temperature_0_are_said_to_be_ignored(capsys):
    script.parse_args(["--top-k", "5", "--top-p", "0.9"])
    assert "--top-k and --top-p only apply when sampling" in capsys.readouterr().err
    script.parse_args(["--top-k", "5", "--temperature", "0.7"])
    assert capsys.readouterr().err == ""


def test_the_speed_up_is_timed_in_turns_fastest_run_against_fastest_run(monkeypatch):
    """--compare-baseline's figure: pairs (speculative, target alone) timed back to back; the
    fastest run of each side against the other's, the pairs' ratios as its spread; a spread past
    SPREAD_MARGIN or a load above the cores is said."""
    calls = []
    speeds = iter([30.0, 10.0, 12.0, 6.0, 40.0, 10.0])  # pairs: 3x, 2x, 4x
    args = script.parse_args(["--compare-baseline"])
    monkeypatch.setattr(script, "load_average", lambda: 0.0)
    comparison = script.compare_speeds(args, lambda: calls.append("spec") or next(speeds),
                                       lambda: calls.append("alone") or next(speeds))
    assert calls == ["spec", "alone"] * script.BASELINE_PAIRS
    assert comparison.ratios == [3.0, 2.0, 4.0] and comparison.speedup == 40.0 / 10.0
    assert "4.00x (the pairs: 2.00x-4.00x)" in "\n".join(comparison.lines())
    assert "ranged 2.00x-4.00x" in comparison.unreliable()
    steady = script.SpeedComparison([20.0, 21.0], [10.0, 10.0], (0.5, 0.7))
    assert steady.unreliable() is None
    busy = script.SpeedComparison([20.0, 21.0], [10.0, 10.0], (0.5, 99.0))
    assert "load average up to 99.0" in busy.unreliable()
    assert script.compare_speeds(script.parse_args([]), None, None) is None


@pytest.mark.parametrize("speed_option", [["--quantize", "int8"], ["--draft-quantize", "fp16"], ["--compile", "on"]])
def test_plain_with_a_speed_option_is_a_usage_error(speed_option, capsys):
    """--plain runs the model as written: a speed option beside it is refused, saying which."""
    with pytest.raises(SystemExit) as exit_:
        script.parse_args(["--plain", *speed_option])
    assert exit_.value.code == 2 and "--plain runs gpt2/model.py as written" in capsys.readouterr().err
    assert script.parse_args(["--plain"]).plain and not script.parse_args(speed_option).plain


def test_dtype_auto_and_the_note_for_a_slower_format(text_pair_dirs, capsys, monkeypatch):
    import torch
    import gpt2.speed.device
    from gpt2.speed.device import dtype_note
    monkeypatch.setattr(gpt2.speed.device, "_NOTES_SHOWN", set())  # said once per process: this one fresh
    target, draft = text_pair_dirs
    argv = ["--target", target, "--draft", draft, "--prompt", PROMPT, "--max-gen", 3, "--json", "--device", "cpu"]
    code, out, err = run_main(argv, capsys)  # --dtype auto, the default: float32 on a CPU
    assert code == 0, err
    assert json.loads(out)["settings"]["dtype"] == "float32" and "note:" not in err
    code, out, err = run_main([*argv, "--dtype", "bfloat16"], capsys)
    assert code == 0, err
    assert json.loads(out)["settings"]["dtype"] == "bfloat16"
    notes = [line for line in err.splitlines() if line.startswith("note: bfloat16")]
    expected = dtype_note(torch.bfloat16, torch.device("cpu"))  # None if measured faster
    assert notes == ([expected] if expected else [])


# ---------------------------------------------------------------------------------------------
# --drafter: prompt lookup and the target's own first blocks


@pytest.mark.parametrize("drafter_args, described", [
    (["--drafter", "ngram", "--ngram", 2], "ngram:2 (prompt lookup, n-grams of up to 2 tokens)"),
    (["--drafter", "layerskip", "--draft-layers", 2], "layerskip:2 (the target's first 2 blocks)"),
])
def test_other_drafters_give_the_targets_greedy_output(text_pair_dirs, text_pair, capsys,
                                                       drafter_args, described):
    target_dir, _ = text_pair_dirs
    # --draft is not loaded for these drafters: a missing folder does not matter
    argv = ["--target", target_dir, "--draft", "/nonexistent/folder", "--prompt", PROMPT,
            "--max-gen", MAX_GEN, "--gamma", 3, *drafter_args]
    code, out, err = run_main([*argv, "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    expected = autoregressive_generate(text_pair[0], encode(PROMPT), MAX_GEN, eos_id=EOT_ID)
    assert report["tokens"] == expected.tokens
    assert report["drafter"] == described and report["draft"] is None
    stats = report["stats"]
    assert stats["tokens_drafted"] > 0
    assert stats["draft_calls"] == (0 if "ngram" in drafter_args else stats["tokens_drafted"])
    assert "Loading draft" not in err
    code, out, err = run_main(argv, capsys)
    assert code == 0, err
    assert f"drafter:                {described}" in out


def test_the_stats_name_the_model_drafter(runs):
    code, out, err = runs["plain"]
    assert re.search(r"drafter: +model .*draft", out)


def test_draft_layers_beyond_the_target_is_a_clear_error(text_pair_dirs, capsys):
    target_dir, _ = text_pair_dirs
    code, out, err = run_main(["--target", target_dir, "--drafter", "layerskip", "--draft-layers", 4,
                               "--max-gen", 2], capsys)
    assert code == 2
    assert "error: --drafter layerskip:4: n_layers must be an int between 1 and n_layer - 1 = 3" in err
    assert "Traceback" not in err


def test_weight_formats_on_the_command_line(text_pair_dirs, capsys):
    """--quantize / --draft-quantize load each model in its own format; greedy output is still the
    (same-format) target's own, and an impossible combination is a one-line error."""
    target, draft = text_pair_dirs
    argv = ["--target", target, "--draft", draft, "--prompt", PROMPT, "--max-gen", 8,
            "--temperature", 0, "--compare-baseline", "--json", "--device", "cpu"]  # CPU weight formats
    code, out, err = run_main([*argv, "--quantize", "fp16", "--draft-quantize", "int8"], capsys)
    assert code == 0, err
    assert json.loads(out)["identical_to_baseline"] is True
    assert "Loading target" in err and "cpu, fp16)" in err and "cpu, int8)" in err
    code, out, err = run_main([*argv, "--quantize", "fp16", "--dtype", "bfloat16"], capsys)
    assert code != 0 and "quantize='fp16'" in err and "needs dtype 'float32'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["spec_decoding_generate.py", "benchmark.py"])
def test_ctrl_c_while_the_libraries_import_exits_quietly(name):
    """Ctrl-C in a script's first moments, while torch is still importing, ends it with code 130 and
    no traceback (a real process: the signal arrives where a user's would)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(ROOT / name), "--help"], cwd=ROOT, env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)  # past the interpreter's start-up, inside `import torch`
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the script finished before the signal arrived (a very fast import)")
    assert proc.returncode == 130 and "Traceback" not in err, err
