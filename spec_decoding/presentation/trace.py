"""A per-round record of speculative decoding (the page that shows it: spec_decoding.presentation.trace_page).

    result = speculative_sampling(target, draft, prefix, 60, gamma=4, observers=Observers(trace=True))
    write_html(result.trace, "trace.html")        # spec_decoding.presentation.trace_page: open it in a browser

The generators never call the trace: with Observers(trace=True) a Trace subscribes to their rounds as an
observer (spec_decoding.algorithms.decoding.round_observers), and each round's RoundReport
(spec_decoding.result) carries what the rejection step decided. Nothing is recomputed here.

For every round the trace keeps the drafted tokens with p(x) (the target's probability of each),
q(x) (the draft's), the acceptance probability min(1, p(x)/q(x)), the uniform draw r it was tested
with (accepted if r < p/q), the verdict, and the token the target added: a correction drawn from the
residual norm(max(0, p - q)) (its most likely tokens are kept), or a bonus drawn from p after an
all-accepted round. In greedy decoding (temperature 0) a draft token is accepted exactly when it is
the target's argmax; p and q are then shown at temperature 1 for information.

Token trees (tree_speculative_sampling(..., observers=Observers(trace=True))) are traced too: every node of the round's
tree with its parent and depth, p(x) of the target after the node's parent, q(x) of the draft
there, and, for the children the walk down the tree judged, the acceptance probability the
multi-draft rule used and its draw; then the accepted path and the target's token.

In a REPL: `result.trace` shows one line (rounds, tokens, alpha); `print(result.trace.rounds[3])`
explains that round, a line per drafted token with its text beside its id; `trace.explain()` all
of them. A field is None exactly where it has no meaning: `draw` and `accept_probability` for a
draft token the target never judged (and `draw` in greedy decoding, which draws nothing).
"""

from dataclasses import asdict, dataclass, field

import torch

from gpt2.tokenizer import decode as gpt2_decode

from ..result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET, ROOT, RoundReport

ACCEPTED, REJECTED, UNJUDGED = "accepted", "rejected", "not judged"
TOP = 5  # tokens kept of the residual / of p for the target's token
GPT2_VOCAB_SIZE = 50257  # a model of this vocabulary speaks GPT-2's tokens: its ids are shown as text
SOURCE_NAMES = {FROM_CORRECTION: "a correction, drawn from the residual norm(max(0, p - q))",
                FROM_BONUS: "a bonus token, drawn from p after every draft token was accepted",
                FROM_TARGET: "a plain target step (nothing was drafted), drawn from p"}


def token_label(token: int, vocab_size: int | None) -> str:
    """A token for people: its text and id (' the' #262) for GPT-2's vocabulary, #id otherwise."""
    if vocab_size == GPT2_VOCAB_SIZE:
        return f"{gpt2_decode([token])!r} #{token}"
    return f"#{token}"


def number(value: float | None) -> str:
    """A probability for people: 3 decimals, or 2 significant digits when smaller than 0.001."""
    if value is None:
        return "-"
    return f"{value:.3f}" if value == 0 or value >= 0.001 else f"{value:.1e}"


@dataclass
class DraftedToken:
    """One draft token of a round and how the target judged it (accepted if draw < accept_probability)."""

    token: int
    p: float  # the target's p(x) at this position
    q: float | None  # the draft's q(x) (1.0 for a point-mass proposal; None in greedy without q)
    accept_probability: float | None  # min(1, p/q); greedy: 1 if x is the target's argmax, else 0;
    #                                   None: never judged
    draw: float | None  # the uniform r it was tested with; None: never judged, or greedy (no draw)
    verdict: str  # ACCEPTED, REJECTED or UNJUDGED (after an earlier rejection in the round)


@dataclass
class TreeNode(DraftedToken):
    """A node of a token tree. p and q are at the node's parent (what the node was drafted from and
    is judged against). In sampling, siblings are tried in order and each rejection changes the
    target the next sibling faces: adjusted_p is that target's value p'(x) (p' = p for the first
    child), and accept_probability = min(1, p'(x)/q(x))."""

    parent: int  # the parent's node number; ROOT (-1): the round's root
    depth: int  # 1: a child of the root
    adjusted_p: float | None  # sampling, judged nodes: p'(x) after the earlier siblings' rejections



