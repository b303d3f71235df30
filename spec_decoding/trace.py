"""A per-round record of speculative decoding, and a web page that shows it.

    result = speculative_sampling(target, draft, prompt_ids, 60, gamma=4, trace=True)
    write_html(result.trace, "trace.html")        # one self-contained page: open it in a browser

For every round the trace keeps the drafted tokens with p(x) (the target's probability of each),
q(x) (the draft's), the acceptance probability min(1, p(x)/q(x)), the uniform draw r it was tested
with (accepted if r < p/q), the verdict, and the token the target added: a correction drawn from the
residual norm(max(0, p - q)) (its most likely tokens are kept), or a bonus drawn from p after an
all-accepted round. In greedy decoding (temperature 0) a draft token is accepted exactly when it is
the target's argmax; p and q are then shown at temperature 1 for information.

Token trees (tree_speculative_sampling(..., trace=True)) are traced too: every node of the round's
tree with its parent and depth, p(x) of the target after the node's parent, q(x) of the draft
there, and, for the children the walk down the tree judged, the acceptance probability the
multi-draft rule used and its draw; then the accepted path and the target's token.

The page: the text coloured by where each token came from (as the terminal does), one row per round
(hover or click a token to see its numbers; a tree is drawn with each node's children to its right),
and the measured acceptance at each draft position (a tree: each depth) next to alpha^i, what the
i.i.d. theory of Leviathan et al. predicts.
"""

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET
from .sampling import logits_to_probs

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
class TreeNode(DraftedToken):
    """A node of a token tree. p and q are at the node's parent (what the node was drafted from and
    is judged against). In sampling, siblings are tried in order and each rejection changes the
    target the next sibling faces: adjusted_p is that target's value p'(x) (p' = p for the first
    child), and accept_probability = min(1, p'(x)/q(x))."""

    parent: int  # the parent's node number; ROOT_NODE (-1): the round's root
    depth: int  # 1: a child of the root
    adjusted_p: float | None  # sampling, judged nodes: p'(x) after the earlier siblings' rejections


ROOT_NODE = -1  # as spec_decoding.tree.ROOT


@dataclass
class Round:
    drafted: list[DraftedToken]
    n_accepted: int
    next_token: int  # the target's token: a correction (after a rejection) or a bonus
    next_source: str  # FROM_CORRECTION, FROM_BONUS, or FROM_TARGET (nothing drafted: a plain step)
    next_p: float  # p of next_token in its row (before taking the residual)
    candidates: list[tuple[int, float]]  # what next_token was drawn from: its TOP tokens
    emitted: int  # tokens of this round that reached the output (eos / max_gen may cut some)

    @property
    def depth(self) -> int:
        """Draft positions of the round (a chain: its draft tokens)."""
        return len(self.drafted)

    def accepted(self) -> list[tuple[int, str]]:
        """(index in drafted, source) of the accepted draft tokens, in output order."""
        return [(i, FROM_DRAFT) for i in range(self.n_accepted)]


@dataclass
class TreeRound(Round):
    """A token tree's round: drafted holds TreeNodes, numbered level by level as in
    spec_decoding.tree.TokenTree; path is the accepted nodes from the root down."""

    root: int  # the token the tree hangs from: the sequence's last token
    path: list[int]
    tree_depth: int  # depths drafted (0: a plain target step)

    @property
    def depth(self) -> int:
        return self.tree_depth

    def accepted(self) -> list[tuple[int, str]]:
        """A node is FROM_DRAFT when it was its parent's first child (what a chain would have
        drafted), FROM_DRAFT_BRANCH otherwise (as spec_decoding.tree.output_sources)."""
        parents = [node.parent for node in self.drafted]
        return [(i, FROM_DRAFT if parents.index(parents[i]) == i else FROM_DRAFT_BRANCH) for i in self.path]


