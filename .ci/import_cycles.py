#!/usr/bin/env python3
"""Import circles between the source files of a crate: every file's references to other
modules of the same crate (`use crate::..`, `use super::..`, `crate::a::b` paths in code),
resolved to files, and the strongly connected components of that graph.

Usage: import_cycles.py [CRATE_SRC_DIR...]   (default: src)

Prints every group of more than one file that import each other (a strongly connected
component), and exits 1 if a group holds a circle of more than three files: a file that
reaches itself again through three or more others (the layout rule of issue 25, item 6).
A group may be larger and still pass: a type whose `impl` blocks are spread over a
module's files makes the parent and each child import each other, a star of short
circles, and the script prints the longest circle of every group it fails. Comments, string
literals and `#[cfg(test)] mod ... { }` blocks do not count.

IMPORT_CYCLES_ALLOW (paths separated by spaces or commas, as printed, e.g.
`src/composition/config.rs`): a group containing one of them is still printed, marked `allowed`, but
does not fail the check. It is for a circle whose untangling is under way elsewhere."""
import os, re, sys

def module_files(root):
    files = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'):
                rel = rel[:-1]
            files[tuple(rel)] = p
    return files

def strip(s):
    s = re.sub(r'//[^\n]*', '', s)
    s = re.sub(r'/\*.*?\*/', '', s, flags=re.S)
    s = re.sub(r'"(\\.|[^"\\])*"', '""', s)
    return s

def expand(tree):
    """Expands `a::{b, c::{d, e}}` into paths."""
    tree = tree.strip()
    i = tree.find('{')
    if i < 0:
        return [tree.split(' as ')[0].strip()]
    prefix = tree[:i]
    body = tree[i+1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for ch in body:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            for e in expand(p):
                out.append(prefix + e)
    return out

def resolve(path, here, files, is_dir_mod):
    segs = [s for s in path.split('::') if s]
    if not segs: return None
    if segs[0] == 'crate':
        base = []; segs = segs[1:]
    elif segs[0] in ('super', 'self'):
        base = list(here) if is_dir_mod else list(here[:-1]) if here else []
        # `self` in a file module refers to the module itself
        if not is_dir_mod:
            base = list(here)
        while segs and segs[0] in ('super', 'self'):
            if segs[0] == 'super':
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    best = None
    for k in range(len(segs) + 1):
        cand = tuple(base + segs[:k])
        if cand in files:
            best = cand
    return best

def graph(root):
    files = module_files(root)
    edges = {m: set() for m in files}
    for m, p in files.items():
        src = strip(open(p).read())
        # drop #[cfg(test)] mod tests { ... } blocks: test code does not count
        src = re.sub(r'#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*', '', src, flags=re.S)
        is_dir = os.path.basename(p) in ('mod.rs', 'lib.rs', 'main.rs')
        paths = []
        for u in re.finditer(r'\buse\s+([^;]+);', src):
            paths += expand(u.group(1))
        paths += re.findall(r'\b((?:crate|super|self)(?:::\w+)+)', src)
        for path in paths:
            t = resolve(path, m, files, is_dir)
            if t is not None and t != m:
                edges[m].add(t)
    return files, edges

def sccs(edges):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            out.append(comp)
    for v in sorted(edges):
        if v not in index: visit(v)
    return out

def long_circle(comp, edges, limit):
    """A simple circle of more than `limit` files within the group `comp`, or None (a
    depth-first walk over simple paths; the groups are small)."""
    inside = set(comp)
    order = sorted(comp)
    rank = {m: i for i, m in enumerate(order)}
    for start in order:
        # Circles through `start` using only files ranked after it: each circle found once.
        stack = [(start, [start])]
        while stack:
            v, path = stack.pop()
            for w in sorted(edges[v]):
                if w not in inside or rank[w] < rank[start]:
                    continue
                if w == start:
                    if len(path) > limit:
                        return path
                elif w not in path:
                    stack.append((w, path + [w]))
    return None

if __name__ == '__main__':
    limit = 3
    roots = sys.argv[1:] or ['src']
    allow = {os.path.normpath(p) for p in re.split(r'[\s,]+', os.environ.get('IMPORT_CYCLES_ALLOW', '')) if p}
    bad = 0
    for root in roots:
        files, edges = graph(root)
        for comp in sccs(edges):
            if len(comp) > 1:
                names = sorted(files[m] for m in comp)
                flag = 'ok'
                circle = long_circle(comp, edges, limit) if len(comp) > limit else None
                if circle:
                    if allow & {os.path.normpath(n) for n in names}:
                        flag = 'TOO BIG, allowed (IMPORT_CYCLES_ALLOW)'
                    else:
                        flag = 'TOO BIG'
                        bad += 1
                print(f'{len(comp):3} {flag}: ' + ' '.join(names))
                if circle:
                    print('      circle: ' + ' -> '.join(files[m] for m in circle + [circle[0]]))
    if bad:
        print(f'{bad} group(s) with an import circle of more than {limit} files: move code so that the files '
              'depend on each other one way (see docs/architecture.md)')
    sys.exit(1 if bad else 0)
