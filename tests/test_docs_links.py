"""Every link to a docs page's heading (``docs/page.md#anchor`` in the code, ``page.md#anchor``
in the docs and the README) leads to a heading that exists, by GitHub's anchor rules."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"(?:docs/)?([\w.-]+\.md)#([\w-]+)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of ``page``'s headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links() -> list[tuple[str, str, str]]:
    """(where, page, anchor) for every link found."""
    sources = [*(ROOT / "src").rglob("*.py"), *DOCS.glob("*.md"), ROOT / "README.md"]
    return [
        (f"{path.relative_to(ROOT)}", page, anchor)
        for path in sources
        for page, anchor in LINK.findall(path.read_text(encoding="utf-8"))
    ]


def test_every_link_to_a_heading_finds_it():
    links = _links()
    assert len(links) > 20  # the pattern finds them
    pages = {p.name: _anchors(p) for p in DOCS.glob("*.md")}
    pages["README.md"] = _anchors(ROOT / "README.md")
    broken = [
        f"{where}: {page}#{anchor}"
        for where, page, anchor in links
        if page in pages and anchor not in pages[page]
    ]
    assert not broken, broken


def test_the_anchor_rule_matches_githubs():
    page = DOCS / "keras-script.md"
    assert "several-workers" in _anchors(page)
    assert "mirrorfitsetup" in _anchors(page)  # "`mirrorfit.setup`": backticks and dot dropped
