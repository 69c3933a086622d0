#!/usr/bin/env python3
"""The README's and the docs' tables of contents, and their links.

    .ci/readme_toc.py           rewrite each block between <!-- toc --> and <!-- /toc -->
                                (README.md must have one; a docs page may)
    .ci/readme_toc.py --check   exit 1 if a block is stale or a link is broken (the code
                                gate runs this)

The pages checked are README.md, docs/*.md and docs/benchmarks/*.md. In each:
- a `](#anchor)` link names a heading of the page;
- a relative link names a file or directory of the repository, and a `file.md#anchor`
  link a heading of that page;
- in docs/testing.md, every test a table names after a file link (`[file](...)`: `name`,
  `name`) is a name in that file, so the feature -> test table cannot name a test that
  is gone.

Anchors follow GitHub's rule: lower case, punctuation other than `-` and `_` dropped,
spaces made `-`, and `-1`, `-2`, ... appended to repeated headings. A TOC lists the
`##` and `###` headings.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TESTING = ROOT / "docs" / "testing.md"
START, END = "<!-- toc -->", "<!-- /toc -->"
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")


def pages():
    """Every page checked: the README, then docs/ and docs/benchmarks/ in name order."""
    docs = ROOT / "docs"
    return [README] + sorted(docs.glob("*.md")) + sorted((docs / "benchmarks").glob("*.md"))


def anchor(title, seen):
    text = re.sub(r"`", "", title).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    n = seen.get(text, 0)
    seen[text] = n + 1
    return text if n == 0 else f"{text}-{n}"


def prose(lines):
    """(line number, line) of every line outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def headings(lines):
    """(level, title, anchor) of every heading outside fenced code blocks."""
    seen, out = {}, []
    for _, line in prose(lines):
        m = re.match(r"^(#{1,6}) (.+?)\s*$", line)
        if m:
            out.append((len(m.group(1)), m.group(2), anchor(m.group(2), seen)))
    return out


def toc(lines):
    rows = [START]
    for level, title, a in headings(lines):
        if level in (2, 3):
            rows.append(f"{'  ' * (level - 2)}- [{title.replace('`', '')}](#{a})")
    rows.append(END)
    return rows


def with_toc(lines):
    """The page with its TOC block made afresh (unchanged without one)."""
    if START not in lines or END not in lines:
        return lines
    i, j = lines.index(START), lines.index(END)
    return lines[:i] + toc(lines[:i] + lines[j + 1:]) + lines[j + 1:]


_anchor_cache = {}


def anchors_of(path):
    if path not in _anchor_cache:
        _anchor_cache[path] = {a for _, _, a in headings(path.read_text().split("\n"))}
    return _anchor_cache[path]


def links(lines):
    """(line number, target) of every Markdown link outside code blocks and code spans."""
    for n, line in prose(lines):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "``", line)):
            yield n, m.group(2)


def broken_links(page, lines):
    """What is wrong with the links of one page, as messages."""
    out = []
    own = {a for _, _, a in headings(lines)}
    for n, target in links(lines):
        where = f"{page.relative_to(ROOT)}:{n}"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, frag = target.partition("#")
        if not path:
            if frag not in own:
                out.append(f"{where}: a link to #{frag} names no heading")
            continue
        dest = (page.parent / path).resolve()
        if ROOT not in dest.parents and dest != ROOT:
            out.append(f"{where}: {target} leaves the repository")
        elif not dest.exists():
            out.append(f"{where}: {target} names no file")
        elif frag and dest.suffix == ".md" and frag not in anchors_of(dest):
            out.append(f"{where}: {target}: #{frag} names no heading of {path}")
    return out


def missing_tests(lines):
    """Tests docs/testing.md names after a file link that the file does not hold."""
    out = []
    group = re.compile(r"\[`([^`]+)`\]\([^)]*\)((?::\s*(?:`[^`]+`(?:,\s*)?)+)?)")
    for n, line in prose(lines):
        if not line.startswith("|"):
            continue
        for m in group.finditer(line):
            path, names = m.group(1), re.findall(r"`([^`]+)`", m.group(2))
            file = ROOT / path
            if not names or not file.is_file():
                continue
            text = file.read_text()
            for name in names:
                if not re.search(rf"\b{re.escape(name)}\b", text):
                    out.append(f"docs/testing.md:{n}: {path} has no test `{name}`")
    return out


def main():
    check = "--check" in sys.argv
    problems, count = [], 0
    for page in pages():
        lines = page.read_text().split("\n")
        name = page.relative_to(ROOT)
        if page == README and (START not in lines or END not in lines):
            problems.append(f"README.md has no {START} ... {END} block")
        new = with_toc(lines)
        if new != lines:
            if check:
                problems.append(f"{name}: the table of contents is stale (run .ci/readme_toc.py)")
            else:
                page.write_text("\n".join(new))
                _anchor_cache.pop(page, None)
        problems += broken_links(page, new)
        if page == TESTING:
            problems += missing_tests(new)
        count += 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    if check:
        print(f"README.md and {count - 1} docs pages: tables of contents current, every link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
