"""The web page of a trace (spec_decoding.presentation.trace): one self-contained HTML file.

    result = speculative_sampling(target, draft, prefix, 60, gamma=4, observers=Observers(trace=True))
    write_html(result.trace, "trace.html")        # open it in a browser

The page: the text coloured by where each token came from (as the terminal does), one row per round
(hover or click a token to see its numbers; a tree is drawn with each node's children to its right),
and the measured acceptance at each draft position (a tree: each depth) next to alpha^i, what the
i.i.d. theory of Leviathan et al. predicts.
"""

import html
import json
from pathlib import Path

from gpt2.tokenizer import decode as gpt2_decode
from ..result import FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET, ROOT
from .colours import SOURCE_COLOURS
from .trace import DraftedToken, Round, Trace, TreeNode, TreeRound


def gpt2_token_text(token: int) -> str:
    """One token's text by GPT-2's tokenizer: the page's default decode."""
    return gpt2_decode([token])


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
    decode = decode or gpt2_token_text

    def label(t: int) -> str:
        return decode(t)

    def num(x):
        return None if x is None else f"{x:.4g}"  # 4 significant digits, as text

    # Every token on the page gets an entry in INFO; spans refer to it by index.
    info = []

    def visible(text: str) -> str:  # in the round rows: a space is a middle dot, a newline an arrow
        return text.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u2192")

    def span(text: str, css: str, data: dict, visible_space: bool = False, attrs: str = "") -> str:
        info.append(data)
        shown = text.replace("\n", "\u21b5\n") if text.strip() or not text else text
        if visible_space:
            shown = visible(text)
        return (f'<span class="tok {css}" data-k="{len(info) - 1}"{attrs}>'
                f"{html.escape(shown) or '&nbsp;'}</span>")

    def drafted_info(k, i, d: DraftedToken) -> dict:
        data = {"kind": f"draft token {i + 1} of round {k + 1}", "token": label(d.token), "id": d.token,
                "p": num(d.p), "q": num(d.q), "accept": num(d.accept_probability), "draw": num(d.draw),
                "verdict": d.verdict}
        if isinstance(d, TreeNode):
            r = trace.rounds[k]
            parent = ("the root" if d.parent == ROOT else f"node {d.parent + 1}") + " " + json.dumps(
                label(r.root if d.parent == ROOT else r.drafted[d.parent].token))
            data["kind"] = f"tree node {i + 1} of round {k + 1}: depth {d.depth}, a child of {parent}"
            if trace.temperature > 0:
                data["adjusted"] = num(d.adjusted_p)  # the target this child was tested against
            else:
                data["rule"] = "argmax match"
        return data

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
        data = drafted_info(k, i, r.drafted[i]) if source in (FROM_DRAFT, FROM_DRAFT_BRANCH) else next_info(k, r)
        text_parts.append(span(label(token), source, data))

    # 2. One row per round.
    def node_chip(k, i, d: DraftedToken) -> str:
        attrs = f' data-node="{i}"' if isinstance(d, TreeNode) else ""  # the node's number in its tree
        return span(label(d.token), "v-" + d.verdict.replace(" ", "-"), drafted_info(k, i, d), True, attrs)

    def target_chip(k, r: Round) -> str:
        return '<span class="arrow">&rarr;</span>' + span(label(r.next_token), r.next_source, next_info(k, r), True)

    def tree_chips(k, r: TreeRound) -> str:
        """The tree drawn left to right: each node, then its children stacked to its right; the
        target's token hangs from the last accepted node (or the root)."""
        stop = r.path[-1] if r.path else ROOT

        def subtree(node: int) -> str:
            kids = [subtree(c) for c, d in enumerate(r.drafted) if d.parent == node]
            if node == stop:
                kids.append(f'<div class="node">{target_chip(k, r)}</div>')
            chip = (f'<span class="root" title="the root: the last token of the sequence">'
                    f'{html.escape(visible(label(r.root)))}</span>'
                    if node == ROOT else node_chip(k, node, r.drafted[node]))
            return f'<div class="node">{chip}<div class="kids">{"".join(kids)}</div></div>'

        return f'<div class="tree">{subtree(ROOT)}</div>'

    rows = []
    for k, r in enumerate(trace.rounds):
        if isinstance(r, TreeRound):
            chips = tree_chips(k, r)
        else:
            chips = "".join(node_chip(k, i, d) for i, d in enumerate(r.drafted)) + target_chip(k, r)
        rows.append(f'<tr class="round"><td class="n">{k + 1}</td><td class="n">{r.n_accepted}/'
                    f'{r.depth}</td><td class="chips">{chips}</td></tr>')

    # 3. Acceptance by position vs alpha^i.
    chart = acceptance_chart(trace)

    alpha = trace.alpha
    tree = trace.branching is not None
    shape = (f"token tree {','.join(map(str, trace.branching))} (children per depth; depth {trace.gamma})"
             if tree else f"gamma = {trace.gamma}")
    settings = (f"{shape}, temperature = {trace.temperature:g}"
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
        branch_legend=BRANCH_LEGEND if tree else "",
        **{f"colour_{source}": name for source, name in SOURCE_COLOURS.items()},
        rule_note=(TREE_GREEDY_NOTE if trace.temperature == 0 else TREE_SAMPLING_NOTE) if tree else (
            "Greedy decoding: a draft token is accepted exactly when it is the target's "
            "argmax; p and q are shown at temperature 1." if trace.temperature == 0 else
            "Each draft token x was accepted if its uniform draw r &lt; min(1, p(x)/q(x))."),
        verdicts_note=TREE_VERDICTS_NOTE if tree else CHAIN_VERDICTS_NOTE,
        accepted_header="accepted depth" if tree else "accepted",
        drafted_header=("the draft tree (each node's children to its right, tried top to bottom) "
                        "&rarr; the target's token" if tree else "drafted tokens &rarr; target's token"),
        chart_title="Acceptance by depth" if tree else "Acceptance by position")


