"""The docstrings under config fields (``epochs: int = 20`` followed by ``\"\"\"Training epochs.\"\"\"``), read when
asked.

pydantic's ``use_attribute_docstrings`` reads them when each class is created, parsing its source again: about a
tenth of a second over falcon's config classes, paid by every command that validates a config (``falcon recipes
show`` and a bad override included) for text that only the documentation and its tests read. This reads them on
demand instead, from the same place.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache


@cache
def field_docstrings(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` of a class and the classes it extends: for each annotated assignment in a class
    body, the string literal right below it (a subclass's docstring wins over its base's)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("falcon_cli"):
            continue  # (BaseModel, object: no falcon fields)
        try:
            source = inspect.getsource(klass)
        except OSError:  # (a class built at run time, e.g. the false-negative section: its fields' descriptions)
            fields = getattr(klass, "__pydantic_fields__", {})
            docs.update({name: field.description for name, field in fields.items() if field.description})
            continue
        body = ast.parse(textwrap.dedent(source)).body[0].body
        for statement, below in zip(body, body[1:]):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(below, ast.Expr)
                and isinstance(below.value, ast.Constant)
                and isinstance(below.value.value, str)
            ):
                docs[statement.target.id] = inspect.cleandoc(below.value.value)
    return docs


__all__ = ["field_docstrings"]
