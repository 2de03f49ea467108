"""The README and the manual (docs/*.md) point only at things that exist, and the README stays short.

Checked in ``README.md``, ``docs/*.md`` and ``reports/README.md``:

* markdown links ``[text](target)``: the target file (relative to the linking file) exists and,
  for ``target#anchor`` / ``#anchor``, the anchor is a heading of the target, slugged as GitHub
  does (lower-case, punctuation other than ``-`` and ``_`` dropped, spaces -> ``-``, ``-N`` for
  repeated headings);
* repository paths in inline code and code blocks (``pcpo_eval/...``, ``docs/...``, ``tests/...``,
  ``benchmarks/...``, ``analysis/...``, ``train/...``, relative to the repository root) exist;
* the README has at most :data:`README_MAX_LINES` lines, and docs/README.md links every page.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200
PATH_ROOTS = ("pcpo_eval", "docs", "tests", "benchmarks", "analysis", "train")

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`+([^`]+?)`+")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(PATH_ROOTS) + r")/[\w./*+-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def doc_files() -> list[Path]:
    """The files this check covers: the README, every manual page, the reports folder's README."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "reports" / "README.md"]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading text (github-slugger: drop punctuation, spaces -> '-')."""
    text = _INLINE_CODE.sub(r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor of a markdown text, with GitHub's ``-1``, ``-2`` for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for _, text in _HEADING.findall(_FENCE.sub("", markdown)):
        slug = github_slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def markdown_links(markdown: str) -> list[str]:
    """Link targets outside code (code blocks and inline code are not links)."""
    prose = _INLINE_CODE.sub("", _FENCE.sub("", markdown))
    return _LINK.findall(prose)


def repo_paths(markdown: str) -> list[str]:
    """Repository paths written in inline code or code blocks, trailing punctuation removed."""
    code = [m.group(0) for m in _FENCE.finditer(markdown)]
    code += _INLINE_CODE.findall(_FENCE.sub("", markdown))
    return [p.rstrip(".,:;") for chunk in code for p in _REPO_PATH.findall(chunk)]


def _rel(path: Path) -> str:
    """``path`` relative to the repository root when it is inside it, else its name."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _path_exists(path: Path) -> bool:
    if any(c in path.name for c in "*?["):
        return any(path.parent.glob(path.name))
    return path.exists()


def broken_links(doc: Path) -> list[str]:
    """Links of ``doc`` whose file or anchor does not exist."""
    text = doc.read_text(encoding="utf-8")
    problems = []
    for target in markdown_links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{anchor} in {_rel(dest)}")
    return problems


def broken_paths(doc: Path) -> list[str]:
    """Repository paths named in ``doc``'s code that do not exist."""
    return [p for p in repo_paths(doc.read_text(encoding="utf-8")) if not _path_exists(ROOT / p)]


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_exist(doc: Path) -> None:
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    problems = broken_links(doc) + [f"`{p}`: no such path" for p in broken_paths(doc)]
    assert problems == [], f"{doc.relative_to(ROOT)}: " + "; ".join(problems)


def test_readme_is_short() -> None:
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}); move reference text to docs/"
    )


def test_manual_index_links_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {
        (index.parent / t.partition("#")[0]).resolve()
        for t in markdown_links(index.read_text(encoding="utf-8"))
    }
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p != index}
    assert pages, "docs/ has no pages"
    assert sorted(p.name for p in pages - linked) == []


def test_checker_finds_links_paths_and_anchors(tmp_path: Path) -> None:
    """The checker is not vacuous: it sees real references and reports made-up ones."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/README.md" in markdown_links(readme)
    assert "pcpo_eval/weights/" in repo_paths(readme)
    assert github_slug("Credit weights (`pcpo-eval credit`)") == "credit-weights-pcpo-eval-credit"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}

    fake = tmp_path / "page.md"
    fake.write_text(
        "# Title\n[ok](#title) [gone](missing.md) [bad anchor](#nope) [web](https://example.org)\n"
        "`pcpo_eval/errors.py` `pcpo_eval/no_such_module.py`\n```bash\nls docs/no_such_page.md\n```\n",
        encoding="utf-8",
    )
    assert broken_links(fake) == [
        "missing.md: no such file",
        "#nope: no heading with anchor #nope in page.md",
    ]
    assert sorted(broken_paths(fake)) == ["docs/no_such_page.md", "pcpo_eval/no_such_module.py"]
