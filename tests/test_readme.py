"""The README stays a page a teammate can read, and no link in it or in docs/ leads nowhere.

The README is a guide (what the project is, the two commands, the answer table, your model, deploying and serving);
every count and caveat lives in docs/. Checked here: its size in bytes (``wc -c``), and that every relative link of
README.md and docs/*.md -- ``[text](path)``, ``[text](path#anchor)``, ``[text](#anchor)``, images -- names a file
that exists and, for a Markdown target, a heading whose GitHub anchor is the one linked.
"""

import re
from pathlib import Path

import pytest

from tests.tiny import ROOT

README_BYTES = 12_000  # "too dense to hand to a teammate": 25 KB, when every count and caveat sat in it
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower-case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``; a repeated
    heading gets ``-1``, ``-2``, ... Headings inside fenced code blocks are not headings."""
    found, seen = set(), {}
    for line in strip_code(page.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def strip_code(text: str) -> str:
    """The text outside fenced code blocks (a ``[x](y)`` in a shell example is not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", strip_code(page.read_text()))  # inline code is not a link either
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_the_readme_is_at_most_12_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_BYTES, f"README.md is {size} bytes (> {README_BYTES}): move counts and caveats to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_reads_links_and_anchors_as_github_does(tmp_path):
    """The checker itself: a dead file, a dead anchor, a link in code (ignored) and a repeated heading."""
    page = tmp_path / "page.md"
    page.write_text(
        "# A title: `x=1`, and more (issue #3)\n\n## Twice\n\n## Twice\n\n"
        "[a](other.md) [b](#a-title-x1-and-more-issue-3) ![c](img.png) [d](https://example.com/x.md) `[e](nowhere.md)`\n"
        "```bash\n[f](nowhere.md)\n# not a heading\n```\n"
    )
    assert links(page) == ["other.md", "#a-title-x1-and-more-issue-3", "img.png"]
    assert anchors(page) == {"a-title-x1-and-more-issue-3", "twice", "twice-1"}
