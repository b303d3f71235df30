"""Token trees: what a tree drafter proposes, draft tokens as a tree under the sequence's last
token (spec_decoding.algorithms.tree verifies them), and how a tree's shape is written."""

from dataclasses import dataclass, field

from ..result import ROOT


@dataclass
class TokenTree:
    """Draft tokens as a tree under the root (the sequence's last token, already decided).

    Nodes are numbered level by level: all of depth 1, then all of depth 2, ... Node i holds the
    token tokens[i]; parents[i] is its parent's number (ROOT = -1 for depth 1), depths[i] its
    depth (1 under the root). draft_probs[n] is the q that node n's children were drawn from
    ([V], n = ROOT for the root's children; empty when greedy, where children are top-b).
    """

    root: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    draft_probs: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(1 if parent == ROOT else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def children(self, node: int) -> list[int]:
        """The node numbers under `node` (ROOT for the root), in the order they were drafted."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path_tokens(self, path: list[int]) -> list[int]:
        return [self.tokens[i] for i in path]


def tree_size(branching) -> int:
    """Draft nodes of a tree: (2, 2, 1) has 2 + 2*2 + 2*2*1 = 10."""
    total, width = 0, 1
    for b in branching:
        width *= b
        total += width
    return total


def check_branching(branching, vocab_size: int) -> tuple[int, ...]:
    if isinstance(branching, int) or not hasattr(branching, "__len__") or len(branching) == 0:
        raise ValueError(f"branching must be a non-empty tuple of children per depth, like (2, 2, 1); "
                         f"got {branching!r}")
    for b in branching:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= vocab_size:
            raise ValueError(f"branching {tuple(branching)!r}: each entry is the number of children per "
                             f"node at that depth, an int between 1 and the vocabulary size {vocab_size}")
    return tuple(branching)


def parse_branching(text: str) -> tuple[int, ...]:
    """"2,2,1" -> (2, 2, 1), for command lines. ValueError with what is expected otherwise."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise ValueError(f"a tree is its children per depth, whole numbers >= 1 separated by "
                         f"commas (like 2,2,1); got {text!r}")
    return values


def branching_label(branching) -> str:
    return ",".join(map(str, branching))
