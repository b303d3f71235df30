"""Text the student's code produced, made safe to show: what it printed, its exceptions' messages,
its file names. A terminal obeys control characters and escape sequences (ANSI CSI and OSC: move
the cursor, clear the screen, recolour, retitle the window; \\r and backspace overwrite what was
written), so a submission could draw "ALL PASS" over its own failing report. Every such character
is written out visibly instead (ESC becomes the four characters \\x1b), before the text reaches a
terminal, a CSV or results.json. Used at every place the grader's reports leave it.
"""

import re

# C0 controls but tab and newline, DEL, the C1 controls (a terminal takes 0x9b as CSI), and the
# Unicode formatting characters that reorder or hide what is shown (bidirectional overrides and
# isolates, zero-width characters, line and paragraph separators, the byte-order mark).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text, newlines: bool = True) -> str:
    """`text` (made a str) with every control character and formatting character written out
    visibly (\\x1b, \\r, \\u202e ...). newlines=False: newlines and tabs too (one CSV cell,
    one line of a log). Applying it twice changes nothing more."""
    text = _UNSAFE.sub(_escaped, str(text))
    return text if newlines else text.replace("\n", "\\n").replace("\t", "\\t")
