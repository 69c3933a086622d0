#!/usr/bin/env python3
"""Every key of conf/ferrymq.toml is documented in docs/configuration.md, with its default.

    .ci/config_keys.py      exit 1, naming each key, if one is missing or its default differs

A key is every `key = value` line of conf/ferrymq.toml, also the commented-out ones
(`# allow_anonymous = true`: keys that are unset by default) and those under a
commented-out `# [[bridge.mqtt]]` header. The reference must have a table row whose first
cell is the full key in backticks (`` `mqtt.listen` ``; `` `bridge.mqtt[].topic` `` for a
key of an array of tables) and whose last cell, its meaning, is not empty. For a key that
is set in the file, the row's default cell must hold the value as the file writes it
(strings without their quotes, `""` for an empty one: `` `./data` ``, `` `[]` ``,
`` `0.75` ``), so a changed default shows up here too.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf" / "ferrymq.toml"
DOC = ROOT / "docs" / "configuration.md"

HEADER = re.compile(r"^#?\s?\[(\[?)([a-z_.]+)\]?\]\s*$")
KEY = re.compile(r"^(#\s?)?([a-z_][a-z0-9_]*)\s*=\s*(.*)$")


def value_text(raw):
    """The value as the file writes it, without an inline comment."""
    raw = raw.strip()
    if raw.startswith('"'):
        end = raw.index('"', 1)
        return raw[1:end] or '""'
    if raw.startswith("["):
        depth = 0
        for i, c in enumerate(raw):
            depth += c == "["
            depth -= c == "]"
            if depth == 0:
                return raw[: i + 1]
    return raw.split("#", 1)[0].strip()


def conf_keys():
    """(full key, default text or None when commented out) of every key in the file."""
    keys, section, array = [], None, False
    for line in CONF.read_text().split("\n"):
        h = HEADER.match(line)
        if h:
            section, array = h.group(2), bool(h.group(1))
            continue
        k = KEY.match(line)
        if not k or section is None:
            continue
        commented, name, raw = bool(k.group(1)), k.group(2), k.group(3)
        full = f"{section}[].{name}" if array else f"{section}.{name}"
        keys.append((full, None if commented else value_text(raw)))
    return keys


def cells(row):
    """The cells of a Markdown table row (`\\|` is not a separator)."""
    parts = re.split(r"(?<!\\)\|", row.strip())
    return [p.strip() for p in parts[1:-1]]


def documented():
    """First cell -> (default cell, meaning cell) of every table row of the reference."""
    rows = {}
    for line in DOC.read_text().split("\n"):
        if line.startswith("|"):
            c = cells(line)
            if len(c) >= 3:
                rows.setdefault(c[0], (c[1], c[-1]))
    return rows


def main():
    rows = documented()
    problems = []
    keys = conf_keys()
    for full, default in keys:
        row = rows.get(f"`{full}`")
        if row is None:
            problems.append(f"`{full}` is in conf/ferrymq.toml but has no row in docs/configuration.md")
            continue
        doc_default, meaning = row
        if not meaning:
            problems.append(f"docs/configuration.md: `{full}` has no meaning")
        if default is not None and f"`{default}`" not in doc_default:
            problems.append(
                f"docs/configuration.md: `{full}`: the default is `{default}` in conf/ferrymq.toml, "
                f"the row says {doc_default or 'nothing'}"
            )
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"docs/configuration.md documents all {len(keys)} keys of conf/ferrymq.toml with their defaults")
    return 0


if __name__ == "__main__":
    sys.exit(main())
