"""Has the generated text fallen into a loop? A measure for the tables that report speed-ups.

Small models under greedy decoding often repeat themselves: a line over and over, or a run of
spaces. The draft predicts such a loop as well as the target does, so every draft token is accepted
and the speed-up looks large; it measures the loop, not the drafter. loop_share says how much of a
generated text is such a repetition, and looped() flags a text that is mostly one.

The measure is a period detector. GPT-2's tokenizer writes indentation as one space token per
space, so ordinary code is full of short runs of one token; runs are therefore taken as units
first (a run of one token repeated k times is one unit of k tokens; two units are equal when both
their token and their length are). A token is covered when it lies
  * in a stretch where the units repeat themselves with one period p (2 .. MAX_PERIOD units) at
    least once in full: unit[i] == unit[i - p] for p or more units in a row, with the copy they
    repeat (a repeated line, '\\n' + 8 spaces again and again), or
  * in a run of one token MAX_RUN or more long (a line of nothing but spaces).
loop_share is the largest share of the tokens covered so, over the periods. Ordinary text and code
repeat a whole line right after itself only now and then, so their share stays small.
"""

# A text is "looped" when repetition covers at least half of its tokens: then most of its draft
# tokens were accepted because the text repeats itself, and its acceptance says little about the
# drafter. Half is the line between "mostly a loop" and "mostly text"; tests/test_benchmark.py
# shows ordinary code far below it and planted loops far above.
LOOP_SHARE = 0.5
# The longest repeated n-gram looked for, in units: longer than most lines of code, short enough
# that two copies fit in the shortest generations the benchmark makes.
MAX_PERIOD = 32
# One token this many times in a row is a loop by itself: deeper than code indents; column
# alignment this wide is rare, and is whitespace both models predict as easily as a loop.
MAX_RUN = 32


def runs(tokens: list[int]) -> list[tuple[int, int]]:
    """[(token, how many times in a row)]: [5, 5, 5, 7] -> [(5, 3), (7, 1)]."""
    units = []
    for t in tokens:
        if units and units[-1][0] == t:
            units[-1] = (t, units[-1][1] + 1)
        else:
            units.append((t, 1))
    return units


def loop_share(tokens: list[int], max_period: int = MAX_PERIOD, max_run: int = MAX_RUN) -> float:
    """The largest share of tokens (0 to 1) that lie in a repetition of one period (see the module
    docstring): periodic stretches of units, and runs of one token max_run or more long."""
    units = runs(tokens)  # compared whole: '\n' + 13 spaces does not repeat '\n' + 11 spaces
    lengths = [u[1] for u in units]
    long_runs = [length >= max_run for length in lengths]
    best = sum(length for length, long in zip(lengths, long_runs) if long)
    for p in range(2, min(max_period, len(units) // 2) + 1):  # p = 1: neighbouring units always differ
        covered = list(long_runs)
        streak = 0  # units in a row equal to the unit p back
        for i in range(p, len(units) + 1):
            if i < len(units) and units[i] == units[i - p]:
                streak += 1
                continue
            if streak >= p:  # a full copy repeated: units i - streak - p .. i - 1
                covered[i - streak - p:i] = [True] * (streak + p)
            streak = 0
        best = max(best, sum(length for length, c in zip(lengths, covered) if c))
    return best / len(tokens) if tokens else 0.0


def looped(tokens: list[int], threshold: float = LOOP_SHARE) -> bool:
    """True when a repetition covers at least `threshold` of the tokens (loop_share)."""
    return loop_share(tokens) >= threshold


# The mark every table, plot and summary puts beside a cell whose output looped.
LOOP_MARK = "output looped: acceptance inflated"
