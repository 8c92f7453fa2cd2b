"""Caption normalisation: the one place every loader cleans its text (ALBEF's ``pre_caption``).

Captions, VQA questions and NLVR2 sentences all go through :func:`pre_caption`, so a
model sees the same text whichever format it came from.
"""

from __future__ import annotations

import re

DEFAULT_MAX_WORDS = 30
"""ALBEF truncates every caption to 30 words (``pre_caption(caption, max_words=30)``)."""

_PUNCTUATION = re.compile(r"[,.'!?\"()*#:;~]")
_SPACES = re.compile(r"\s+")


def pre_caption(text: str, max_words: int = DEFAULT_MAX_WORDS) -> str:
    """Normalise a caption like ALBEF: lower-case, drop punctuation, collapse spaces, truncate.

    ``-`` and ``/`` become spaces and ``<person>`` becomes ``person`` (as in ALBEF);
    the punctuation ``, . ' ! ? " ( ) * # : ; ~`` is removed; runs of whitespace collapse
    to one space; the result keeps at most ``max_words`` words.

    >>> pre_caption("A Red-Circle,  left of a BLUE square!")
    'a red circle left of a blue square'
    """
    text = text.lower().replace("<person>", "person")
    text = _PUNCTUATION.sub("", text).replace("-", " ").replace("/", " ")
    words = _SPACES.sub(" ", text).strip().split(" ")
    if max_words > 0 and len(words) > max_words:
        words = words[:max_words]
    return " ".join(words)
