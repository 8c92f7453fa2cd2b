"""The pages a user reads cannot rot unseen: every local link resolves, every recipe they name exists, and the
CHANGELOG is a list of versioned releases whose newest is the package's version."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import falcon_cli
from falcon_cli.config.recipes import list_recipes

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_links(page: Path) -> list[str]:
    """The link targets of a markdown page that are files of this repository (no URLs, no bare anchors)."""
    targets = [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]
    return [t.split("#")[0] for t in targets if not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_of_a_page_resolves(page):
    missing = [t for t in local_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_recipe_a_page_names_exists(page):
    recipes = list_recipes()
    named = set(re.findall(r"--recipe ([a-z0-9][a-z0-9-]*)(?![\w./-])", page.read_text(encoding="utf-8")))
    assert not named - set(recipes), f"{page.relative_to(ROOT)} names unknown recipes: {sorted(named - set(recipes))}"


def test_the_changelog_is_versioned_releases_the_newest_being_the_packages_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[0] == "[Unreleased]"
    releases = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", h) for h in headings[1:]]
    assert all(releases), f"a release heading is not '## [X.Y.Z] - YYYY-MM-DD': {headings}"
    versions = [tuple(map(int, r.group(1).split("."))) for r in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert releases[0].group(1) == falcon_cli.__version__
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'version = "{falcon_cli.__version__}"' in pyproject
    # Each release names its commit on the line under its heading (git tags do not travel with a clone); where the
    # history is here (not a shallow clone), that commit is the release: its pyproject.toml has the version.
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    for release in re.finditer(r"^## \[(\d+\.\d+\.\d+)\] - \S+\n\nCommit `([0-9a-f]{7,40})`", text, flags=re.M):
        version, commit = release.groups()
        if shallow.returncode == 0 and shallow.stdout.strip() == "false":
            old = subprocess.run(["git", "show", f"{commit}:pyproject.toml"], cwd=ROOT, capture_output=True, text=True)
            assert old.returncode == 0 and f'version = "{version}"' in old.stdout, (version, commit, old.stderr)
    named = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \S+\n\nCommit `[0-9a-f]{7,40}`", text, flags=re.M)
    assert named == [r.group(1) for r in releases], f"a release without its commit on the line under it: {named}"
    for section in re.findall(r"^### (.+)$", text, flags=re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, section
