"""A per-round record of speculative decoding, and a web page that shows it.

    result = speculative_sampling(target, draft, prompt_ids, 60, gamma=4, trace=True)
    write_html(result.trace, "trace.html")        # one self-contained page: open it in a browser

For every round the trace keeps the drafted tokens with p(x) (the target's probability of each),
q(x) (the draft's), the acceptance probability min(1, p(x)/q(x)), the uniform draw r it was tested
with (accepted if r < p/q), the verdict, and the token the target added: a correction drawn from the
residual norm(max(0, p - q)) (its most likely tokens are kept), or a bonus drawn from p after an
all-accepted round. In greedy decoding (temperature 0) a draft token is accepted exactly when it is
the target's argmax; p and q are then shown at temperature 1 for information.

The page: the text coloured by where each token came from (as the terminal does), one row per round
(hover or click a token to see its numbers), and the measured acceptance at each draft position next
to alpha^i, what the i.i.d. theory of Leviathan et al. predicts.
"""

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_TARGET

ACCEPTED, REJECTED, UNJUDGED = "accepted", "rejected", "not judged"
TOP = 5  # tokens kept of the residual / of p for the target's token


@dataclass
class DraftedToken:
    token: int
    p: float  # the target's p(x) at this position
    q: float | None  # the draft's q(x) (1.0 for a point-mass proposal; None in greedy without q)
    accept_probability: float | None  # min(1, p/q); greedy: 1 if x is the target's argmax, else 0
    draw: float | None  # the uniform r it was tested with (None: greedy, or never judged)
    verdict: str  # ACCEPTED, REJECTED or UNJUDGED (after an earlier rejection in the round)


@dataclass
class Round:
    drafted: list[DraftedToken]
    n_accepted: int
    next_token: int  # the target's token: a correction (after a rejection) or a bonus
    next_source: str  # FROM_CORRECTION, FROM_BONUS, or FROM_TARGET (nothing drafted: a plain step)
    next_p: float  # p of next_token in its row (before taking the residual)
    candidates: list[tuple[int, float]]  # what next_token was drawn from: its TOP tokens
    emitted: int  # tokens of this round that reached the output (eos / max_gen may cut some)


@dataclass
class Trace:
    prompt: list[int]
    gamma: int
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    rounds: list[Round] = field(default_factory=list)
    tokens_out: int = 0  # output tokens so far

    # -- recording: one call per round, from the generators ---------------------------------------

    def record_sampled_round(self, draft_tokens: list[int], draft_probs: torch.Tensor,
                             target_probs: torch.Tensor, verdict, n_out: int) -> None:
        """draft_probs [g, V] q, target_probs [g + 1, V] p, verdict: speculative.Verdict;
        n_out: output length after the round."""
        n = verdict.n_accepted
        drafted = []
        for i, x in enumerate(draft_tokens):
            p, q = float(target_probs[i, x]), float(draft_probs[i, x])
            drafted.append(DraftedToken(
                x, p, q, min(1.0, p / q) if q > 0 else 1.0,
                verdict.uniforms[i] if i < len(verdict.uniforms) else None,
                ACCEPTED if i < n else REJECTED if i == n else UNJUDGED))
        dist = verdict.residual if verdict.residual is not None else target_probs[n]
        self._add_round(drafted, n, verdict.next_token, float(target_probs[n, verdict.next_token]),
                        dist, n_out)

    def record_greedy_round(self, draft_tokens: list[int], target_logits: torch.Tensor,
                            n_accepted: int, n_out: int) -> None:
        """target_logits [g + 1, V]; the target's argmax decides, p is shown at temperature 1."""
        p = torch.softmax(target_logits.float(), dim=-1)
        drafted = []
        for i, x in enumerate(draft_tokens):
            judged = i <= n_accepted
            drafted.append(DraftedToken(
                x, float(p[i, x]), None, 1.0 if i < n_accepted else 0.0 if judged else None,
                None, ACCEPTED if i < n_accepted else REJECTED if i == n_accepted else UNJUDGED))
        next_token = int(target_logits[n_accepted].argmax())
        self._add_round(drafted, n_accepted, next_token, float(p[n_accepted, next_token]),
                        p[n_accepted], n_out)

    def _add_round(self, drafted, n, next_token, next_p, dist, n_out):
        top = dist.float().topk(min(TOP, dist.shape[-1]))
        candidates = [(int(t), round(float(v), 6)) for t, v in zip(top.indices, top.values) if v > 0]
        source = (FROM_TARGET if not drafted else FROM_BONUS if n == len(drafted) else FROM_CORRECTION)
        self.rounds.append(Round(drafted, n, next_token, source, next_p, candidates,
                                 n_out - self.tokens_out))
        self.tokens_out = n_out

    # -- summaries ----------------------------------------------------------------------------

    @property
    def tokens_accepted(self) -> int:
        return sum(r.n_accepted for r in self.rounds)

    @property
    def alpha(self) -> float | None:
        """Accepted / judged draft tokens (as GenerationStats.alpha)."""
        judged = sum(r.n_accepted + (r.next_source == FROM_CORRECTION) for r in self.rounds)
        return self.tokens_accepted / judged if judged else None

    def acceptance_by_position(self) -> list[tuple[int, int]]:
        """[(accepted, drafted)] for draft positions 1..gamma: how often the i-th draft token of a
        round was accepted, among rounds that drafted at least i tokens."""
        longest = max([self.gamma] + [len(r.drafted) for r in self.rounds])
        counts = [[0, 0] for _ in range(longest)]
        for r in self.rounds:
            for i, d in enumerate(r.drafted):
                counts[i][1] += 1
                counts[i][0] += d.verdict == ACCEPTED
        return [tuple(c) for c in counts]

    def output_tokens(self) -> list[tuple[int, str, int, int]]:
        """[(token, source, round index, index in round)] as in the output."""
        out = []
        for k, r in enumerate(self.rounds):
            made = [(d.token, FROM_DRAFT, k, i) for i, d in enumerate(r.drafted[:r.n_accepted])]
            made.append((r.next_token, r.next_source, k, len(r.drafted)))
            out += made[:r.emitted]
        return out

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# The web page
# ------------------------------------------------------------------------------------------------

