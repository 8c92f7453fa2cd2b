"""What differs between two resolved configs (used to refuse mixing runs or worlds)."""

from __future__ import annotations


def config_differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``["key.sub: old -> new", ...]`` for every leaf that differs, sorted by key."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs
