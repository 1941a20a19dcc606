"""The README stays one screen, and no link in the documentation leads nowhere: every relative link in
README.md, docs/*.md and results/README.md names a file that exists, and every #anchor names a heading of the
page it points to, by GitHub's slug of that heading."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200


def pages():
    return [ROOT / "README.md", ROOT / "results" / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _prose_lines(text):
    """The lines outside fenced code blocks (a link or a heading inside one is code, not markdown)."""
    fence = None
    for line in text.splitlines():
        marker = re.match(r"\s*(```|~~~)", line)
        if marker:
            fence = None if fence == marker.group(1) else (fence or marker.group(1))
            continue
        if fence is None:
            yield line


def github_slug(heading):
    """The anchor GitHub gives a heading: its text as rendered (code spans and links by their text), lower
    case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"(`+)(.*?)\1", r"\2", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a page: its headings' slugs, a repeated slug numbered as GitHub numbers it."""
    seen = {}
    out = set()
    for line in _prose_lines(path.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def links(path):
    """(line text, target) for every markdown link and image in the page's prose."""
    for line in _prose_lines(path.read_text()):
        bare = re.sub(r"(`+)(.*?)\1", "", line)  # a code span's brackets are not a link
        for m in re.finditer(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)", bare):
            yield line.strip(), m.group(1)


def broken_links(path):
    broken = []
    for _line, target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: ({target})"
        if not dest.exists():
            broken.append(f"{where}: no file {file_part}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading in {dest.relative_to(ROOT)} has the anchor #{anchor}")
    return broken


def test_readme_is_one_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move a subject to docs/"
    )


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(path):
    assert not broken_links(path), "\n".join(broken_links(path))


def test_the_links_are_read():
    """The check reads links at all: the README's links to the pages its sections point to are found."""
    targets = {t.partition("#")[0] for _, t in links(ROOT / "README.md")}
    assert {
        "docs/ERRORS.md",
        "docs/SANITIZER.md",
        "docs/COMMANDS.md",
        "docs/GPU_TESTS.md",
        "results/README.md",
        "docs/web/run.png",
    } <= targets, targets


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# A page\n\n## The `run`: budgets, and more\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "see [ok](other.md#the-run-budgets-and-more), [ok](other.md#twice-1), [ok](#here)\n"
        "## Here\n"
        "```\n[in code](missing.md)\n```\n"
        "`[in a code span](missing.md)` and [gone](missing.md), [bad anchor](other.md#nope),\n"
        "![image](nope.png), [web](https://example.com/x)\n"
    )
    found = broken_links(page)
    assert len(found) == 3, found
    assert "no file missing.md" in found[0] and "#nope" in found[1] and "no file nope.png" in found[2]


def test_github_slugs():
    assert github_slug("Browsing the ledger: `kernel-agent serve`") == "browsing-the-ledger-kernel-agent-serve"
    assert github_slug("The time limit, `--resume`, and how a run ends") == "the-time-limit---resume-and-how-a-run-ends"
    assert github_slug("A model's decode step: `bench --model`") == "a-models-decode-step-bench---model"
