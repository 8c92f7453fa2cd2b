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


def with_missing_keys(stored: dict, current: dict) -> dict:
    """``stored`` with every key it lacks (at any depth) taken from ``current``; keys it has keep their values."""
    out = dict(stored)
    for key, value in current.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = with_missing_keys(out[key], value)
    return out