BRANCH_LEGEND = (f'<span class="tok draft_branch">{SOURCE_COLOURS[FROM_DRAFT_BRANCH]}</span>: a draft token '
                 "accepted from a side branch of the tree (not its parent's first child: where a chain would "
                 "have stopped).")
CHAIN_VERDICTS_NOTE = ("(after a rejection the rest of the round's drafts are discarded), then &rarr; "
                       "the target's token.")
TREE_VERDICTS_NOTE = ("(below a rejected node, or after an accepted sibling, nothing is judged); the "
                      "target's token (&rarr;) hangs from the last accepted node.")
TREE_GREEDY_NOTE = ("Greedy decoding: from the root down, a child is accepted exactly when it is the "
                    "target's argmax after its parent (siblings are distinct, so at most one is); p is "
                    "shown at temperature 1.")
TREE_SAMPLING_NOTE = ("SpecInfer's multi-draft rejection sampling: from the root down, a node's children "
                      "(drawn independently from q) are tried top to bottom; child x is accepted if its "
                      "draw r &lt; min(1, p'(x)/q(x)), where p' is p for the first child and becomes "
                      "norm(max(0, p' - q)) after each rejected sibling. If all are rejected, the "
                      "target's token is drawn from the last p'.")


def acceptance_chart(trace: Trace, width: int = 520, height: int = 240) -> str:
    """Inline SVG: measured acceptance at draft position i (bars, with the count of rounds) and
    alpha^i (dots and line), the i.i.d. prediction from the same run's alpha. For a token tree,
    position i is depth i: how often the accepted path reached it."""
    counts = trace.acceptance_by_position()
    alpha = trace.alpha
    where, unit = ("depth", "depth") if trace.branching is not None else ("position", "token")
    if not counts or alpha is None:
        return "<p>No draft tokens were judged.</p>"
    left, bottom, top, right = 46, 34, 14, 14
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / len(counts)

    def y(v):
        return top + plot_h * (1 - v)

    parts = [f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="acceptance by draft {where}">']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    theory = []
    for i, (acc, drafted) in enumerate(counts):
        cx = left + slot * (i + 0.5)
        if drafted:
            rate = acc / drafted
            parts.append(f'<rect class="bar" x="{cx - slot * 0.3:.1f}" y="{y(rate):.1f}" width="{slot * 0.6:.1f}" '
                         f'height="{plot_h * rate:.1f}"><title>{where} {i + 1}: {acc} of {drafted} '
                         f'accepted ({rate:.2f})</title></rect>'
                         f'<text x="{cx:.1f}" y="{y(rate) - 4:.1f}" text-anchor="middle" class="small">'
                         f'{acc}/{drafted}</text>')
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 16}" text-anchor="middle">{i + 1}</text>')
        theory.append((cx, y(alpha ** (i + 1))))
    parts.append('<polyline class="theory" points="' + " ".join(f"{x:.1f},{v:.1f}" for x, v in theory) + '"/>')
    parts += [f'<circle class="theory" cx="{x:.1f}" cy="{v:.1f}" r="3.5"/>' for x, v in theory]
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 4}" text-anchor="middle">'
                 + ("depth i in the round's tree" if where == "depth" else
                    "position i of the draft token in its round") + '</text>')
    parts.append(f'<text transform="rotate(-90)" x="{-(top + plot_h / 2)}" y="12" text-anchor="middle">'
                 f'P(accepted)</text></svg>')
    if where == "depth":
        measured = ("the round's accepted path reached depth i (reached/drafted over the rounds whose "
                    "tree was that deep)")
        alpha_is = "; here alpha = depths reached / depths judged"
    else:
        measured = ("the i-th draft token of a round was accepted (accepted/drafted over the rounds "
                    "that drafted it)")
        alpha_is = ""
    legend = (f'<p class="legend"><span class="swatch bar"></span> measured: {measured} '
              f'<span class="swatch theory"></span> alpha<sup>i</sup> with alpha = {alpha:.3f}: the '
              f'i.i.d. theory (every {unit} accepted independently with the same chance{alpha_is}). Real '
              f'acceptance is not i.i.d.: easy stretches are accepted in long runs, hard ones fail early.</p>')
    return "".join(parts) + legend


