"""Batched speculative decoding (spec_decoding/algorithms/batched.py): every row is decoded exactly as it
would be alone, whatever the other rows do.

- Greedy: every row equals the target's own greedy output for its prompt (float32), with prompts
  of different lengths, rows stopping at eos, max_gen and the context window's edge in different
  rounds.
- Caches: after every round every row of both KV caches equals a fresh forward over that row's
  accepted tokens (and the check fails when a roll-back is skipped).
- Sampling: the row under test follows the target's exact distribution (chi-square against exact
  enumeration, spec_decoding.checks) while the other rows run other prompts; a planted variant
  that lets one row's acceptance decide the whole batch's is rejected.
- Bad input: clear errors.
"""

import copy
from functools import partial
from unittest.mock import patch

import pytest
import torch

from spec_decoding import autoregressive_generate, Observers, SamplingParams, speculative_sampling_greedy
from spec_decoding.algorithms import batched
from spec_decoding.algorithms.batched import (MAX_BATCH_SIZE, batched_autoregressive_generate,
                                              batched_speculative_sampling)
from spec_decoding.calibration import calibrate_batch_costs
from spec_decoding.policies.costs import BatchCostModel
from spec_decoding.checks import check_lossless
from spec_decoding.result import STOP_CONTEXT_FULL, STOP_EOS, STOP_MAX_GEN
from spec_decoding.sampling import sample
from spec_decoding.policies.theory import crossover_batch_size, predicted_speedup

# Prompts of different lengths for the 64-position, 100-token agreeing pair (conftest); the last
# one is 50 tokens long, so with MAX_GEN = 20 it reaches the context window's edge.
PROMPTS = [[1, 2, 3], [50, 51, 52, 53, 54, 55, 56, 57, 58], [7], [9, 8, 7, 6, 5, 4],
           [(5 * i) % 100 for i in range(50)]]
MAX_GEN = 20


def first_eos(target, prompts):
    """A token that row 0's greedy output makes at position 3: an eos that stops some rows early,
    in different rounds, and not others."""
    return autoregressive_generate(target, prompts[0], MAX_GEN).tokens[3]


@pytest.mark.parametrize("batch_size", [1, 2, 5])
@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_rows_equal_the_targets_own_greedy_output(target, draft, batch_size, gamma):
    prompts = PROMPTS[-batch_size:]  # B = 1: the context-edge row alone
    eos = first_eos(target, PROMPTS) if batch_size > 1 else None
    result = batched_speculative_sampling(target, draft, prompts, MAX_GEN, gamma, eos_id=eos)
    for prompt, row in zip(prompts, result.rows):
        expected = autoregressive_generate(target, prompt, MAX_GEN, eos_id=eos)
        assert row.tokens == expected.tokens
        assert row.stats.stop_reason == expected.stats.stop_reason
        # and the same as the single-sequence speculative generator's
        assert row.tokens == speculative_sampling_greedy(target, draft, prompt, MAX_GEN, gamma, eos_id=eos).tokens
    if batch_size == 5:
        assert {r.stats.stop_reason for r in result.rows} == {STOP_EOS, STOP_MAX_GEN, STOP_CONTEXT_FULL}
        # rows finished in different rounds, and the finished ones left the batch
        assert result.batch_sizes[0] == 5 and result.batch_sizes[-1] < 5
        assert result.batch_sizes == sorted(result.batch_sizes, reverse=True)
        # real rejections happened (the draft is not the target)
        assert result.rejections > 0 and result.tokens_accepted > 0


def test_batched_autoregressive_baseline(target):
    eos = first_eos(target, PROMPTS)
    result = batched_autoregressive_generate(target, PROMPTS, MAX_GEN, eos_id=eos)
    for prompt, row in zip(PROMPTS, result.rows):
        assert row.tokens == autoregressive_generate(target, prompt, MAX_GEN, eos_id=eos).tokens
    assert result.target_forwards == MAX_GEN and result.batch_sizes[-1] < len(PROMPTS)


