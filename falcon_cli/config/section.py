""":class:`Section`, the base of every config section, apart from the schema package so that a method's file (and
a plugin's) can define its settings without importing the whole schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, every field has a docstring (read by
    falcon_cli.field_docs, not at class creation: a fast CLI)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
