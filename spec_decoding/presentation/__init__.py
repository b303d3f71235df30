"""Showing a generation to a person.

    trace            a round-by-round record of p, q, the draws and the verdicts
    trace_page       that record as a self-contained HTML page
    colours          one colour name per token source (terminal, page, docs)
    loops            whether a generated text fell into a loop, and the mark tables put beside it
"""
