"""The fixed vocabulary of the shapes world: palettes, grid cells, and the words for them.

Everything that turns a code into a word (or a word back into a code) lives here, so the
caption renderer, the parser, the VQA and NLVR2 generators and the image renderer agree.

Codes are indices into the FULL palettes below, never into the subset a config uses, so a
code means the same thing in every world (``num_colors=6`` simply uses codes 0..5).
Changing the order of these tuples changes every generated world: bump
``WORLD_SCHEMA_VERSION`` in ``world.py`` if you do.
"""

from __future__ import annotations

# --- palettes -------------------------------------------------------------------------

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond", "star", "hexagon", "cross", "pentagon")
"""All shapes a world may use; a config uses the first ``num_shapes``."""

COLORS: tuple[str, ...] = ("red", "green", "blue", "yellow", "purple", "orange", "pink", "cyan", "white", "brown")
"""All colours a world may use; a config uses the first ``num_colors``."""

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (50, 90, 230),
    "yellow": (240, 215, 40),
    "purple": (140, 60, 190),
    "orange": (245, 140, 30),
    "pink": (245, 135, 195),
    "cyan": (40, 205, 215),
    "white": (245, 245, 245),
    "brown": (135, 85, 40),
}

SIZES: tuple[str, ...] = ("small", "large")
"""Object sizes (always both are used)."""

# --- the 3x3 grid ---------------------------------------------------------------------
# Cell index = 3 * row + col, row 0 at the top, col 0 on the left.

POSITIONS: tuple[str, ...] = (
    "top left",
    "top",
    "top right",
    "left",
    "center",
    "right",
    "bottom left",
    "bottom",
    "bottom right",
)
"""Canonical names of the nine cells, indexed by ``3 * row + col``."""

GRID = 3
NUM_CELLS = GRID * GRID

# --- words ----------------------------------------------------------------------------
# The first entry of each list is the canonical word; the others are synonyms that the
# caption renderer may pick (with probability ``paraphrase_prob``) and the parser accepts.

SHAPE_WORDS: dict[str, list[tuple[str, str]]] = {
    "circle": [("circle", "circles"), ("ball", "balls"), ("disc", "discs"), ("disk", "disks")],
    "square": [("square", "squares"), ("box", "boxes"), ("block", "blocks")],
    "triangle": [("triangle", "triangles"), ("pyramid", "pyramids")],
    "diamond": [("diamond", "diamonds"), ("rhombus", "rhombuses"), ("lozenge", "lozenges")],
    "star": [("star", "stars")],
    "hexagon": [("hexagon", "hexagons")],
    "cross": [("cross", "crosses"), ("plus sign", "plus signs")],
    "pentagon": [("pentagon", "pentagons")],
}
"""(singular, plural) nouns per shape; canonical first."""

GENERIC_WORDS: list[tuple[str, str]] = [
    ("shape", "shapes"),
    ("object", "objects"),
    ("thing", "things"),
    ("item", "items"),
]
"""Nouns that name any object (no shape constraint); canonical first."""

COLOR_WORDS: dict[str, list[str]] = {
    "red": ["red", "crimson", "scarlet"],
    "green": ["green", "emerald"],
    "blue": ["blue", "azure", "cobalt"],
    "yellow": ["yellow", "golden", "lemon"],
    "purple": ["purple", "violet"],
    "orange": ["orange", "tangerine"],
    "pink": ["pink", "rose"],
    "cyan": ["cyan", "turquoise"],
    "white": ["white", "ivory"],
    "brown": ["brown", "chocolate"],
}

SIZE_WORDS: dict[str, list[str]] = {
    "small": ["small", "little", "tiny"],
    "large": ["large", "big"],
}

POSITION_PHRASES: dict[str, list[str]] = {
    "top left": ["in the top left", "in the upper left", "in the top left corner", "in the upper left corner"],
    "top": ["at the top", "in the top middle", "at the top center"],
    "top right": ["in the top right", "in the upper right", "in the top right corner", "in the upper right corner"],
    "left": ["on the left", "in the middle left", "at the left"],
    "center": ["in the center", "in the middle", "in the centre"],
    "right": ["on the right", "in the middle right", "at the right"],
    "bottom left": ["in the bottom left", "in the lower left", "in the bottom left corner", "in the lower left corner"],
    "bottom": ["at the bottom", "in the bottom middle", "at the bottom center"],
    "bottom right": [
        "in the bottom right",
        "in the lower right",
        "in the bottom right corner",
        "in the lower right corner",
    ],
}
"""Prepositional phrases naming exactly one cell; canonical first."""

RELATIONS: tuple[str, ...] = ("left_of", "right_of", "above", "below")
"""Binary relations between two distinct objects (grid columns / rows, strictly)."""

RELATION_PHRASES: dict[str, list[str]] = {
    "left_of": ["left of", "to the left of"],
    "right_of": ["right of", "to the right of"],
    "above": ["above", "over"],
    "below": ["below", "under", "beneath"],
}

NUMBER_WORDS: tuple[str, ...] = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""Index = the number; "no" is how zero reads in a caption ("no red circles")."""

EXTRA_NUMBER_WORDS: dict[str, int] = {"zero": 0}
"""Other spellings the parser accepts (digits 0-9 are accepted too)."""

YES_WORDS = ["yes", "yeah", "yep"]
NO_WORDS = ["no", "nope"]


def shape_code(name: str) -> int:
    """Code of a canonical shape name (index into :data:`SHAPES`)."""
    return SHAPES.index(name)


def color_code(name: str) -> int:
    """Code of a canonical colour name (index into :data:`COLORS`)."""
    return COLORS.index(name)


def size_code(name: str) -> int:
    """Code of a canonical size name (index into :data:`SIZES`)."""
    return SIZES.index(name)


def position_code(name: str) -> int:
    """Cell index (``3 * row + col``) of a canonical position name."""
    return POSITIONS.index(name)


def article(next_word: str) -> str:
    """'a' or 'an' for the word that follows (by its first letter)."""
    return "an" if next_word[:1] in "aeiou" else "a"


def number_word(n: int) -> str:
    """How a count reads in text ("no", "one", ... "nine"; digits above)."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)