@dataclass
class Trace:
    prompt: list[int]
    gamma: int
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    rounds: list[Round] = field(default_factory=list)
    tokens_out: int = 0  # output tokens so far
    branching: tuple[int, ...] | None = None  # token trees: children per depth (gamma: the depth)

    # -- recording: one call per round, from the generators ---------------------------------------

    def record_sampled_round(self, draft_tokens: list[int], draft_probs: torch.Tensor,
                             target_probs: torch.Tensor, verdict, n_out: int) -> None:
        """draft_probs [g, V] q, target_probs [g + 1, V] p, verdict: rejection.Verdict;
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

    def record_tree_round(self, tree, target_logits: torch.Tensor, path: list[int], next_token: int,
                          draws: dict | None, n_out: int) -> None:
        """One round of tree_speculative_sampling. tree: its spec_decoding.tree.TokenTree (N nodes);
        target_logits [N + 1, V]: row 0 after the root, row 1 + i after node i; path: the accepted
        nodes; draws: node -> uniform draw, for the nodes judged (sampling; None when greedy)."""
        if self.temperature == 0:
            target_probs = torch.softmax(target_logits.float(), dim=-1)  # shown at temperature 1
            nodes, dist = greedy_tree_nodes(tree, target_probs, path)
        else:
            # the same p the rule used: the same function of the same logits
            target_probs = logits_to_probs(target_logits, self.temperature, self.top_k, self.top_p)
            nodes, dist = sampled_tree_nodes(tree, target_probs, path, draws)
        depth = max(tree.depths, default=0)
        stop = path[-1] if path else ROOT_NODE
        source = (FROM_TARGET if depth == 0 else FROM_BONUS if len(path) == depth else FROM_CORRECTION)
        self.rounds.append(TreeRound(
            nodes, len(path), next_token, source, float(target_probs[stop + 1, next_token]),
            top_candidates(dist), self._emitted(n_out), tree.root, list(path), depth))

    def _add_round(self, drafted, n, next_token, next_p, dist, n_out):
        source = (FROM_TARGET if not drafted else FROM_BONUS if n == len(drafted) else FROM_CORRECTION)
        self.rounds.append(Round(drafted, n, next_token, source, next_p, top_candidates(dist),
                                 self._emitted(n_out)))

    def _emitted(self, n_out: int) -> int:
        """Tokens the round added to the output (n_out: the output's length after it)."""
        emitted, self.tokens_out = n_out - self.tokens_out, n_out
        return emitted

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
        round was accepted, among rounds that drafted at least i tokens. For a tree, position i is
        depth i: how often the accepted path reached depth i, among rounds whose tree was that deep."""
        longest = max([self.gamma] + [r.depth for r in self.rounds])
        counts = [[0, 0] for _ in range(longest)]
        for r in self.rounds:
            for i in range(r.depth):
                counts[i][1] += 1
                counts[i][0] += i < r.n_accepted
        return [tuple(c) for c in counts]

    def output_tokens(self) -> list[tuple[int, str, int, int]]:
        """[(token, source, round index, index in round's drafted)] as in the output; the target's
        token has index len(drafted)."""
        out = []
        for k, r in enumerate(self.rounds):
            made = [(r.drafted[i].token, source, k, i) for i, source in r.accepted()]
            made.append((r.next_token, r.next_source, k, len(r.drafted)))
            out += made[:r.emitted]
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def top_candidates(dist: torch.Tensor) -> list[tuple[int, float]]:
    """dist [V] -> its TOP most likely tokens with their probabilities (zeros left out)."""
    top = dist.float().topk(min(TOP, dist.shape[-1]))
    return [(int(t), round(float(v), 6)) for t, v in zip(top.indices, top.values) if v > 0]


def greedy_tree_nodes(tree, target_probs: torch.Tensor, path: list[int]) -> tuple[list[TreeNode], torch.Tensor]:
    """Greedy: every child of the root and of each accepted node was compared with the target's
    argmax there (accepted: it is the argmax; rejected: it is not); the rest were never judged.
    target_probs [N + 1, V]: p at temperature 1, shown for information.
    Returns the nodes and the distribution at the stop node the target's token came from ([V])."""
    visited = [ROOT_NODE] + path
    nodes = []
    for i, (x, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        judged = parent in visited
        verdict = ACCEPTED if i in path else REJECTED if judged else UNJUDGED
        nodes.append(TreeNode(x, float(target_probs[parent + 1, x]), None,
                              {ACCEPTED: 1.0, REJECTED: 0.0, UNJUDGED: None}[verdict], None, verdict,
                              parent, depth, None))
    return nodes, target_probs[visited[-1] + 1]


def sampled_tree_nodes(tree, target_probs: torch.Tensor, path: list[int],
                       draws: dict) -> tuple[list[TreeNode], torch.Tensor]:
    """Sampling: at the root and at each accepted node the children were tried in order with
    SpecInfer's rule: child x against p'(x) / q(x), where p' starts as p and becomes
    norm(max(0, p' - q)) after each rejection. Recomputed here from p, q and the draws (the nodes
    in draws are the ones judged). target_probs [N + 1, V].
    Returns the nodes and the distribution the target's token came from ([V]): the last p' at the
    stop node after a rejection, p there after a leaf (the bonus)."""
    from .rejection import residual_distribution

    adjusted, final = {}, None
    for node in [ROOT_NODE] + path:
        residual = target_probs[node + 1]
        q = tree.draft_probs.get(node)
        for child in tree.children(node):
            if child not in draws:
                break  # an earlier sibling was accepted: the rest were never tried
            adjusted[child] = float(residual[tree.tokens[child]])
            if child not in path:
                residual = residual_distribution(residual, q)
        final = residual  # at the stop node: p' after all its children's rejections (or p at a leaf)
    nodes = []
    for i, (x, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        p, q = float(target_probs[parent + 1, x]), float(tree.draft_probs[parent][x])
        verdict = ACCEPTED if i in path else REJECTED if i in draws else UNJUDGED
        accept = min(1.0, adjusted[i] / q) if i in adjusted else None
        nodes.append(TreeNode(x, p, q, accept, draws.get(i), verdict, parent, depth, adjusted.get(i)))
    return nodes, final


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
            parent = ("the root" if d.parent == ROOT_NODE else f"node {d.parent + 1}") + " " + json.dumps(
                label(r.root if d.parent == ROOT_NODE else r.drafted[d.parent].token))
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
        data = drafted_info(k, i, r.drafted[i]) if source == FROM_DRAFT else next_info(k, r)
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
        stop = r.path[-1] if r.path else ROOT_NODE

        def subtree(node: int) -> str:
            kids = [subtree(c) for c, d in enumerate(r.drafted) if d.parent == node]
            if node == stop:
                kids.append(f'<div class="node">{target_chip(k, r)}</div>')
            chip = (f'<span class="root" title="the root: the last token of the sequence">'
                    f'{html.escape(visible(label(r.root)))}</span>'
                    if node == ROOT_NODE else node_chip(k, node, r.drafted[node]))
            return f'<div class="node">{chip}<div class="kids">{"".join(kids)}</div></div>'

        return f'<div class="tree">{subtree(ROOT_NODE)}</div>'

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
        rule_note=(TREE_GREEDY_NOTE if trace.temperature == 0 else TREE_SAMPLING_NOTE) if tree else (
            "Greedy decoding: a draft token is accepted exactly when it is the target's "
            "argmax; p and q are shown at temperature 1." if trace.temperature == 0 else
            "Each draft token x was accepted if its uniform draw r &lt; min(1, p(x)/q(x))."),
        verdicts_note=TREE_VERDICTS_NOTE if tree else CHAIN_VERDICTS_NOTE,
        accepted_header="accepted depth" if tree else "accepted",
        drafted_header=("the draft tree (each node's children to its right, tried top to bottom) "
                        "&rarr; the target's token" if tree else "drafted tokens &rarr; target's token"),
        chart_title="Acceptance by depth" if tree else "Acceptance by position")


BRANCH_LEGEND = ('<span class="tok draft_branch">pink</span>: a draft token accepted from a side '
                 "branch of the tree (not its parent's first child: where a chain would have stopped).")
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
<p class="legend">Grey: the prompt. <span class="tok draft">green</span>: a draft token the target
accepted. <span class="tok correction">yellow</span>: the target's token in place of a rejected one.
<span class="tok bonus">blue</span>: the target's bonus token after a fully accepted round.
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
