#!/usr/bin/env python3
"""The README's table of contents, made from its `##` and `###` headings.

    .ci/readme_toc.py           rewrite the block between <!-- toc --> and <!-- /toc -->
    .ci/readme_toc.py --check   exit 1 if that block is stale or a `](#anchor)` link
                                names no heading (the code gate runs this)

Anchors follow GitHub's rule: lower case, punctuation other than `-` and `_` dropped,
spaces made `-`, and `-1`, `-2`, ... appended to repeated headings.
"""
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- toc -->", "<!-- /toc -->"


def anchor(title, seen):
    text = re.sub(r"`", "", title).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    n = seen.get(text, 0)
    seen[text] = n + 1
    return text if n == 0 else f"{text}-{n}"


def headings(lines):
    """(level, title, anchor) of every heading outside fenced code blocks."""
    seen, out, fenced = {}, [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^(#{1,6}) (.+?)\s*$", line)
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


def main():
    text = README.read_text()
    lines = text.split("\n")
    if START not in lines or END not in lines:
        print(f"README.md has no {START} ... {END} block", file=sys.stderr)
        return 1
    i, j = lines.index(START), lines.index(END)
    new = lines[:i] + toc(lines[:i] + lines[j + 1:]) + lines[j + 1:]
    anchors = {a for _, _, a in headings(new)}
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", "\n".join(new))) - anchors)
    if "--check" in sys.argv:
        ok = True
        if new != lines:
            print("README.md: the table of contents is stale (run .ci/readme_toc.py)", file=sys.stderr)
            ok = False
        for b in broken:
            print(f"README.md: a link to #{b} names no heading", file=sys.stderr)
            ok = False
        if ok:
            print(f"README.md: table of contents current, {len(anchors)} anchors, no broken links")
        return 0 if ok else 1
    README.write_text("\n".join(new))
    for b in broken:
        print(f"README.md: a link to #{b} names no heading", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