def token_text(vocab_size_is_gpt2: bool):
    if vocab_size_is_gpt2:
        from gpt2 import decode
        return lambda t: decode([t])
    return lambda t: f"#{t} "


def write_html(trace: Trace, path, title: str = "Speculative decoding, round by round",
               pair: str = "", decode=None) -> Path:
    """Write render_html(...) to path (the caller decides about overwriting)."""
    path = Path(path)
    path.write_text(render_html(trace, title, pair, decode), encoding="utf-8")
    return path


def render_html(trace: Trace, title: str = "Speculative decoding, round by round", pair: str = "",
                decode=None) -> str:
    """One self-contained HTML page (inline CSS, JS and SVG; no network). decode(token) -> str
    (default: GPT-2's tokenizer)."""
    decode = decode or token_text(True)

    def label(t: int) -> str:
        return decode(t)

    def num(x):
        return None if x is None else f"{x:.4g}"  # 4 significant digits, as text

    # Every token on the page gets an entry in INFO; spans refer to it by index.
    info = []

    def span(text: str, css: str, data: dict, visible_space: bool = False) -> str:
        info.append(data)
        shown = text.replace("\n", "\u21b5\n") if text.strip() or not text else text
        if visible_space:  # in the round rows: a space is a middle dot, a newline an arrow
            shown = text.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u2192")
        return (f'<span class="tok {css}" data-k="{len(info) - 1}">'
                f"{html.escape(shown) or '&nbsp;'}</span>")

    def drafted_info(k, i, d: DraftedToken) -> dict:
        return {"kind": f"draft token {i + 1} of round {k + 1}", "token": label(d.token), "id": d.token,
                "p": num(d.p), "q": num(d.q), "accept": num(d.accept_probability), "draw": num(d.draw),
                "verdict": d.verdict}

    def next_info(k, r: Round) -> dict:
        if r.next_source == FROM_TARGET:
            what = "a plain target step: nothing was drafted (only one token left to make, or no room)"
        else:
            what = ("correction: drawn from the residual norm(max(0, p - q))" if trace.temperature > 0
                    else "correction: the target's argmax") if r.next_source == FROM_CORRECTION else (
                "bonus: drawn from p after all drafts were accepted" if trace.temperature > 0
                else "bonus: the target's argmax after all drafts were accepted")
        return {"kind": f"target token of round {k + 1}", "token": label(r.next_token), "id": r.next_token,
                "p": num(r.next_p), "verdict": what,
                "from": [[label(t), num(v)] for t, v in r.candidates]}

    # 1. The text, coloured by provenance.
    text_parts = [f'<span class="prompt">{html.escape("".join(label(t) for t in trace.prompt))}</span>']
    for token, source, k, i in trace.output_tokens():
        r = trace.rounds[k]
        data = drafted_info(k, i, r.drafted[i]) if source == FROM_DRAFT else next_info(k, r)
        text_parts.append(span(label(token), source, data))

    # 2. One row per round.
    rows = []
    for k, r in enumerate(trace.rounds):
        chips = [span(label(d.token), "v-" + d.verdict.replace(" ", "-"), drafted_info(k, i, d), True)
                 for i, d in enumerate(r.drafted)]
        chips.append('<span class="arrow">&rarr;</span>')
        chips.append(span(label(r.next_token), r.next_source, next_info(k, r), True))
        rows.append(f'<tr class="round"><td class="n">{k + 1}</td><td class="n">{r.n_accepted}/'
                    f'{len(r.drafted)}</td><td class="chips">{"".join(chips)}</td></tr>')

    # 3. Acceptance by position vs alpha^i.
    chart = acceptance_chart(trace)

    alpha = trace.alpha
    settings = (f"gamma = {trace.gamma}, temperature = {trace.temperature:g}"
                + (f", top-k = {trace.top_k}" if trace.top_k else "")
                + (f", top-p = {trace.top_p}" if trace.top_p else ""))
    summary = (f"{len(trace.rounds)} rounds, {trace.tokens_out} tokens; "
               f"{trace.tokens_accepted} draft tokens accepted; alpha (accepted / judged) = "
               f"{'-' if alpha is None else f'{alpha:.3f}'}")
    return PAGE.format(
        title=html.escape(title), pair=html.escape(pair), settings=html.escape(settings),
        summary=html.escape(summary), text="".join(text_parts), rows="\n".join(rows), chart=chart,
        n_rounds=len(trace.rounds),
        info=json.dumps(info).replace("</", "<\\/"),
        greedy_note=("Greedy decoding: a draft token is accepted exactly when it is the target's "
                     "argmax; p and q are shown at temperature 1." if trace.temperature == 0 else
                     "Each draft token x was accepted if its uniform draw r &lt; min(1, p(x)/q(x))."))


