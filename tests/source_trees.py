"""cgsim's own source, parsed, for the tests that scan it for a pattern
(hooks fetched by name, engine names compared, families tested)."""

from __future__ import annotations

import ast
import os
from typing import Iterable


def parsed_modules(root: str, packages: Iterable[str] = ("cgsim", "fuzz"),
                   skip: tuple[str, ...] = ()) -> list[tuple[str, ast.Module]]:
    """(path relative to ``root`` with "/", its syntax tree) of each module of
    ``packages`` whose relative path starts with none of ``skip``, in order."""
    out = []
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if skip and rel.startswith(skip):
                    continue
                with open(path, encoding="utf-8") as fh:
                    out.append((rel, ast.parse(fh.read(), rel)))
    return out


def string_literals(node: ast.AST) -> list[str]:
    """The strings ``node`` is, or holds as a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [lit for e in node.elts for lit in string_literals(e)]
    return []