# ------------------------------------------------------------------------------------------------
# KV caches: every row equals a fresh forward after every round
# ------------------------------------------------------------------------------------------------

@torch.inference_mode()
def row_cache_difference(model, cache, row: int, sequence: list[int]) -> float:
    """Largest |difference| between cache row `row` at positions [0, its length) and a fresh
    single-sequence forward over sequence[:length]."""
    n = int(cache.lengths[row])
    if n == 0:
        return 0.0
    fresh = model.new_kv_cache(max_len=n)
    model(torch.tensor([sequence[:n]]), fresh)
    return max((got[row, :, :n] - want[0, :, :n]).abs().max().item()
               for got, want in zip(cache.keys + cache.values, fresh.keys + fresh.values))


def check_caches(target, draft, settings, seed=0):
    """Run a batch and check every cache row after every round: returns the problems found."""
    problems, rounds = [], [0]

    def on_round(report):
        rounds[0] += 1
        target_cache, draft_cache = report.target_cache, report.draft_cache
        for i, r in enumerate(report.active):
            seq = report.sequences[r]
            if int(target_cache.lengths[i]) != len(seq) - 1 or int(draft_cache.lengths[i]) > len(seq) - 1:
                problems.append(f"round {rounds[0]} row {r}: cache lengths "
                                f"{int(target_cache.lengths[i])}, {int(draft_cache.lengths[i])} "
                                f"for {len(seq)} tokens")
            for role, model, cache in (("target", target, target_cache), ("draft", draft, draft_cache)):
                if (diff := row_cache_difference(model, cache, i, seq)) > 1e-5:
                    problems.append(f"round {rounds[0]} row {r}: {role} cache off by {diff:.2g}")

    generator = torch.Generator().manual_seed(seed)
    batched_speculative_sampling(target, draft, PROMPTS, MAX_GEN, 3, SamplingParams(**settings, generator=generator),
                                 eos_id=first_eos(target, PROMPTS), observers=Observers(on_round=on_round))
    assert rounds[0] > 3
    return problems


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=1.0, top_k=20)])
def test_caches_equal_a_fresh_forward_for_every_row_after_every_round(target, draft, settings):
    assert check_caches(target, draft, settings) == []


def test_the_cache_check_catches_a_skipped_roll_back(target, draft):
    """Planted: the draft's cache is never rolled back, so it keeps rejected draft tokens."""
    with patch.object(batched.BatchedModelDrafter, "roll_back", lambda self, lengths: None):
        problems = check_caches(target, draft, dict(temperature=0.0))
    assert any("draft cache off" in p or "cache lengths" in p for p in problems)


# ------------------------------------------------------------------------------------------------
# Sampling: each row lossless while the other rows run other prompts
# ------------------------------------------------------------------------------------------------

PROMPT = [1, 2, 3]
OTHERS = ([7, 7, 7, 7, 7], [4, 9])  # the rows beside the one under test


@pytest.fixture(scope="module")
def vocab_pair(unrelated_pair):
    return unrelated_pair  # conftest: two unrelated models agreeing about half the time


def middle_row(target, draft, gamma):
    """generate_fn for check_lossless: the prompt runs as row 1 of 3, the others beside it."""
    def generate(prompt, max_gen, **kwargs):
        result = batched_speculative_sampling(target, draft, [OTHERS[0], prompt, OTHERS[1]], max_gen,
                                              gamma, **kwargs)
        return result.rows[1]
    return generate