@dataclass(repr=False)
class Round:
    """One round: the drafted tokens with p(x), q(x), min(1, p/q), the draw and the verdict of each,
    then the target's own token. print(round) explains it line by line; repr is one line.

    Two probabilities of the target's token, which differ after a rejection: next_p is p(x), the
    target's probability of it in its row; next_from_p is its probability in the distribution it
    was actually drawn from (candidates): after a rejection the residual norm(max(0, p - q)), which
    moves p's mass away from what the draft over-proposed, so next_from_p is usually larger. After
    a fully accepted round (a bonus) or a plain step both are p(x). In greedy decoding the token is
    the argmax and both are p(x) at temperature 1, shown for information.
    """

    drafted: list[DraftedToken]
    n_accepted: int
    next_token: int  # the target's token: a correction (after a rejection) or a bonus
    next_source: str  # FROM_CORRECTION, FROM_BONUS, or FROM_TARGET (nothing drafted: a plain step)
    next_p: float  # p(next_token): the target's probability of it in its row, before any residual
    next_from_p: float  # its probability in the distribution it was drawn from (the residual after a rejection)
    candidates: list[tuple[int, float]]  # what next_token was drawn from: its TOP tokens
    emitted: int  # tokens of this round that reached the output (eos / max_gen may cut some)
    vocab_size: int | None = field(default=None, kw_only=True)  # the models' (GPT-2's: tokens shown as text)

    @property
    def depth(self) -> int:
        """Draft positions of the round (a chain: its draft tokens)."""
        return len(self.drafted)

    def accepted(self) -> list[tuple[int, str]]:
        """(index in drafted, source) of the accepted draft tokens, in output order."""
        return [(i, FROM_DRAFT) for i in range(self.n_accepted)]

    def label(self, token: int) -> str:
        return token_label(token, self.vocab_size)

    def __repr__(self) -> str:
        drafted = " ".join(self.label(d.token) for d in self.drafted) or "nothing"
        return (f"<{type(self).__name__}: drafted {drafted}; {self.n_accepted} accepted; then "
                f"{self.label(self.next_token)} ({self.next_source})>")

    def __str__(self) -> str:
        return self.explain()

    def explain(self) -> str:
        """The round in words: one line per drafted token (p(x), q(x), min(1, p/q), the draw, the
        verdict), then the target's token, what it was drawn from and with which probability."""
        lines = [f"{len(self.drafted)} drafted, {self.n_accepted} accepted; then the target's token."]
        if self.drafted:
            lines.append(f"  {'':8} {'token':24} {'p(x)':>7} {'q(x)':>7} {'min(1,p/q)':>10} {'draw':>6}  verdict")
        for i, d in enumerate(self.drafted):
            lines.append(f"  {self.row_name(i):8} {self.label(d.token):24} {number(d.p):>7} {number(d.q):>7} "
                         f"{number(d.accept_probability):>10} {number(d.draw):>6}  {d.verdict}")
        lines.append(f"  target's token: {self.label(self.next_token)}, {SOURCE_NAMES[self.next_source]}; "
                     f"p(x) = {number(self.next_p)}, {number(self.next_from_p)} in what it was drawn from:")
        lines.append("    " + ", ".join(f"{self.label(t)} {number(v)}" for t, v in self.candidates))
        if self.emitted < self.n_accepted + 1:
            lines.append(f"  only {self.emitted} of these {self.n_accepted + 1} tokens reached the "
                         f"output (max_gen or <|endoftext|> ended it)")
        return "\n".join(lines)

    def row_name(self, i: int) -> str:
        return f"{i + 1}."


@dataclass(repr=False)
class TreeRound(Round):
    """A token tree's round: drafted holds TreeNodes, numbered level by level as in
    spec_decoding.drafters.token_tree.TokenTree; path is the accepted nodes from the root down."""

    root: int  # the token the tree hangs from: the sequence's last token
    path: list[int]
    tree_depth: int  # depths drafted (0: a plain target step)

    @property
    def depth(self) -> int:
        return self.tree_depth

    def accepted(self) -> list[tuple[int, str]]:
        """A node is FROM_DRAFT when it was its parent's first child (what a chain would have
        drafted), FROM_DRAFT_BRANCH otherwise (as spec_decoding.algorithms.tree.output_sources)."""
        parents = [node.parent for node in self.drafted]
        return [(i, FROM_DRAFT if parents.index(parents[i]) == i else FROM_DRAFT_BRANCH) for i in self.path]

    def row_name(self, i: int) -> str:
        """Node i, indented by its depth."""
        return f"{'  ' * (self.drafted[i].depth - 1)}n{i}"


