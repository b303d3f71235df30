"""Small things a learner notices: one set of colour names (terminal, trace page, docs), every page
colour in its legend, the gamma-0 round explained, default outputs under runs/, benchmark legends
that say what their error bars span."""

import re

import pytest
import torch

from conftest import ROOT
from gpt2 import load_gpt2
from spec_decoding import Observers, SamplingParams, speculative_sampling, tree_speculative_sampling
from spec_decoding.presentation.colours import SOURCE_COLOURS
from spec_decoding.result import FROM_DRAFT_BRANCH, GenerationStats
from spec_decoding.presentation.trace_page import render_html

OTHER_COLOUR_WORDS = ("blue", "pink", "red", "orange", "violet", "lavender")


@pytest.fixture(scope="module")
def pages(pair_dirs):
    target, draft = (load_gpt2(d) for d in pair_dirs)
    g = torch.Generator().manual_seed(0)
    chain = speculative_sampling(target, draft, [1, 2, 3], 9, gamma=4,
                                 sampling=SamplingParams(temperature=1.0, generator=g),
                                 observers=Observers(trace=True))
    tree = tree_speculative_sampling(target, draft, [1, 2, 3], 9, (2, 1),
                                     sampling=SamplingParams(temperature=1.0, generator=g),
                                     observers=Observers(trace=True))
    decode = lambda t: f"#{t}"  # noqa: E731  (a tiny vocabulary)
    return render_html(chain.trace, decode=decode), render_html(tree.trace, decode=decode)


def legends(page: str) -> str:
    return " ".join(re.findall(r'<p class="legend">(.*?)</p>', page, flags=re.S))


def test_the_page_names_every_token_colour_in_its_legend(pages):
    chain_page, tree_page = pages
    for page, sources in ((chain_page, set(SOURCE_COLOURS) - {FROM_DRAFT_BRANCH}), (tree_page, set(SOURCE_COLOURS))):
        legend = legends(page)
        for source in sources:
            assert f'<span class="tok {source}">{SOURCE_COLOURS[source]}</span>' in legend, source
        # every class a token of the text is coloured with has its legend entry
        used = set(re.findall(r'<span class="tok (\w+)" data-k', page.split('<div id="text">')[1].split("</div>")[0]))
        assert used <= sources and used
        assert not any(re.search(rf"\b{word}\b", legend) for word in OTHER_COLOUR_WORDS)


def test_terminal_and_docs_use_the_same_names():
    import spec_decoding_generate as cli
    for source, name in SOURCE_COLOURS.items():
        assert cli.COLOURS[source] == cli.ANSI[name]
        if source != FROM_DRAFT_BRANCH:
            assert cli.COLOURS[source] in cli.LEGEND
    assert cli.COLOURS[FROM_DRAFT_BRANCH] in cli.TREE_LEGEND
    command_line = (ROOT / "docs" / "command_line.md").read_text()
    for name in SOURCE_COLOURS.values():
        assert f"**{name}**" in command_line
    readme = (ROOT / "README.md").read_text()
    assert not any(word in readme.split("## ")[1] for word in ("blue token", "pink"))


def test_a_gamma_zero_round_is_explained(capsys):
    import spec_decoding_generate as cli
    stats = GenerationStats(target_calls=3, rounds=3, tokens_drafted=8, tokens_accepted=8,
                            gamma_by_round=[4, 4, 0], drafted_by_position=[2] * 4, accepted_by_position=[2] * 4)
    cli.print_stats(stats, 4)
    assert "(0: a plain target step, nothing drafted: max_gen or the context window left room for only one more token)" in capsys.readouterr().out
    stats.gamma_by_round = [4, 4]
    cli.print_stats(stats, 4)
    assert "0: a plain" not in capsys.readouterr().out
    stats.gamma_by_round = [3, 0, 2]
    cli.print_stats(stats, "auto")
    assert "the policy judged drafting not worth it" in capsys.readouterr().out


def test_html_with_no_file_goes_under_runs(tmp_path, monkeypatch):
    import spec_decoding_generate as cli
    monkeypatch.chdir(tmp_path)
    args = cli.parse_args(["--html"])
    assert args.html == "runs/trace.html" and (tmp_path / "runs").is_dir()
    assert cli.parse_args(["--html", "mine.html"]).html == "mine.html"  # or where the user says
    assert "runs/" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("runs, repeats, expected", [
    (2, 1, "error bars: quartiles over the 2 prompts (1 run each)"),
    (5, 5, "error bars: quartiles over the 5 repeats of 1 prompt"),
    (6, 3, "error bars: quartiles over 6 runs (2 prompts x 3 repeats)"),
    (4, None, "error bars: quartiles over each cell's 4 runs"),
])
def test_benchmark_legend_says_what_the_error_bars_span(runs, repeats, expected):
    from benchmarks.plots import error_bars_note
    assert error_bars_note([{"runs": runs}], repeats) == expected