# In every page's head: a later run may replace a page it finds marked so (its own earlier output),
# and nothing else without asking.
GENERATOR_MARK = '<meta name="generator" content="spec_decoding.presentation.trace_page">'


def is_trace_page(path) -> bool:
    """Whether the file at path is a page write_html wrote (its head carries GENERATOR_MARK)."""
    try:
        with open(path, "rb") as f:
            return GENERATOR_MARK.encode() in f.read(4096)
    except OSError:
        return False


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="spec_decoding.presentation.trace_page">
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
.draft_branch {{ background: #f3c6ee; }}
.tree .node {{ display: flex; align-items: flex-start; }} .tree .kids {{ display: flex; flex-direction: column; }}
.tree .kids:not(:empty) {{ border-left: 1px solid #ccc; margin: 0 2px 2px 4px; padding-left: 3px; }}
.tree .tok {{ margin-bottom: 2px; }} .root {{ color: #777; padding: 0 2px; }}
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
<p class="legend">Grey: the prompt. <span class="tok draft">{colour_draft}</span>: a draft token the target
accepted. <span class="tok correction">{colour_correction}</span>: the target's token in place of a rejected one.
<span class="tok bonus">{colour_bonus}</span>: the target's bonus token after a fully accepted round.
<span class="tok target">{colour_target}</span>: a plain target step, nothing drafted (the last token, when
the window or max_gen left room for only one).
{branch_legend} Hover or click a token for its numbers.</p>
<div id="text">{text}</div>

<h2>Round by round</h2>
<p class="legend">{rule_note} <span class="tok v-accepted">accepted</span>
<span class="tok v-rejected">rejected</span> <span class="tok v-not-judged">not judged</span>
{verdicts_note}</p>
<table id="rounds" data-rounds="{n_rounds}">
<tr><th>round</th><th>{accepted_header}</th><th>{drafted_header}</th></tr>
{rows}
</table>

<h2>{chart_title}</h2>
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
    if ("adjusted" in d) {{  // a child in a sampled tree: tested against p' (p after earlier siblings' rejections)
      lines.push("p(x) = " + fmt(d.p) + "   target", "p'(x) = " + fmt(d.adjusted) +
                 "   target after the earlier siblings' rejections", "q(x) = " + fmt(d.q) + "   draft",
                 "min(1, p'/q) = " + fmt(d.accept), "draw r = " + fmt(d.draw), d.verdict);
    }} else if ("q" in d) {{
      lines.push("p(x) = " + fmt(d.p) + "   target", "q(x) = " + fmt(d.q) + "   draft",
                 (d.rule || "min(1, p/q)") + " = " + fmt(d.accept), "draw r = " + fmt(d.draw), d.verdict);
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
