"""The trace page in a real headless browser (Debian's chromium; .ci/run installs it): it renders,
without console errors, with one row per round, and hovering a token shows its numbers; for a token
tree, each round's tree is nested as drafted and hovering a node shows its numbers."""

import io
import json

import pytest
import torch

from browser import Browser, find_chromium
from gpt2 import decode, encode, load_gpt2
from spec_decoding import Observers, SamplingParams, speculative_sampling, tree_speculative_sampling
from spec_decoding.presentation.trace_page import write_html

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="no chromium (apt-get install chromium; .ci/run installs it)")


def traced_page(generate, trained_pair_dirs, folder):
    """(path of the trace page, the trace) of one sampled run of the trained pair:
    generate(target, draft, prompt, generator) -> GenerationResult with a trace."""
    target, draft = (load_gpt2(d) for d in trained_pair_dirs)
    result = generate(target, draft, encode("class Parser:\n    def "), torch.Generator().manual_seed(2))
    path = folder / "trace.html"
    write_html(result.trace, path, pair="test pair (trained for seconds)")
    return path, result.trace


def hover(browser, element_js: str) -> str:
    """Scroll the element (a JS expression) into view, hover its centre; the tooltip's text."""
    box = browser.evaluate(
        "(() => { const el = %s; el.scrollIntoView({block: 'center'});"
        " const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        % element_js)
    browser.hover(*box)
    assert browser.evaluate("getComputedStyle(document.getElementById('tip')).display") == "block"
    return browser.evaluate("document.getElementById('tip').innerText")


@pytest.fixture(scope="module")
def page(trained_pair_dirs, tmp_path_factory):
    return traced_page(lambda t, d, prompt, g: speculative_sampling(t, d, prompt, 40, gamma=4,
                                                                    sampling=SamplingParams(temperature=1.0, generator=g),
                                                                    observers=Observers(trace=True)),
                       trained_pair_dirs, tmp_path_factory.mktemp("trace"))


def test_page_renders_in_chromium_and_hover_shows_numbers(page):
    path, trace = page
    with Browser() as browser:
        browser.open(path.as_uri())
        assert browser.evaluate("document.querySelectorAll('tr.round').length") == len(trace.rounds)
        assert browser.evaluate("document.querySelectorAll('#chart rect.bar').length") >= 1

        # Hover the first rejected draft token in the rounds table: the tooltip shows its numbers.
        rejected = next((k, i) for k, r in enumerate(trace.rounds) for i, d in enumerate(r.drafted)
                        if d.verdict == "rejected")
        assert browser.evaluate("getComputedStyle(document.getElementById('tip')).display") == "none"
        tip = hover(browser, "document.querySelectorAll('tr.round')[%d].querySelectorAll('.tok')[%d]" % rejected)
        d = trace.rounds[rejected[0]].drafted[rejected[1]]
        assert f"p(x) = {d.p:.4g}" in tip and f"q(x) = {d.q:.4g}" in tip
        assert f"min(1, p/q) = {d.accept_probability:.4g}" in tip
        assert f"draw r = {d.draw:.4g}" in tip and "rejected" in tip
        assert json.dumps(decode([d.token])) in tip

        png = browser.screenshot()
        assert browser.errors() == []

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size[0] >= 800
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20, "the screenshot is (almost) blank"


@pytest.fixture(scope="module")
def tree_page(trained_pair_dirs, tmp_path_factory):
    return traced_page(lambda t, d, prompt, g: tree_speculative_sampling(t, d, prompt, 40, (2, 2, 1),
                                                                         sampling=SamplingParams(temperature=1.0, generator=g),
                                                                         observers=Observers(trace=True)),
                       trained_pair_dirs, tmp_path_factory.mktemp("tree-trace"))


def test_tree_page_renders_in_chromium_and_hover_shows_a_node(tree_page):
    path, trace = tree_page
    with Browser() as browser:
        browser.open(path.as_uri())
        assert browser.evaluate("document.querySelectorAll('tr.round').length") == len(trace.rounds)
        assert browser.evaluate("document.querySelectorAll('#chart rect.bar').length") >= 1

        # Each round's tree as drafted: every node chip sits in the children of its parent's chip.
        drawn = browser.evaluate(
            "[...document.querySelectorAll('tr.round')].map(row => [...row.querySelectorAll('[data-node]')]"
            ".map(el => { const up = el.parentElement.parentElement.closest('.node');"
            " const chip = up.querySelector(':scope > [data-node]');"
            " return [+el.dataset.node, chip ? +chip.dataset.node : -1]; }).sort((a, b) => a[0] - b[0]))")
        assert drawn == [[[i, d.parent] for i, d in enumerate(r.drafted)] for r in trace.rounds]

        # Hover a rejected child that was not its parent's first: it was tested against p', not p.
        k, i = next((k, i) for k, r in enumerate(trace.rounds) for i, d in enumerate(r.drafted)
                    if d.verdict == "rejected" and d.adjusted_p != d.p)
        tip = hover(browser, "document.querySelectorAll('tr.round')[%d].querySelector('[data-node=\"%d\"]')" % (k, i))
        d = trace.rounds[k].drafted[i]
        assert f"tree node {i + 1} of round {k + 1}: depth {d.depth}" in tip
        assert f"p(x) = {d.p:.4g}" in tip and f"p'(x) = {d.adjusted_p:.4g}" in tip and f"q(x) = {d.q:.4g}" in tip
        assert f"min(1, p'/q) = {d.accept_probability:.4g}" in tip
        assert f"draw r = {d.draw:.4g}" in tip and "rejected" in tip
        assert json.dumps(decode([d.token])) in tip
        assert browser.errors() == []