def acceptance_chart(trace: Trace, width: int = 520, height: int = 240) -> str:
    """Inline SVG: measured acceptance at draft position i (bars, with the count of rounds) and
    alpha^i (dots and line), the i.i.d. prediction from the same run's alpha."""
    counts = trace.acceptance_by_position()
    alpha = trace.alpha
    if not counts or alpha is None:
        return "<p>No draft tokens were judged.</p>"
    left, bottom, top, right = 46, 34, 14, 14
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / len(counts)

    def y(v):
        return top + plot_h * (1 - v)

    parts = [f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="acceptance by draft position">']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    theory = []
    for i, (acc, drafted) in enumerate(counts):
        cx = left + slot * (i + 0.5)
        if drafted:
            rate = acc / drafted
            parts.append(f'<rect class="bar" x="{cx - slot * 0.3:.1f}" y="{y(rate):.1f}" width="{slot * 0.6:.1f}" '
                         f'height="{plot_h * rate:.1f}"><title>position {i + 1}: {acc} of {drafted} '
                         f'accepted ({rate:.2f})</title></rect>'
                         f'<text x="{cx:.1f}" y="{y(rate) - 4:.1f}" text-anchor="middle" class="small">'
                         f'{acc}/{drafted}</text>')
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 16}" text-anchor="middle">{i + 1}</text>')
        theory.append((cx, y(alpha ** (i + 1))))
    parts.append('<polyline class="theory" points="' + " ".join(f"{x:.1f},{v:.1f}" for x, v in theory) + '"/>')
    parts += [f'<circle class="theory" cx="{x:.1f}" cy="{v:.1f}" r="3.5"/>' for x, v in theory]
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">'
                 f'position i of the draft token in its round</text>')
    parts.append(f'<text transform="rotate(-90)" x="{-(top + plot_h / 2)}" y="12" text-anchor="middle">'
                 f'P(accepted)</text></svg>')
    legend = (f'<p class="legend"><span class="swatch bar"></span> measured: the i-th draft token of a '
              f'round was accepted (accepted/drafted over the rounds that drafted it) '
              f'<span class="swatch theory"></span> alpha<sup>i</sup> with alpha = {alpha:.3f}: the '
              f'i.i.d. theory (every token accepted independently with the same chance). Real '
              f'acceptance is not i.i.d.: easy stretches are accepted in long runs, hard ones fail early.</p>')
    return "".join(parts) + legend


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font: 15px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 26px 0 8px; }}
.meta {{ color: #555; margin: 2px 0; }}
#text {{ font: 14px/1.6 ui-monospace, monospace; white-space: pre-wrap; border: 1px solid #ddd;
        padding: 12px; border-radius: 6px; background: #fcfcfc; }}
.prompt {{ color: #777; }}
.tok {{ cursor: pointer; border-radius: 3px; white-space: pre-wrap; }}
.tok:hover, .tok.pinned {{ outline: 2px solid #333; }}
.draft {{ background: #c8f0c8; }} .target {{ background: #e0d4f5; }} .correction {{ background: #ffe49a; }} .bonus {{ background: #b8ecf2; }}
.v-accepted {{ background: #c8f0c8; }} .v-rejected {{ background: #f6b8b8; text-decoration: line-through; }}
.v-not-judged {{ background: #e4e4e4; color: #888; }}
table {{ border-collapse: collapse; font: 13px/1.5 ui-monospace, monospace; }}
td {{ padding: 3px 8px; border-bottom: 1px solid #eee; vertical-align: top; }}
td.n {{ text-align: right; color: #666; }} td.chips .tok {{ margin-right: 3px; padding: 0 2px; }}
.arrow {{ color: #999; margin: 0 4px; }}
#tip {{ position: fixed; display: none; background: #fff; border: 1px solid #888; border-radius: 6px;
       padding: 8px 10px; font: 13px/1.4 ui-monospace, monospace; box-shadow: 0 2px 8px #0003;
       max-width: 420px; white-space: pre-wrap; z-index: 10; }}
.legend {{ font-size: 13px; color: #444; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; vertical-align: -1px; margin: 0 3px 0 10px; }}
.swatch.bar, rect.bar {{ fill: #7aa6d6; background: #7aa6d6; }}
.swatch.theory {{ background: #d9534f; border-radius: 6px; }}
polyline.theory {{ fill: none; stroke: #d9534f; stroke-width: 2; }} circle.theory {{ fill: #d9534f; }}
line.grid {{ stroke: #ddd; }} svg text {{ font: 12px system-ui, sans-serif; fill: #444; }}
svg text.small {{ font-size: 10px; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="meta">{pair}</p>
<p class="meta">{settings}</p>
<p class="meta" id="summary">{summary}</p>

<h2>The text</h2>
<p class="legend">Grey: the prompt. <span class="tok draft">green</span>: a draft token the target
accepted. <span class="tok correction">yellow</span>: the target's token in place of a rejected one.
<span class="tok bonus">blue</span>: the target's bonus token after a fully accepted round. Hover or
click a token for its numbers.</p>
<div id="text">{text}</div>

<h2>Round by round</h2>
<p class="legend">{greedy_note} <span class="tok v-accepted">accepted</span>
<span class="tok v-rejected">rejected</span> <span class="tok v-not-judged">not judged</span> (after
a rejection the rest of the round's drafts are discarded), then &rarr; the target's token.</p>
<table id="rounds" data-rounds="{n_rounds}">
<tr><th>round</th><th>accepted</th><th>drafted tokens &rarr; target's token</th></tr>
{rows}
</table>

<h2>Acceptance by position</h2>
{chart}

<div id="tip" role="tooltip"></div>
<script id="info" type="application/json">{info}</script>
<script>
(function () {{
  const INFO = JSON.parse(document.getElementById("info").textContent);
  const tip = document.getElementById("tip");
  const fmt = (v) => (v === null || v === undefined) ? "-" : String(v);
  function describe(d) {{
    const lines = [d.kind, "token " + JSON.stringify(d.token) + "  (id " + d.id + ")"];
    if ("q" in d) {{
      lines.push("p(x) = " + fmt(d.p) + "   target", "q(x) = " + fmt(d.q) + "   draft",
                 "min(1, p/q) = " + fmt(d.accept), "draw r = " + fmt(d.draw), d.verdict);
    }} else {{
      lines.push("p(x) = " + fmt(d.p), d.verdict, "most likely there:");
      for (const [t, v] of d.from) lines.push("  " + JSON.stringify(t) + "  " + v);
    }}
    return lines.join("\\n");
  }}
  let pinned = null;
  function show(el, x, y) {{
    tip.textContent = describe(INFO[+el.dataset.k]);
    tip.style.display = "block";
    tip.style.left = Math.min(x + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
    tip.style.top = Math.min(y + 14, window.innerHeight - tip.offsetHeight - 8) + "px";
  }}
  document.addEventListener("mouseover", (e) => {{
    const el = e.target.closest(".tok[data-k]");
    if (el) show(el, e.clientX, e.clientY); else if (!pinned) tip.style.display = "none";
  }});
  document.addEventListener("click", (e) => {{
    const el = e.target.closest(".tok[data-k]");
    if (pinned) pinned.classList.remove("pinned");
    pinned = el;
    if (el) {{ el.classList.add("pinned"); show(el, e.clientX, e.clientY); }} else tip.style.display = "none";
  }});
}})();
</script>
</body></html>
"""


def iframe_html(trace: Trace, height: int = 700, **page_options) -> str:
    """The page inside an <iframe srcdoc=...>, for a notebook cell (IPython.display.HTML): its
    styles and script stay inside the frame instead of restyling the notebook."""
    page = render_html(trace, **page_options)
    return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: {height}px; '
            f'border: 1px solid #ccc; border-radius: 6px;"></iframe>')
