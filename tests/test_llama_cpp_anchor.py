"""benchmarks.llama_cpp_anchor without llama.cpp: the skip line, the timing parsers on output
captured from llama.cpp (llama-cpp-python 0.3.36's vendored copy), the bandwidth-floor arithmetic,
and the folder the GGUF converter reads. With LLAMA_CPP_DIR set (and its gguf package importable),
a tiny checkpoint is also converted and read back."""

import json
import os
import stat

import pytest
from safetensors.torch import load_file

from benchmarks import llama_cpp_anchor as anchor
from gpt2.tokenizer import TOKENIZER_FILES
from tests.conftest import TINY_TEXT

# ---------------------------------------------------------------------------------------------
# Captured from the llama.cpp of llama-cpp-python 0.3.36 (the lines around the timings, verbatim)

COMPLETION_STDERR = """\
common_perf_print:    sampling time =      11.53 ms
common_perf_print:    samplers time =       4.87 ms /    80 tokens
common_perf_print:        load time =     402.95 ms
common_perf_print: prompt eval time =     244.31 ms /    16 tokens (   15.27 ms per token,    65.49 tokens per second)
common_perf_print:        eval time =    4329.64 ms /    63 runs   (   68.72 ms per token,    14.55 tokens per second)
common_perf_print:       total time =    4590.41 ms /    79 tokens
common_perf_print: unaccounted time =       4.93 ms /   0.1 %      (total - sampling - prompt eval - eval) / (total)
common_perf_print:    graphs reused =         62
llama_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
"""

SPECULATIVE_STDERR = """\
encoded   16 tokens in    0.262 seconds, speed:   61.007 t/s
decoded   66 tokens in    2.853 seconds, speed:   23.135 t/s

n_draft   = 4
n_predict = 66
n_drafted = 64
n_accept  = 50
accept    = 78.125%

draft:

common_perf_print:    sampling time =      22.15 ms
common_perf_print:        load time =     101.83 ms
common_perf_print: prompt eval time =     512.55 ms /   106 tokens (    4.84 ms per token,   206.81 tokens per second)
common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
"""

BENCH_JSON = """\
[
  {
    "build_commit": "0c1e570",
    "n_prompt": 5,
    "n_gen": 0,
    "n_depth": 64,
    "avg_ns": 120000000,
    "avg_ts": 41.666667
  },
  {
    "build_commit": "0c1e570",
    "n_prompt": 0,
    "n_gen": 16,
    "n_depth": 64,
    "avg_ns": 1120000000,
    "avg_ts": 14.285714
  }
]
"""


def test_completion_timings_are_read_from_its_perf_lines():
    t = anchor.parse_completion_timings(COMPLETION_STDERR)
    # the generation's line, not the prompt's (which also contains "eval time = ... ms")
    assert t == {"prompt_ms": 244.31, "prompt_tokens": 16, "eval_ms": 4329.64, "eval_runs": 63,
                 "ms_per_token": 68.72}


def test_speculative_timings_and_counts_are_read():
    t = anchor.parse_speculative_timings(SPECULATIVE_STDERR)
    assert t == {"prompt_tokens": 16, "encode_s": 0.262, "generated": 66, "decode_s": 2.853,
                 "n_draft": 4, "n_predict": 66, "n_drafted": 64, "n_accept": 50}


def test_bench_json_gives_the_step_and_verify_at_the_depth_asked():
    assert anchor.parse_bench_json("build: 0c1e570\n" + BENCH_JSON, 64) == {"step_s": 0.07, "verify5_s": 0.12}
    assert anchor.parse_bench_json(BENCH_JSON, 128) == {}  # another depth: nothing taken from it


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
