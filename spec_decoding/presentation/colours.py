"""The colour of each token's source, one set of names for the terminal, the trace page and the docs."""

from ..result import FROM_BONUS, FROM_CORRECTION, FROM_DRAFT, FROM_DRAFT_BRANCH, FROM_TARGET


# One set of colour names for where a token came from: the terminal (spec_decoding_generate.py), the
# trace page (spec_decoding/trace_page.py) and the docs all use these words.
SOURCE_COLOURS = {
    FROM_DRAFT: "green",  # a draft token the target accepted
    FROM_CORRECTION: "yellow",  # the target's correction of the first rejected draft token
    FROM_BONUS: "cyan",  # the target's bonus token after a fully accepted round
    FROM_DRAFT_BRANCH: "magenta",  # token trees: accepted from a side branch
    FROM_TARGET: "purple",  # a plain target step: nothing was drafted (e.g. the last token)
}
