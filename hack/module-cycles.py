#!/usr/bin/env python3
"""List the module dependency edges of a Rust crate and fail on a cycle.

Usage: hack/module-cycles.py SRC_DIR [--layers a,b,c] [--quiet]

SRC_DIR is a crate's source directory (it holds lib.rs or main.rs). The
module tree is read from the `mod` declarations (`#[path]` included), so
every file of the crate is a node. A file depends on another when its code
names an item of the other's module:

- `use` trees and inline paths starting with `crate::`, `$crate::`,
  `super::` or `self::`, or with the name of a child module (edition 2018
  paths), resolved to the deepest module that has a file;
- invocations `name!` of a `macro_rules!` defined in another file, and
  such a macro's name passed in another macro's arguments.

Comments, doc comments and string literals are ignored; a `mod` declaration
alone is containment, not a dependency. Edges are printed between files and
between top-level modules (the layers); a cycle in either graph is printed
and the exit status is 1. With `--layers` (bottom first, comma-separated
top-level module names), an edge from a layer to one above it, or to a
top-level module not in the list, is also an error.

Only the standard library is used, so `make test` can run it anywhere.
"""

import argparse
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The code of `text` with comments and string/char literals blanked
    (newlines kept), so that paths in prose never count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "br" else None
        if m and (i == 0 or not re.match(r"[A-Za-z0-9_]", text[i - 1])):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
            continue
        if c == "'":
            m = re.match(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'", text[i:i + 16])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_use_tree(s, prefix, paths):
    """Expands a use tree (text after `use`, without the `;`) into paths."""
    s = s.strip()
    if not s:
        return
    if s.startswith("{"):
        depth, start, parts = 0, 1, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    parts.append(s[start:k])
                    break
            elif ch == "," and depth == 1:
                parts.append(s[start:k])
                start = k + 1
        for part in parts:
            parse_use_tree(part, prefix, paths)
        return
    m = re.match(r"(::)?\s*(\$?" + IDENT + r"|\*)\s*", s)
    if not m:
        return
    seg, rest = m.group(2), s[m.end():]
    if seg == "*":
        paths.append((prefix, None))
        return
    if rest.startswith("::"):
        parse_use_tree(rest[2:], prefix + [seg], paths)
        return
    alias = re.match(r"as\s+(" + IDENT + r")", rest)
    path = prefix if seg == "self" else prefix + [seg]
    name = alias.group(1) if alias else (prefix[-1] if seg == "self" and prefix else seg)
    paths.append((path, name))


class Crate:
    def __init__(self, src):
        self.src = os.path.abspath(src)
        root = next(
            (os.path.join(self.src, f) for f in ("lib.rs", "main.rs")
             if os.path.exists(os.path.join(self.src, f))),
            None,
        )
        if root is None:
            sys.exit(f"{src}: no lib.rs or main.rs")
        self.files = {}  # module path (tuple) -> file
        self.code = {}  # file -> stripped code
        self.children = {}  # file -> {name: module path}
        self.walk(root, ())

    def walk(self, path, module):
        if path in self.code:
            return
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        code = strip(raw)
        self.files[module] = path
        self.code[path] = code
        self.children[path] = {}
        base = os.path.basename(path)
        own_dir = os.path.dirname(path)
        if base not in ("lib.rs", "main.rs", "mod.rs"):
            own_dir = os.path.join(own_dir, base[:-3])
        # Only declarations outside inline modules name files.
        depth = 0
        for m in re.finditer(
            r"(#\[path\s*=\s*\"([^\"]*)\"\][^;{]*?)?\bmod\s+(" + IDENT + r")\s*;|[{}]", raw_without_comments(raw)
        ):
            tok = m.group(0)
            if tok == "{":
                depth += 1
                continue
            if tok == "}":
                depth -= 1
                continue
            if depth:
                continue
            name, explicit = m.group(3), m.group(2)
            if explicit:
                child = os.path.normpath(os.path.join(os.path.dirname(path), explicit))
            else:
                child = os.path.join(own_dir, name + ".rs")
                if not os.path.exists(child):
                    child = os.path.join(own_dir, name, "mod.rs")
            if not os.path.exists(child):
                continue
            self.children[path][name] = module + (name,)
            self.walk(child, module + (name,))

    def module_of(self, path):
        return next(m for m, f in self.files.items() if f == path)

    def resolve(self, segments):
        """The file of the deepest module named by a path from the root."""
        for k in range(len(segments), -1, -1):
            f = self.files.get(tuple(segments[:k]))
            if f is not None:
                return f
        return None

    def edges(self):
        macros = {}
        for path, code in self.code.items():
            for m in re.finditer(r"\bmacro_rules!\s*(" + IDENT + r")", code):
                macros.setdefault(m.group(1), set()).add(path)
        edges = set()
        for path, code in self.code.items():
            module = self.module_of(path)
            for target in self.references(path, module, code):
                if target != path:
                    edges.add((path, target))
            for m in re.finditer(r"(?<![A-Za-z0-9_$])(" + IDENT + r")!(?!=)\s*([({\[])?", code):
                names = [m.group(1)]
                if m.group(2):
                    # A macro's name passed to another macro is used too
                    # (`cuda_api!(real_fns)`).
                    names += re.findall(IDENT, balanced(code, m.end() - 1))
                for name in names:
                    owners = macros.get(name, set())
                    if path not in owners:
                        edges.update((path, owner) for owner in owners)
        return edges

    def references(self, path, module, code):
        # Inline modules: (name, depth at which it opened).
        stack, depth = [], 0
        children = dict(self.children[path])
        # Modules imported by name (`use crate::memory;`) are path heads too.
        for m in re.finditer(r"\buse\s+([^;]*);", code):
            found = []
            parse_use_tree(m.group(1), [], found)
            for p, name in found:
                if not name or not p or name in children:
                    continue
                absolute = self.absolute_module(p, list(module), children)
                if absolute is not None and absolute in self.files:
                    children[name] = absolute
        token = re.compile(
            r"\bmod\s+(" + IDENT + r")\s*\{|[{}]|\buse\s+([^;]*);|(?<![A-Za-z0-9_:])((?:\$?" + IDENT + r")(?:\s*::\s*(?:" + IDENT + r"|\*|\{))+)"
        )
        for m in token.finditer(code):
            tok = m.group(0)
            if m.group(1):
                depth += 1
                stack.append((m.group(1), depth))
                continue
            if tok == "{":
                depth += 1
                continue
            if tok == "}":
                if stack and stack[-1][1] == depth:
                    stack.pop()
                depth -= 1
                continue
            here = list(module) + [name for name, _ in stack]
            paths = []
            if m.group(2) is not None:
                found = []
                parse_use_tree(m.group(2), [], found)
                paths = [p for p, _ in found]
            else:
                paths = [[s.strip() for s in re.split(r"::", m.group(3)) if s.strip() not in ("", "{", "*")]]
            for p in paths:
                target = self.absolute(p, here, stack, children)
                if target is not None:
                    yield target

    def absolute_module(self, p, here, children):
        """The module path a use path names, when it names a module."""
        head = p[0]
        if head in ("crate", "$crate"):
            return tuple(p[1:])
        if head in ("super", "self"):
            cur = list(here)
            k = 0
            while k < len(p) and p[k] in ("super", "self"):
                if p[k] == "super":
                    if not cur:
                        return None
                    cur.pop()
                k += 1
            return tuple(cur + p[k:])
        if head in children:
            return tuple(children[head]) + tuple(p[1:])
        return None

    def absolute(self, p, here, stack, children):
        if not p:
            return None
        head = p[0]
        if head in ("crate", "$crate"):
            return self.resolve(p[1:])
        if head in ("super", "self"):
            cur = list(here)
            k = 0
            while k < len(p) and p[k] in ("super", "self"):
                if p[k] == "super":
                    if not cur:
                        return None
                    cur.pop()
                k += 1
            return self.resolve(cur + p[k:])
        if not stack and head in children:
            return self.resolve(list(children[head]) + p[1:])
        return None


def balanced(code, start):
    """The text inside the bracket at `start` and its match."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for k in range(start, len(code)):
        ch = code[k]
        if ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return code[start + 1:k]
    return code[start + 1:]


def raw_without_comments(raw):
    """Comments and strings blanked, attributes kept (for `#[path]`)."""
    kept = []
    for m in re.finditer(r"#\[path\s*=\s*\"[^\"]*\"\]", raw):
        kept.append((m.start(), m.group(0)))
    code = list(strip(raw))
    for start, text in kept:
        code[start:start + len(text)] = list(text)
    return "".join(code)


def sccs(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    succ = {n: sorted({b for a, b in edges if a == n}) for n in nodes}
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def topo(nodes, edges):
    """Nodes ordered so that each comes after everything it depends on."""
    deps = {n: {b for a, b in edges if a == n} for n in nodes}
    order, done = [], set()
    while len(done) < len(nodes):
        ready = sorted(n for n in nodes if n not in done and deps[n] <= done)
        if not ready:
            break
        order.extend(ready)
        done.update(ready)
    return order


def main(argv):
    parser = argparse.ArgumentParser(
        description="List a Rust crate's module dependency edges; exit 1 on a cycle."
    )
    parser.add_argument("src", help="the crate's source directory (holding lib.rs or main.rs)")
    parser.add_argument(
        "--layers",
        default="",
        help="top-level modules, bottom first, comma-separated: an edge upwards is an error",
    )
    parser.add_argument("--quiet", action="store_true", help="print only errors")
    opts = parser.parse_args(argv)
    crate = Crate(opts.src)
    quiet = opts.quiet
    rel = lambda f: os.path.relpath(f, crate.src)
    nodes = set(crate.code)
    edges = crate.edges()
    layer = lambda f: crate.module_of(f)[0] if crate.module_of(f) else "(root)"
    layer_nodes = {layer(f) for f in nodes}
    layer_edges = {(layer(a), layer(b)) for a, b in edges if layer(a) != layer(b)}

    if not quiet:
        print(f"# {opts.src}: {len(nodes)} files, {len(edges)} file edges")
        print("\n## layers (top-level modules), bottom first")
        for n in topo(layer_nodes, layer_edges):
            below = sorted(b for a, b in layer_edges if a == n)
            print(f"{n} -> {', '.join(below) if below else '(nothing)'}")
        print("\n## files, bottom first")
        for f in topo(nodes, edges):
            below = sorted(rel(b) for a, b in edges if a == f)
            print(f"{rel(f)} -> {', '.join(below) if below else '(nothing)'}")

    status = 0
    for name, comps in (("layer", sccs(layer_nodes, layer_edges)), ("file", sccs(nodes, edges))):
        for comp in comps:
            status = 1
            shown = comp if name == "layer" else [rel(f) for f in comp]
            print(f"CYCLE between {name}s: {' <-> '.join(shown)}", file=sys.stderr)
            members = set(comp)
            for a, b in sorted(layer_edges if name == "layer" else edges):
                if a in members and b in members:
                    a_, b_ = (a, b) if name == "layer" else (rel(a), rel(b))
                    print(f"    {a_} -> {b_}", file=sys.stderr)
    if opts.layers:
        order = [l for l in opts.layers.split(",") if l]
        rank = {l: i for i, l in enumerate(order)}
        for a, b in sorted(layer_edges):
            if a == "(root)":
                continue
            if a not in rank or b not in rank:
                status = 1
                print(f"LAYER not in --layers: {a} -> {b}", file=sys.stderr)
            elif rank[b] > rank[a]:
                status = 1
                print(f"UPWARD edge: {a} -> {b} ({' → '.join(order)})", file=sys.stderr)
    if status == 0 and not quiet:
        print(f"\nno cycle: {len(layer_nodes)} layers, {len(nodes)} files")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