SETTINGS = {  # name: (settings, gamma, samples)
    # as many samples as catch one row's acceptance for the whole batch at p < 1e-6 (below)
    "temperature 1": (dict(temperature=1.0), 2, 800),
    "temperature 0.7, top-k 6, top-p 0.9": (dict(temperature=0.7, top_k=6, top_p=0.9), 1, 800),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_each_row_follows_the_target_distribution(vocab_pair, name):
    target, draft = vocab_pair
    settings, gamma, samples = SETTINGS[name]
    result = check_lossless(middle_row(target, draft, gamma), target, PROMPT, 3, settings,
                            samples=samples, seed=0)
    assert result.passed, result.message


def row_zero_decides(target_scores, draft_tokens, draft_probs, temperature, generator):
    """Planted: row 0's accepted count applies to every row (each then draws its next token from
    its own p there): the batch stays aligned, and the other rows keep draft tokens untested."""
    n0, _ = batched.sampling_verdict(target_scores[0], draft_tokens[0], draft_probs[0], generator)
    verdicts = []
    for scores, tokens in zip(target_scores, draft_tokens):
        n = min(n0, len(tokens))
        verdicts.append((n, int(sample(scores[n], generator))))
    return verdicts


def test_one_rows_acceptance_for_the_whole_batch_is_caught(vocab_pair):
    target, draft = vocab_pair
    settings, gamma, _ = SETTINGS["temperature 1"]
    with patch.object(batched, "judge_rows", row_zero_decides):
        result = check_lossless(middle_row(target, draft, gamma), target, PROMPT, 3, settings,
                                samples=SETTINGS["temperature 1"][2], seed=1)
    assert not result.passed and result.p_value < 1e-6, result.message


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------

def test_bad_input_gives_clear_errors(target, draft):
    run = partial(batched_speculative_sampling, target, draft, max_gen=4, gamma=2)
    with pytest.raises(ValueError, match="prompts is empty"):
        run([])
    with pytest.raises(ValueError, match="prompt 1: prefix is empty"):
        run([[1, 2], []])
    with pytest.raises(ValueError, match=f"more than the largest batch, {MAX_BATCH_SIZE}"):
        run([[1]] * (MAX_BATCH_SIZE + 1))
    with pytest.raises(ValueError, match="prompts must be a list of prompts"):
        run("hello")
    with pytest.raises(ValueError, match="prompt 0 is on meta but the model is on cpu"):
        run([torch.tensor([1, 2], device="meta")])
    with pytest.raises(ValueError, match="target is on cpu but the draft is on meta"):
        batched_speculative_sampling(target, copy.deepcopy(draft).to("meta"), [[1]], 4, 2)
    with pytest.raises(ValueError, match="prompts is empty"):
        batched_autoregressive_generate(target, [], 4)


# ------------------------------------------------------------------------------------------------
# The batch's cost model
# ------------------------------------------------------------------------------------------------

def test_batch_cost_model_by_hand():
    """A forward costs a fixed 10 ms (reading the weights) up to 8 rows, then 1.25 ms per row: at
    batch 1 verifying 4 tokens is nearly free, at batch 16 it costs (gamma + 1) steps."""
    rows = [1, 8, 16, 32, 64, 128]
    target = [0.010, 0.010, 0.020, 0.040, 0.080, 0.160]
    model = BatchCostModel("t", "d", rows, target, [t / 10 for t in target])
    assert model.verify_cost(1, 3) == pytest.approx(1.0)  # 4 rows: still 10 ms
    assert model.verify_cost(16, 3) == pytest.approx(4.0)  # 64 rows vs 16
    assert model.target_seconds(12) == pytest.approx(0.015)  # interpolated
    alpha = 0.8
    by_batch = {b: max(model.predicted_speedup(alpha, g, b) for g in (1, 2, 3)) for b in (1, 2, 4, 8, 16, 32)}
    assert by_batch[1] == pytest.approx(predicted_speedup(alpha, 3, 0.1, 1.0))
    assert crossover_batch_size(by_batch) == 8  # 8 rows x (g + 1) already costs more than a step
    assert crossover_batch_size({1: 2.0, 2: 1.5}) is None
    with pytest.raises(ValueError, match="outside the measured range"):
        model.verify_cost(64, 3)


def test_calibrate_batch_costs(target, draft, tmp_path):
    model = calibrate_batch_costs(target, draft, max_rows=6, repeats=1)
    assert model.rows == [1, 2, 4, 6] and min(model.target_s) > 0 and min(model.draft_s) > 0
    assert BatchCostModel.load(model.save(tmp_path / "costs.json")) == model


# ------------------------------------------------------------------------------------------------
# The command line: spec_decoding_generate.py --prompts-file, benchmark.py --batch
# ------------------------------------------------------------------------------------------------

CLI_PROMPTS = ["The capital of France is", "", "Once upon a time there was a very long prompt that", "Hi"]


def test_generate_script_prompts_file(text_pair_dirs, text_pair, tmp_path, capsys):
    import json

    import spec_decoding_generate as script
    from gpt2 import EOT_ID, encode

    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(CLI_PROMPTS) + "\n")
    pair = ["--target", str(text_pair_dirs[0]), "--draft", str(text_pair_dirs[1])]
    assert script.main(pair + ["--prompts-file", str(prompts_file), "--max-gen", "8", "--gamma", "3",
                               "--json", "--compare-baseline"]) == 0
    report = json.loads(capsys.readouterr().out)
    prompts = [p for p in CLI_PROMPTS if p]  # the blank line is skipped
    assert [r["prompt"] for r in report["rows"]] == prompts
    for prompt, row in zip(prompts, report["rows"]):
        assert row["tokens"] == autoregressive_generate(text_pair[0], encode(prompt), 8, eos_id=EOT_ID).tokens
    assert report["identical_to_baseline"] and report["summed"]["tokens_generated"] == 8 * len(prompts)

    assert script.main(pair + ["--prompts-file", str(prompts_file), "--max-gen", "4"]) == 0
    out = capsys.readouterr().out
    assert "--- prompt 2:" in out and "tokens generated (sum): 12" in out

    for extra, words in ((["--tree", "2,1"], "drop --tree"), (["--gamma", "auto"], "drop --gamma auto")):
        with pytest.raises(SystemExit) as e:
            script.main(pair + ["--prompts-file", str(prompts_file)] + extra)
        assert e.value.code == 2 and words in capsys.readouterr().err
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(SystemExit):
        script.main(pair + ["--prompts-file", str(tmp_path / "blank.txt")])
    assert "holds no prompts" in capsys.readouterr().err


