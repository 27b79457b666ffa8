"""Text read back from a database that anyone with write access could have edited, made safe to show.

A study name, a worker id, a note or an error message is printed to terminals and logs. A database writer
who puts ESC, CR or LF in one can set a terminal's title, clear its screen or forge a log line; Unicode's
bidi overrides and zero-width characters make a line read as something it is not. ``visible`` shows each
such character as its escape (``\\x1b``) instead; ``invisible_in`` finds the first, for the checks that refuse
a value outright (a study name, a plan, a worker id).
"""

from __future__ import annotations

import unicodedata

# control, format (bidi, zero-width), line and paragraph separators
INVISIBLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def invisible_in(text: str) -> str | None:
    """The first control or format character in ``text`` (None: there is none)."""
    return next((c for c in text if unicodedata.category(c) in INVISIBLE_CATEGORIES), None)


def visible(text: str, keep_newlines: bool = False) -> str:
    """``text`` with each control or format character shown as its Python escape (``ESC`` as ``\\x1b``); with
    ``keep_newlines``, line feeds stay (a multi-line message autotune wrote itself, such as a traceback)."""
    if invisible_in(text) is None:
        return text
    return "".join(
        c
        if unicodedata.category(c) not in INVISIBLE_CATEGORIES or (keep_newlines and c == "\n")
        else repr(c)[1:-1]
        for c in text
    )
