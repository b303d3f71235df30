"""benchmarks.llama_cpp_anchor without llama.cpp: the skip line, the timing parsers on output
captured from llama.cpp (llama-cpp-python 0.3.36's vendored copy), the bandwidth-floor arithmetic,
and the folder the GGUF converter reads. With LLAMA_CPP_DIR set (and its gguf package importable),
a tiny checkpoint is also converted and read back."""

import json
import os
import stat
from types import SimpleNamespace

import pytest
from safetensors.torch import load_file

from benchmarks import llama_cpp_anchor as anchor
from gpt2.tokenizer import TOKENIZER_FILES
from tests.conftest import TINY_TEXT

# ---------------------------------------------------------------------------------------------
# Captured from the llama.cpp of llama-cpp-python 0.3.36 (the lines around the timings, verbatim)

COMPLETION_STDERR = """\
0.04.199.771 I common_perf_print:    sampling time =       8.75 ms
0.04.199.784 I common_perf_print:    samplers time =       2.51 ms /    78 tokens
0.04.199.791 I common_perf_print:        load time =    1076.71 ms
0.04.199.798 I common_perf_print: prompt eval time =     718.78 ms /    14 tokens (   51.34 ms per token,    19.48 tokens per second)
0.04.199.803 I common_perf_print:        eval time =    2006.49 ms /    63 runs   (   31.85 ms per token,    31.40 tokens per second)
0.04.199.808 I common_perf_print:       total time =    2775.10 ms /    77 tokens
0.04.199.813 I common_perf_print: unaccounted time =      41.08 ms /   1.5 %      (total - sampling - prompt eval - eval) / (total)
"""

