"""Parse caption text back into a logical form (the inverse of ``captions.render_caption``).

The grammar (words are case-insensitive; a final "." is ignored; synonyms from
``vocabulary`` are accepted wherever the canonical word is)::

    caption     := [there is | there are | there's] body
    body        := count | scene | single [RELATION single]
    single      := (a | an) description
    description := [SIZE] [COLOR] NOUN [POSITION]        NOUN: shape word or shape/object/thing/item
    count       := [exactly] NUMBER description          "three shapes", "exactly 2 green objects"
    scene       := [exactly] NUMBER GENERIC ":" single ("," single)* [","] "and" single
                                                         (as many singles as NUMBER says)

Anything else raises :class:`FalconError` naming the word where parsing stopped.
"""

from __future__ import annotations

import re
from typing import TypeVar

from falcon_cli.data.shapes import logical_forms as lfs
from falcon_cli.data.shapes.vocabulary import (
    COLOR_WORDS,
    EXTRA_NUMBER_WORDS,
    GENERIC_WORDS,
    NUMBER_WORDS,
    POSITION_PHRASES,
    RELATION_PHRASES,
    SHAPE_WORDS,
    SIZE_WORDS,
)
from falcon_cli.errors import FalconError

V = TypeVar("V")
Table = dict[tuple[str, ...], object]


def _table(pairs) -> Table:
    return {tuple(phrase.split()): value for phrase, value in pairs}


ARTICLES = _table([("a", None), ("an", None)])
OPENINGS = _table([("there is", None), ("there are", None), ("there's", None), ("there exists", None)])
EXACTLY = _table([("exactly", None)])
NUMBERS = _table(
    [(word, n) for n, word in enumerate(NUMBER_WORDS)]
    + list(EXTRA_NUMBER_WORDS.items())
    + [(str(n), n) for n in range(10)]
)
SIZES = _table((word, size) for size, words in SIZE_WORDS.items() for word in words)
COLORS = _table((word, color) for color, words in COLOR_WORDS.items() for word in words)
NOUNS = _table(
    [(form, shape) for shape, forms in SHAPE_WORDS.items() for pair in forms for form in pair]
    + [(form, None) for pair in GENERIC_WORDS for form in pair]
)
GENERIC_NOUNS = _table((form, None) for pair in GENERIC_WORDS for form in pair)
POSITIONS = _table((phrase, name) for name, phrases in POSITION_PHRASES.items() for phrase in phrases)
RELATIONS = _table((phrase, rel) for rel, phrases in RELATION_PHRASES.items() for phrase in phrases)
AND = _table([("and", None)])
COMMA = _table([(",", None)])
COLON = _table([(":", None)])


def tokenize(text: str) -> list[str]:
    """Lower-case words, with "," and ":" as their own tokens and hyphens as spaces."""
    text = text.lower().replace("\u2019", "'").replace("-", " ").strip()
    text = re.sub(r"[.]+$", "", text)
    text = re.sub(r"([,:])", r" \1 ", text)
    return text.split()


class Tokens:
    """A cursor over the words of one text, matching the longest phrase from a table."""

    def __init__(self, text: str, what: str = "caption"):
        self.text = text
        self.what = what
        self.words = tokenize(text)
        self.i = 0

    def _match(self, table: Table) -> tuple[object, int] | None:
        best = None
        for phrase, value in table.items():
            n = len(phrase)
            if tuple(self.words[self.i : self.i + n]) == phrase and (best is None or n > best[1]):
                best = (value, n)
        return best

    def peek(self, table: Table) -> bool:
        """Whether a phrase from ``table`` starts at the cursor."""
        return self._match(table) is not None

    def take(self, table: Table, default=None):
        """Consume a phrase from ``table`` and return its value, or return ``default`` without moving."""
        found = self._match(table)
        if found is None:
            return default
        self.i += found[1]
        return found[0]

    def expect(self, table: Table, expected: str):
        """Consume a phrase from ``table`` or raise FalconError saying what was expected."""
        if not self.peek(table):
            self.fail(expected)
        return self.take(table)

    def at_end(self) -> bool:
        return self.i >= len(self.words)

    def expect_end(self, expected: str = "the end") -> None:
        if not self.at_end():
            self.fail(expected)

    def fail(self, expected: str):
        found = f"'{self.words[self.i]}' (word {self.i + 1})" if not self.at_end() else "the end of the text"
        raise FalconError(
            f"{self.what} {self.text!r} is outside the shapes grammar: expected {expected}, found {found} "
            "(see docs/shapes.md for the grammar)"
        )


NOUN_EXPECTED = "a shape word (circle, square, triangle, ...) or shape/object/thing/item"


def parse_description(tokens: Tokens) -> dict:
    """``[SIZE] [COLOR] NOUN [POSITION]`` → an object description (number agreement is not enforced)."""
    size = tokens.take(SIZES)
    color = tokens.take(COLORS)
    shape = tokens.expect(NOUNS, NOUN_EXPECTED if (size or color) else "a size, colour or " + NOUN_EXPECTED)
    position = tokens.take(POSITIONS)
    return lfs.describe(size=size, color=color, shape=shape, position=position)


def parse_single(tokens: Tokens) -> dict:
    """``(a | an) description``."""
    tokens.expect(ARTICLES, "'a' or 'an'")
    return parse_description(tokens)


def _parse_list(tokens: Tokens) -> list[dict]:
    """``single ("," single)* [","] "and" single``, or one single."""
    objects = [parse_single(tokens)]
    while True:
        if tokens.take(COMMA, default=False) is not False:
            if tokens.take(AND, default=False) is not False:
                objects.append(parse_single(tokens))
                return objects
            objects.append(parse_single(tokens))
        elif tokens.take(AND, default=False) is not False:
            objects.append(parse_single(tokens))
            return objects
        else:
            return objects


def parse_caption(text: str) -> dict:
    """The logical form of a caption in the shapes grammar (FalconError when the text is outside it)."""
    if not isinstance(text, str) or not text.strip():
        raise FalconError(
            f"caption {text!r} is empty; a shapes caption names at least one object (e.g. 'a red circle')"
        )
    tokens = Tokens(text)
    tokens.take(OPENINGS)
    if tokens.peek(EXACTLY) or tokens.peek(NUMBERS):
        tokens.take(EXACTLY)
        n = tokens.expect(NUMBERS, "a number")
        start = tokens.i
        description = parse_description(tokens)
        if tokens.take(COLON, default=False) is not False:
            if description:
                tokens.i = start
                tokens.fail("a plain noun before ':' (e.g. 'two shapes: a red circle and a blue square')")
            objects = _parse_list(tokens)
            tokens.expect_end("',' or 'and' followed by another object, or the end")
            if len(objects) != n:
                raise FalconError(
                    f"caption {text!r}: a full description announces {n} object(s) but lists {len(objects)}"
                )
            return lfs.scene(objects)
        tokens.expect_end("':' or the end")
        return lfs.count(n, description)
    if not tokens.peek(ARTICLES):
        tokens.fail("'a'/'an', a number, or 'there is'")
    subject = parse_single(tokens)
    if tokens.at_end():
        return lfs.exists(subject)
    rel = tokens.expect(RELATIONS, "a relation (left of, right of, above, below) or the end")
    obj = parse_single(tokens)
    tokens.expect_end()
    return lfs.relation(rel, subject, obj)