@dataclass(repr=False)
class Trace:
    prompt: list[int]
    gamma: int
    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    rounds: list[Round] = field(default_factory=list)
    tokens_out: int = 0  # output tokens so far
    branching: tuple[int, ...] | None = None  # token trees: children per depth (gamma: the depth)

    def __repr__(self) -> str:
        alpha = "-" if self.alpha is None else f"{self.alpha:.2f}"
        shape = f"tree {','.join(map(str, self.branching))}" if self.branching else f"gamma {self.gamma}"
        return (f"<Trace: {len(self.rounds)} rounds, {self.tokens_out} tokens, alpha {alpha}; {shape}, "
                f"temperature {self.temperature:g}. print(trace.rounds[i]) explains round i>")

    def explain(self) -> str:
        """Every round, explained (see Round.explain)."""
        return "\n\n".join(f"Round {k}: {r.explain()}" for k, r in enumerate(self.rounds))

    # -- recording: an observer of the generators' rounds ------------------------------------------

    def __call__(self, report: RoundReport) -> None:
        """Record one round (the generators call this through their observers)."""
        if report.tree is not None:
            self.record_tree_round(report)
        elif report.temperature == 0:
            self.record_greedy_round(report)
        else:
            self.record_sampled_round(report)

    def record_sampled_round(self, report: RoundReport) -> None:
        """A chain, sampled: report.draft_probs [g, V] q, report.target_probs [g + 1, V] p,
        report.verdict the rejection.Verdict."""
        verdict, target_probs = report.verdict, report.target_probs
        n = verdict.n_accepted
        drafted = []
        for i, x in enumerate(report.draft_tokens):
            p, q = float(target_probs[i, x]), float(report.draft_probs[i, x])
            judged = i < len(verdict.uniforms)  # tested: the accepted ones and the first rejected one
            drafted.append(DraftedToken(
                x, p, q, (min(1.0, p / q) if q > 0 else 1.0) if judged else None,
                verdict.uniforms[i] if judged else None,
                ACCEPTED if i < n else REJECTED if i == n else UNJUDGED))
        dist = verdict.residual if verdict.residual is not None else target_probs[n]
        self._add_round(drafted, n, verdict.next_token, float(target_probs[n, verdict.next_token]),
                        dist, report.n_out, target_probs.shape[-1])

    def record_greedy_round(self, report: RoundReport) -> None:
        """A chain, greedy: the target's argmax decides, p is shown at temperature 1."""
        n_accepted = report.n_accepted
        p = torch.softmax(report.target_logits.float(), dim=-1)
        drafted = []
        for i, x in enumerate(report.draft_tokens):
            judged = i <= n_accepted
            drafted.append(DraftedToken(
                x, float(p[i, x]), None, 1.0 if i < n_accepted else 0.0 if judged else None,
                None, ACCEPTED if i < n_accepted else REJECTED if i == n_accepted else UNJUDGED))
        self._add_round(drafted, n_accepted, report.next_token, float(p[n_accepted, report.next_token]),
                        p[n_accepted], report.n_out, p.shape[-1])

    def record_tree_round(self, report: RoundReport) -> None:
        """A token tree's round: report.tree (N nodes), report.target_logits [N + 1, V] (row 0 after
        the root, row 1 + i after node i), report.verdict the tree.TreeVerdict of its walk."""
        tree, verdict = report.tree, report.verdict
        path = verdict.path
        if self.temperature == 0:
            target_probs = torch.softmax(report.target_logits.float(), dim=-1)  # shown at temperature 1
            nodes, dist = greedy_tree_nodes(tree, target_probs, path)
        else:
            target_probs = report.target_probs  # the p the rule used
            nodes, dist = sampled_tree_nodes(tree, target_probs, verdict)
        depth = max(tree.depths, default=0)
        stop = path[-1] if path else ROOT
        source = (FROM_TARGET if depth == 0 else FROM_BONUS if len(path) == depth else FROM_CORRECTION)
        self.rounds.append(TreeRound(
            nodes, len(path), verdict.next_token, source, float(target_probs[stop + 1, verdict.next_token]),
            float(dist[verdict.next_token]), top_candidates(dist), self._emitted(report.n_out), tree.root,
            list(path), depth, vocab_size=target_probs.shape[-1]))

    def _add_round(self, drafted, n, next_token, next_p, dist, n_out, vocab_size):
        source = (FROM_TARGET if not drafted else FROM_BONUS if n == len(drafted) else FROM_CORRECTION)
        self.rounds.append(Round(drafted, n, next_token, source, next_p, float(dist[next_token]),
                                 top_candidates(dist), self._emitted(n_out), vocab_size=vocab_size))

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
    visited = [ROOT] + path
    nodes = []
    for i, (x, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        judged = parent in visited
        verdict = ACCEPTED if i in path else REJECTED if judged else UNJUDGED
        nodes.append(TreeNode(x, float(target_probs[parent + 1, x]), None,
                              {ACCEPTED: 1.0, REJECTED: 0.0, UNJUDGED: None}[verdict], None, verdict,
                              parent, depth, None))
    return nodes, target_probs[visited[-1] + 1]


def sampled_tree_nodes(tree, target_probs: torch.Tensor, verdict) -> tuple[list[TreeNode], torch.Tensor]:
    """Sampling: at the root and at each accepted node the children were tried in order with
    SpecInfer's rule: child x against p'(x) / q(x), where p' starts as p and becomes
    norm(max(0, p' - q)) after each rejection. verdict: the tree.TreeVerdict of the walk, which
    kept each judged node's draw and p'(x); target_probs [N + 1, V].
    Returns the nodes and the distribution the target's token came from ([V]): the last p' at the
    stop node after a rejection, p there after a leaf (the bonus)."""
    nodes = []
    for i, (x, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        p, q = float(target_probs[parent + 1, x]), float(tree.draft_probs[parent][x])
        judged = ACCEPTED if i in verdict.path else REJECTED if i in verdict.draws else UNJUDGED
        adjusted = verdict.adjusted_p.get(i)
        accept = None if adjusted is None else min(1.0, adjusted / q)
        nodes.append(TreeNode(x, p, q, accept, verdict.draws.get(i), judged, parent, depth, adjusted))
    return nodes, verdict.next_distribution
