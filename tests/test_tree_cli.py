"""Token trees on the command line: spec_decoding_generate.py --tree and benchmark.py --trees, on
the tiny text_pair checkpoints (GPT-2's real vocabulary)."""

import csv
import json
import re

import pytest

import spec_decoding_generate as script
from conftest import ROOT
from gpt2 import EOT_ID, encode
from spec_decoding import autoregressive_generate
from spec_decoding.result import FROM_DRAFT, FROM_DRAFT_BRANCH
from test_benchmark import run_benchmark

PROMPT = "The capital of France is"


def run_main(argv, capsys):
    code = script.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_tree_greedy_json_equals_the_target(text_pair_dirs, text_pair, capsys):
    target_dir, draft_dir = text_pair_dirs
    code, out, err = run_main(["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT,
                               "--max-gen", 20, "--tree", "2,2,1", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["tree"] == [2, 2, 1]
    target, _ = text_pair
    assert report["tokens"] == autoregressive_generate(target, encode(PROMPT), 20, eos_id=EOT_ID).tokens
    stats = report["stats"]
    assert stats["nodes_per_target_call"] > 1 and len(stats["accepted_depths"]) > 0
    assert max(stats["accepted_depths"]) <= 3


def test_generate_tree_sampling_prints_tree_stats(text_pair_dirs, capsys):
    target_dir, draft_dir = text_pair_dirs
    code, out, err = run_main(["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT,
                               "--max-gen", 12, "--tree", "3,1", "--temperature", 0.9, "--seed", 0], capsys)
    assert code == 0, err
    assert out.startswith(PROMPT)
    assert "tree nodes per call:" in out and "tree 3,1" in out and "at most depth + 1 = 3" in out


def test_generate_tree_html_writes_the_trace_page(text_pair_dirs, tmp_path, capsys):
    """--html with --tree: the page has one row per target call and one chip per tree node verified."""
    target_dir, draft_dir = text_pair_dirs
    page = tmp_path / "tree.html"
    code, out, err = run_main(["--target", target_dir, "--draft", draft_dir, "--prompt", PROMPT,
                               "--max-gen", 16, "--tree", "2,2,1", "--temperature", 1, "--seed", 0,
                               "--json", "--html", page], capsys)
    assert code == 0, err
    assert f"Wrote the round-by-round trace to {page}" in err
    stats = json.loads(out)["stats"]
    text = page.read_text()
    assert "token tree 2,2,1" in text and str(target_dir) in text
    assert len(re.findall(r'<tr class="round">', text)) == stats["target_calls"]
    assert len(re.findall(r'data-node="', text)) == stats["nodes_verified"] > 0


def test_tree_legend_and_colours(monkeypatch, capsys):
    """In colour mode the legend names side branches, and their tokens get their own colour."""
    monkeypatch.setattr(script, "use_colour", lambda: True)
    printer = script.start_printing("Hi", tree=True)
    printer([11, 12], [FROM_DRAFT, FROM_DRAFT_BRANCH])
    out = capsys.readouterr().out
    assert "side branch" in out
    branch, draft = script.COLOURS[FROM_DRAFT_BRANCH], script.COLOURS[FROM_DRAFT]
    assert branch and branch != draft and branch in out.split("\n", 2)[-1]
    script.start_printing("Hi", tree=False)
    assert "side branch" not in capsys.readouterr().out


@pytest.mark.parametrize("value", ["2,0", "a,b", "", "2,,1"])
def test_bad_tree_exits_2(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--tree", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--tree" in err and "like 2,2,1" in err


def test_benchmark_trees_beside_gammas(text_pair_dirs, tmp_path):
    target_dir, draft_dir = text_pair_dirs
    out = tmp_path / "out"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text((ROOT / "prompts" / "short.txt").read_text().splitlines()[0] + "\n")
    proc = run_benchmark("--draft", draft_dir, "--target", target_dir, "--gammas", 1, 3,
                         "--trees", "3", "2,1", "--max-gens", 8, "--temperatures", 0, 1,
                         "--prompts", prompts, "--repeats", 1, "--warmup", 0, "--threads", 1,
                         "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert {c["gamma"] for c in results["cells"]} == {1, 3}  # chain cells are as before
    trees = {(c["tree"], c["temperature"]): c for c in results["tree_cells"]}
    assert set(trees) == {("3", 0.0), ("3", 1.0), ("2,1", 0.0), ("2,1", 1.0)}
    assert set(results["costs"]["verify_cost_by_tree"]) == {"3", "2,1"}
    for (tree, t), cell in trees.items():
        depth = len(tree.split(","))
        assert cell["gamma"] == depth and len(cell["acceptance_by_position"]) == depth
        assert 1 <= cell["tokens_per_target_call"] <= depth + 1
        assert cell["nodes_per_target_call"] <= {"3": 3, "2,1": 4}[tree]
        assert cell["tokens_match_baseline"] is (True if t == 0 else None)
        assert cell["predicted_speedup"] == pytest.approx(cell["tokens_per_target_call"] / (
            depth * results["costs"]["c"] + results["costs"]["verify_cost_by_tree"][tree]))
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 + 2 * 2 and sorted(r["tree"] for r in rows if r["tree"]) == ["2,1", "2,1", "3", "3"]
    summary = (out / "summary.md").read_text()
    assert "| Tree | T | Nodes |" in summary and "| 3 | 0 | 3 |" in summary  # tree 3 beside gamma 3
    assert summary in proc.stdout


def test_benchmark_bad_tree_is_a_usage_error(tmp_path, capsys):
    import benchmark

    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--trees", "2,x", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--trees" in err and "like 2,2,1" in err


# ---------------------------------------------------------------- every tree drafter in the benchmark

@pytest.fixture(scope="module")
def medusa_dir(text_pair, tmp_path_factory):
    """One untrained (lightly perturbed) Medusa head for the text pair's target, saved as the trainer
    does: it drafts trees one depth deep, whatever depth is asked."""
    from spec_decoding.drafters.feature_files import save_feature_drafter
    from spec_decoding.drafters.medusa import MedusaHeads
    from test_feature_drafters import randomize

    folder = tmp_path_factory.mktemp("medusa")
    save_feature_drafter(folder, "medusa", randomize(MedusaHeads(text_pair[0], 1), 0, std=0.02), text_pair[0],
                         {"num_heads": 1})
    return folder


def test_benchmark_trees_with_every_tree_drafter(text_pair_dirs, medusa_dir, tmp_path, capsys):
    """--trees runs with each drafter in --drafters that drafts trees (model and medusa:DIR here),
    greedy tree tokens equal to the target's own, each tree beside its own drafter's chain."""
    import benchmark

    target_dir, draft_dir = text_pair_dirs
    prompts = tmp_path / "prompts.txt"
    prompts.write_text((ROOT / "prompts" / "short.txt").read_text().splitlines()[0] + "\n")
    out = tmp_path / "out"
    medusa = f"medusa:{medusa_dir}"
    benchmark.main([str(a) for a in ("--draft", draft_dir, "--target", target_dir, "--drafters", "model", medusa,
                                     "--gammas", 4, "--trees", "2,1", "--max-gens", 8, "--temperatures", 0, 1,
                                     "--prompts", prompts, "--repeats", 1, "--warmup", 0, "--dtype", "float32",
                                     "--out", out)])
    stdout = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    trees = {(c["drafter"], c["temperature"]): c for c in results["tree_cells"]}
    assert set(trees) == {(d, t) for d in ("model", medusa) for t in (0.0, 1.0)}
    c_of = {name: d["c"] for name, d in results["costs"]["drafters"].items()}
    for (drafter, t), cell in trees.items():
        assert cell["tree"] == "2,1" and cell["draft_calls"] > 0 and cell["nodes_per_target_call"] > 1
        assert cell["tokens_match_baseline"] is (True if t == 0 else None)
        # the drafter's own draft step, one per depth it reaches: 2 for the model, 1 for one Medusa head
        depth = 2 if drafter == "model" else 1
        assert 1 <= cell["tokens_per_target_call"] <= depth + 1
        assert cell["predicted_speedup"] == pytest.approx(cell["tokens_per_target_call"] / (
            depth * c_of[drafter] + results["costs"]["verify_cost_by_tree"]["2,1"]))
    with open(out / "results.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["tree"]]
    assert sorted((r["drafter"], r["tree"]) for r in rows) == sorted([("model", "2,1"), (medusa, "2,1")] * 2)
    summary = (out / "summary.md").read_text()
    assert "| Drafter | Tree | T | Nodes |" in summary and summary in stdout
    # each row: the drafter, its tree, and its own chain of 4 draft tokens (2 + 2 nodes) beside it
    for drafter in ("model", medusa):
        chain = next(c for c in results["cells"] if (c["drafter"], c["gamma"], c["temperature"]) == (drafter, 4, 0))
        row = next(line for line in summary.splitlines() if line.startswith(f"| {drafter} | 2,1 | 0 | 4 |"))
        assert f"| {chain['speedup_median']:.2f}x | {chain['tokens_per_target_call']:.2f} | yes |" in row


def test_benchmark_trees_without_a_tree_drafter_is_a_usage_error(tmp_path, capsys):
    import benchmark
    from spec_decoding import cli

    with pytest.raises(SystemExit) as exit_info:
        benchmark.parse_args(["--drafters", "ngram", "layerskip:1", "--trees", "2,1", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--trees needs a drafter that drafts token trees" in err
    assert f"add one of {cli.tree_drafters()} to --drafters" in err and "model, medusa:DIR" in err
    assert "Traceback" not in err


def test_benchmark_finds_tree_drafters_by_kind_not_by_name(monkeypatch):
    """A new kind that drafts trees is run with --trees with no change to benchmark.py."""
    import benchmark
    from spec_decoding import cli

    monkeypatch.setitem(cli.DRAFTER_KINDS, "newtree", cli.DrafterKind(
        build=lambda n, target, draft: None, describe=lambda n: "a new tree drafter", drafts_trees=True))
    names = ["ngram:3", "newtree", "model", "layerskip:2", "medusa:some/dir", "eagle:other/dir"]
    assert benchmark.tree_drafters(dict.fromkeys(names)) == ["newtree", "model", "medusa:some/dir"]
    benchmark.parse_args(["--drafters", "newtree", "--trees", "2", "--out", "runs/not-written"])  # accepted


def test_tree_table_falls_back_to_the_chain_as_deep_as_the_tree():
    """A tree of 14 nodes and depth 4 with no gamma-14 chain run sits beside the gamma-4 chain (equal
    draft depth); with a gamma-14 chain it sits beside that one (equal verification width)."""
    import benchmark

    tree = dict(drafter="medusa:DIR", temperature=1.0, tree="2,2,1,1", speedup_median=0.5, predicted_speedup=0.6,
                tokens_per_target_call=2.5, nodes_per_target_call=12.0, tokens_match_baseline=None)
    chain = dict(drafter="medusa:DIR", temperature=1.0, gamma=4, speedup_median=0.4, tokens_per_target_call=2.25)
    other = dict(chain, drafter="model", speedup_median=0.9, tokens_per_target_call=3.75)
    costs = {"verify_cost_by_tree": {"2,2,1,1": 1.8}}
    row = benchmark.tree_summary([tree], [other, chain], costs)[4]
    assert row.endswith("| 1.80 | 4 | 0.40x | 2.25 | n/a | none |"), row  # last: the loops column
    wide = dict(chain, gamma=14, speedup_median=0.3, tokens_per_target_call=2.0)
    row = benchmark.tree_summary([tree], [chain, wide], costs)[4]
    assert row.endswith("| 1.80 | 14 | 0.30x | 2.00 | n/a | none |"), row
