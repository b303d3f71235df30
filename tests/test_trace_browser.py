"""The trace page in a real headless browser (Debian's chromium; .ci/run installs it): it renders,
without console errors, with one row per round, and hovering a token shows its numbers."""

import io
import json

import pytest
import torch

from browser import Browser, find_chromium
from gpt2 import decode, encode, load_gpt2
from spec_decoding import speculative_sampling
from spec_decoding.trace import write_html

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="no chromium (apt-get install chromium; .ci/run installs it)")


@pytest.fixture(scope="module")
def page(trained_pair_dirs, tmp_path_factory):
    target, draft = (load_gpt2(d) for d in trained_pair_dirs)
    result = speculative_sampling(target, draft, encode("class Parser:\n    def "), 40, gamma=4,
                                  temperature=1.0, generator=torch.Generator().manual_seed(2), trace=True)
    path = tmp_path_factory.mktemp("trace") / "trace.html"
    write_html(result.trace, path, pair="test pair (trained for seconds)")
    return path, result.trace


def test_page_renders_in_chromium_and_hover_shows_numbers(page):
    path, trace = page
    with Browser() as browser:
        browser.open(path.as_uri())
        assert browser.evaluate("document.querySelectorAll('tr.round').length") == len(trace.rounds)
        assert browser.evaluate("document.querySelectorAll('#chart rect.bar').length") >= 1

        # Hover the first rejected draft token in the rounds table: the tooltip shows its numbers.
        rejected = next((k, i) for k, r in enumerate(trace.rounds) for i, d in enumerate(r.drafted)
                        if d.verdict == "rejected")
        box = browser.evaluate(
            "(() => { const el = document.querySelectorAll('tr.round')[%d]"
            ".querySelectorAll('.tok')[%d]; el.scrollIntoView({block: 'center'});"
            " const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
            % rejected)
        assert browser.evaluate("getComputedStyle(document.getElementById('tip')).display") == "none"
        browser.hover(*box)
        tip = browser.evaluate("document.getElementById('tip').innerText")
        assert browser.evaluate("getComputedStyle(document.getElementById('tip')).display") == "block"
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