def test_benchmark_batch(text_pair_dirs, tmp_path, capsys):
    import json

    import benchmark

    out = tmp_path / "out"
    benchmark.main(["--target", str(text_pair_dirs[0]), "--draft", str(text_pair_dirs[1]), "--batch", "1", "2",
                    "--gammas", "1", "2", "--max-gens", "4", "--out", str(out)])
    results = json.loads((out / "results.json").read_text())
    assert [e["batch"] for e in results["by_batch"]] == [1, 2]
    for e in results["by_batch"]:
        assert e["best_gamma"] in (1, 2) and e["speedup_measured"] > 0 and e["speedup_predicted"] > 0
    assert results["by_batch"][0]["single_ar_tokens_per_s"] > 0
    assert all(c["ar_tokens"] == 4 * c["batch"] and c["spec_tokens"] == 4 * c["batch"] for c in results["cells"])
    assert "Crossover" in (out / "summary.md").read_text() and "Crossover" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        benchmark.main(["--batch", "2", "--gammas", "auto", "--out", str(tmp_path / "o2")])
    assert "fixed gammas only" in capsys.readouterr().err


def test_benchmark_batch_above_the_largest_is_refused_before_loading(tmp_path, capsys):
    """--batch 128 (above MAX_BATCH_SIZE) is a usage error at once, not a traceback after both
    models load and the smaller batches ran."""
    import benchmark
    from spec_decoding.algorithms.batched import MAX_BATCH_SIZE

    with pytest.raises(SystemExit):
        benchmark.main(["--target", str(tmp_path / "missing"), "--batch", "1", str(2 * MAX_BATCH_SIZE),
                        "--gammas", "2", "--out", str(tmp_path / "o")])
    assert f"the largest batch is {MAX_BATCH_SIZE}" in capsys.readouterr().err
