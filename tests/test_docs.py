"""The documentation points only at what exists: every relative link of README.md and docs/*.md
resolves — the file, and the heading an anchor names — and no page refers to notes that are
not in the repository (a design document, research notes). The user's pages (the language,
operations, sources, Spark) carry no project history ("issue 12", "What comes next"): design
rationale lives in docs/semantics.md and docs/architecture.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
USER_PAGES = ["language.md", "operations.md", "sources.md", "spark.md"]

_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The page without its code (a regular expression in backticks is not a link)."""
    return _CODE.sub("", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", _CODE.sub("", page.read_text(encoding="utf-8")),
                              re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _links(page: Path) -> list[str]:
    found = _LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [a or b for a, b in found]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and resolved.suffix == ".md" and (
            not resolved.exists() or anchor not in _anchors(resolved))
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert broken == [], f"{page.name}: {broken}"


def test_the_readme_links_every_page_of_the_docs() -> None:
    linked = {Path(t).name for t in _links(ROOT / "README.md")}
    assert {p.name for p in (ROOT / "docs").glob("*.md")} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_refers_to_notes_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    found = re.findall(r"DESIGN(?: §\d+)?|research/[\w.]+|\.\./shared\S*|research notes", text)
    assert found == [], f"{page.name}: {found}"


@pytest.mark.parametrize("name", USER_PAGES)
def test_the_users_pages_tell_no_project_history(name: str) -> None:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    found = re.findall(r"\b[Ii]ssues? \d+(?:[–-]\d+)?|What comes next|\bTODO\b", text)
    assert found == [], f"{name}: {found}"