SPECULATIVE_STDERR = """\
0.13.142.095 I encoded   14 tokens in    0.670 seconds, speed:   20.910 t/s
0.13.142.096 I decoded   69 tokens in   10.331 seconds, speed:    6.679 t/s
0.13.142.096 I
0.13.142.096 I n_draft   = 4
0.13.142.097 I n_predict = 69
0.13.142.097 I n_drafted = 55
0.13.142.098 I n_accept  = 55
0.13.142.099 I accept    = 100.000%
0.13.142.099 I
0.13.142.099 I draft:

0.13.142.135 I
0.13.142.135 I target:

0.13.142.136 I common_perf_print:    sampling time =      82.91 ms
0.13.142.137 I common_perf_print:    samplers time =      39.92 ms /    69 tokens
0.13.142.137 I common_perf_print:        load time =     513.98 ms
0.13.142.138 I common_perf_print: prompt eval time =    4972.28 ms /    84 tokens (   59.19 ms per token,    16.89 tokens per second)
0.13.142.139 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""

# llama-bench -o json, fields cut to those read (and a few beside them)
BENCH_JSON = """\
[
  {
    "build_commit": "1652066",
    "model_type": "gpt2 ?B F16",
    "n_threads": 2,
    "n_prompt": 5,
    "n_gen": 0,
    "n_depth": 64,
    "avg_ns": 816602462,
    "avg_ts": 6.12293,
    "samples_ns": [
      816602462
    ]
  },
  {
    "build_commit": "1652066",
    "model_type": "gpt2 ?B F16",
    "n_threads": 2,
    "n_prompt": 0,
    "n_gen": 16,
    "n_depth": 64,
    "avg_ns": 11291941015,
    "avg_ts": 1.41694,
    "samples_ns": [
      11291941015
    ]
  }
]
"""


def test_completion_timings_are_read_from_its_perf_lines():
    t = anchor.parse_completion_timings(COMPLETION_STDERR)
    # the generation's line, not the prompt's (which also contains "eval time = ... ms")
    assert t == {"prompt_ms": 718.78, "prompt_tokens": 14, "eval_ms": 2006.49, "eval_runs": 63,
                 "ms_per_token": 31.85}


def test_speculative_timings_and_counts_are_read():
    t = anchor.parse_speculative_timings(SPECULATIVE_STDERR)
    assert t == {"prompt_tokens": 14, "encode_s": 0.670, "generated": 69, "decode_s": 10.331,
                 "n_draft": 4, "n_predict": 69, "n_drafted": 55, "n_accept": 55}


def test_bench_json_gives_the_step_and_verify_at_the_depth_asked():
    assert anchor.parse_bench_json("build: 0c1e570\n" + BENCH_JSON, 64) == {
        "step_s": pytest.approx(11.291941015 / 16), "verify5_s": pytest.approx(0.816602462)}
    with pytest.raises(anchor.TimingsNotFound, match="no token-generation result at depth 128"):
        anchor.parse_bench_json(BENCH_JSON, 128)  # another depth: nothing taken from it


def test_missing_timing_lines_say_so_with_the_output_tail():
    with pytest.raises(anchor.TimingsNotFound, match="no 'prompt eval time' line(.|\n)*main: error: failed to load"):
        anchor.parse_completion_timings("main: error: failed to load model 'x.gguf'\n")
    with pytest.raises(anchor.TimingsNotFound, match="decoded"):
        anchor.parse_speculative_timings(SPECULATIVE_STDERR.replace("decoded", "wrote"))


# ---------------------------------------------------------------------------------------------
# Finding llama.cpp, and the skip line

def test_without_llama_cpp_the_benchmark_skips_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    assert anchor.main([]) == 0
    assert anchor.main(["--llama-cpp", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("skipped: no llama.cpp given") and "docs/performance.md" in lines[0]
    assert lines[1].startswith("skipped: llama-completion, llama-speculative-simple, llama-bench, "
                               "convert_hf_to_gguf.py not found")


def fake_llama_cpp(root, executable=True):
    (root / "build" / "bin").mkdir(parents=True)
    for name in ("llama-completion", "llama-speculative-simple", "llama-bench"):
        path = root / "build" / "bin" / name
        path.write_text("#!/bin/sh\n")
        if executable:
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (root / "convert_hf_to_gguf.py").write_text("")


def test_binaries_are_found_in_build_bin_and_the_converter_in_the_source(tmp_path):
    fake_llama_cpp(tmp_path)
    llama, why = anchor.find_llama_cpp(tmp_path)
    assert why == "" and llama.bench == tmp_path / "build" / "bin" / "llama-bench"
    assert llama.converter == tmp_path / "convert_hf_to_gguf.py"
    assert anchor.find_llama_cpp(tmp_path / "build" / "bin")[0].converter == llama.converter  # the bin folder given


def test_files_that_are_not_executable_are_not_binaries(tmp_path):
    fake_llama_cpp(tmp_path, executable=False)
    llama, why = anchor.find_llama_cpp(tmp_path)
    assert llama is None and "llama-bench not found" in why


# ---------------------------------------------------------------------------------------------
# The bandwidth floor

def test_a_step_reads_every_tensor_once_but_one_row_of_the_position_embedding():
    tensors = [("token_embd.weight", 1000, 100), ("position_embd.weight", 400, 40), ("blk.0.ffn_up.weight", 64, 8)]
    assert anchor.gguf_step_bytes(tensors) == 1000 + 10 + 64  # tied head: the token embedding read whole


def test_with_a_separate_head_the_token_embedding_is_one_row():
    tensors = [("token_embd.weight", 1000, 100), ("output.weight", 1000, 100), ("position_embd.weight", 400, 40)]
    assert anchor.gguf_step_bytes(tensors) == 10 + 1000 + 10


def test_the_floor_is_bytes_over_bandwidth():
    assert anchor.floor_seconds(3_000_000_000, 30.0) == pytest.approx(0.1)  # 3 GB at 30 GB/s
    assert anchor.floor_seconds(1_500_000_000, 30.0) == pytest.approx(0.05)


# ---------------------------------------------------------------------------------------------
# The converter's input folder, and a conversion where llama.cpp is at hand

def test_the_converter_input_holds_the_weights_without_mask_buffers_and_the_tokenizer(make_checkpoint, tmp_path):
    checkpoint = make_checkpoint(TINY_TEXT)
    folder = anchor.write_converter_input(checkpoint, tmp_path / "hf")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    assert json.loads((folder / "config.json").read_text()) == json.loads((checkpoint / "config.json").read_text())
    assert (folder / "vocab.json").read_bytes() == (TOKENIZER_FILES / "encoder.json").read_bytes()
    assert (folder / "merges.txt").read_bytes() == (TOKENIZER_FILES / "vocab.bpe").read_bytes()
    original, written = load_file(str(checkpoint / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    masks = {k for k in original if k.endswith(".attn.bias")}
    assert len(masks) == TINY_TEXT.n_layer  # the hub layout carries them; the converter cannot map them
    assert set(written) == set(original) - masks
    assert all(written[k].equal(original[k]) for k in written)


def test_a_tiny_checkpoint_converts_to_gguf_and_reads_back(make_checkpoint, tmp_path):
    llama_dir = os.environ.get("LLAMA_CPP_DIR")
    converter = next((p for p in ([anchor.Path(llama_dir) / anchor.CONVERTER] if llama_dir else []) if p.is_file()), None)
    if converter is None:
        pytest.skip("set LLAMA_CPP_DIR to llama.cpp's source folder (its convert_hf_to_gguf.py) to convert")
    pytest.importorskip("gguf", reason=f"llama.cpp's gguf package: pip install {converter.parent / 'gguf-py'}")
    checkpoint = tmp_path / "tiny"
    checkpoint.symlink_to(make_checkpoint(TINY_TEXT), target_is_directory=True)
    llama = anchor.LlamaCpp(completion=None, speculative=None, bench=None, converter=converter)
    tensors = {name: (n_bytes, rows) for name, n_bytes, rows in anchor.gguf_tensors(
        anchor.convert_to_gguf(llama, checkpoint, "f16"))}
    E, V, P, L = TINY_TEXT.n_embd, TINY_TEXT.vocab_size, TINY_TEXT.n_positions, TINY_TEXT.n_layer
    assert len(tensors) == 2 + 2 + 12 * L  # embeddings, final LayerNorm, 12 per block; no mask buffers
    assert tensors["token_embd.weight"] == (V * E * 2, V)  # f16
    assert tensors["blk.0.attn_qkv.weight"] == (3 * E * E * 2, 3 * E)
    assert tensors["position_embd.weight"] == (P * E * 4, P)  # the converter keeps it float32
    matrices = 2 * (3 * E * E + E * E + 4 * E * E + 4 * E * E) * L  # f16
    vectors = 4 * (2 * E + 3 * E + E + 2 * E + 4 * E + E) * L + 4 * 2 * E  # f32: LayerNorms and biases
    expected = V * E * 2 + E * 4 + matrices + vectors  # head = token embedding, one position row
    assert anchor.gguf_step_bytes(list((n, b, r) for n, (b, r) in tensors.items())) == expected


# ---------------------------------------------------------------------------------------------
# One round of llama.cpp, against stand-in programs that print the captured output

def fake_programs(root, log):
    """llama-bench / llama-completion / llama-speculative-simple stand-ins: each appends its
    arguments to log and prints the output captured above."""
    samples = {"llama-bench": (BENCH_JSON, ""), "llama-completion": (" the text", COMPLETION_STDERR),
               "llama-speculative-simple": ("", SPECULATIVE_STDERR)}
    paths = {}
    for name, (out, err) in samples.items():
        (root / f"{name}.out").write_text(out)
        (root / f"{name}.err").write_text(err)
        path = root / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\ncat {root / name}.out\ncat {root / name}.err >&2\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        paths[name] = path
    return anchor.LlamaCpp(completion=paths["llama-completion"], speculative=paths["llama-speculative-simple"],
                           bench=paths["llama-bench"], converter=root / "convert_hf_to_gguf.py")


@pytest.mark.parametrize("gguf_type", ["f16", "q8_0"])
def test_a_llama_round_times_from_the_prompt_to_the_last_token(tmp_path, gguf_type):
    log = tmp_path / "calls.txt"
    llama = fake_programs(tmp_path, log)
    settings = SimpleNamespace(threads=2, ctx_size=256, new_tokens=64, context=64, gamma=4)
    r = anchor.llama_round(llama, tmp_path / "t.gguf", tmp_path / "d.gguf", gguf_type, "Hello", settings)
    assert r["step_s"] == pytest.approx(11.291941015 / 16) and r["verify5_s"] == pytest.approx(0.816602462)
    assert r["plain_tok_s"] == pytest.approx(64 / (0.71878 + 2.00649))  # prompt evaluation included
    assert r["spec_tok_s"] == pytest.approx(69 / (0.670 + 10.331))
    assert r["text"] == " the text"
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["llama-bench", "llama-completion", "llama-speculative-simple"]
    assert all(" -t 2 " in c for c in calls)
    assert all(" --temp 0 " in c and " -n 64 " in c for c in calls[1:])
    assert "--spec-draft-n-max 4" in calls[2] and "--spec-type draft-simple" in calls[2]
    # q8_0's repacked kernels crash this llama.cpp on several-token batches: q8_0 runs without them
    assert ("--repack 0" in calls[0]) == (gguf_type == "q8_0")
    assert all(("--no-repack" in c) == (gguf_type == "q8_0") for c in calls[1:])


def test_each_goal_is_marked_reached_or_not_with_its_numbers():
    f16 = {"step_s": 0.100, "verify5_s": 0.140, "floor_s": 0.090, "plain_tok_s": 9.0, "spec_tok_s": 20.0}
    q8 = {"step_s": 0.060, "verify5_s": 0.200, "floor_s": 0.045, "plain_tok_s": 15.0, "spec_tok_s": 14.0}
    ours = {"step_s": 0.105, "verify5_s": 0.140, "floor_s": 0.080, "plain_tok_s": 17.0, "spec_tok_s": 31.0}
    lines = anchor.goal_lines({"ours auto": ours, "llama.cpp f16": f16, "llama.cpp q8_0": q8}, "ours auto")
    assert [line.split("**")[1] for line in lines] == ["reached", "not reached", "not reached", "reached"]
    assert "= 0.76" in lines[0] and "1.33 steps" in lines[1]
    assert "17.00 against 15.00 tok/s: 1.13x" in lines[2]  # plain: against q8_0's
    assert "against llama.cpp f16's 20.00 tok/s: 1.55x" in lines[3]  # speculative: against the best llama.cpp run
    alone = anchor.goal_lines({"ours auto": ours}, "ours auto")  # no llama.cpp run: those two not measured
    assert [line.split("**")[1] for line in alone] == ["reached", "not reached", "not measured", "not measured"]
    assert anchor.goal_lines({"llama.cpp f16": f16}, "ours auto") == []


def test_a_whole_run_writes_the_table_with_the_floor_and_the_goals(text_pair_dirs, tmp_path, monkeypatch):
    """main() end to end on a tiny pair with GPT-2's vocabulary, llama.cpp played by the stand-in programs."""
    llama = fake_programs(tmp_path, tmp_path / "calls.txt")
    monkeypatch.setattr(anchor, "find_llama_cpp", lambda root: (llama, ""))
    monkeypatch.setattr(anchor, "standin_pair", lambda *args, **kwargs: text_pair_dirs)
    monkeypatch.setattr(anchor, "convert_to_gguf", lambda llama, checkpoint, gguf_type: checkpoint / f"{gguf_type}.gguf")
    monkeypatch.setattr(anchor, "gguf_tensors", lambda path: [("token_embd.weight", 1000, 100)])
    monkeypatch.setattr(anchor, "measure_bandwidth", lambda: 10.0)
    pytest.importorskip("gguf", reason="main() checks that llama.cpp's gguf package is importable")
    out = tmp_path / "out"
    assert anchor.main(["--llama-cpp", "x", "--formats", "fp32", "--gguf-types", "f16", "--repeats", "1",
                        "--warmup", "0", "--new-tokens", "8", "--steps", "1", "--context", "64", "--threads", "1",
                        "--trained-pair", str(tmp_path / "none"), "--out", str(out)]) == 0
    table = (out / "results.md").read_text()
    assert "| ours fp32 (float32) |" in table and "| llama.cpp f16 |" in table
    assert "read bandwidth 10.0 GB/s" in table and "not real-model behaviour" in table
    assert "Goals, ours fp32:" in table and table.count("reached") == 3 and table.count("**not measured**") == 1
    summary = json.loads((out / "results.json").read_text())["pairs"]
    llama_f16 = next(iter(summary.values()))["summary"]["llama.cpp f16"]
    assert llama_f16["weight_bytes"] == 1000 and llama_f16["floor_s"] == pytest.approx(1000 / 10e9)
