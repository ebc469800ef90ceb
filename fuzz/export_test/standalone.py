"""cgsim code an exported test needs, as standalone source generated from
the real modules (read as files, never retyped), so it cannot drift from
what cgsim runs.

``standalone_source`` takes modules whole (``Part(module)``: every top-level
statement but the docstring, imports and ``__all__``) or names from them
(``Part(module, names)``: those definitions only), and follows every name a
taken definition uses that its module defines or imports from ``cgsim``, to
the definition in that module's source, transitively.  Names a definition
imports from outside cgsim (the standard library, torch) become import
statements at the top.  The result imports nothing from cgsim; a name
defined twice (two modules' ``_group``, say) or a cgsim import under an alias
raises ``StandaloneError``, and the writer that asked for it fails loudly."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

__all__ = ["ROOT_PACKAGE", "Part", "StandaloneError", "module_path", "standalone", "standalone_source"]

ROOT_PACKAGE = "cgsim"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StandaloneError(RuntimeError):
    """cgsim's source changed in a way the generator cannot follow (a bug to fix here)."""


@dataclass(frozen=True)
class Part:
    module: str  # e.g. "cgsim.encoder.toy"
    names: tuple[str, ...] | None = None  # None: the whole module


def module_path(module: str) -> str:
    """The source file of a cgsim module (found on disk; nothing is imported)."""
    base = os.path.join(_ROOT, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    raise StandaloneError(f"no source file for {module} under {_ROOT}")


@dataclass
class _Module:
    name: str
    lines: list[str]
    body: list[ast.stmt]
    defs: dict[str, ast.stmt] = field(default_factory=dict)
    # local name -> (module, name) for ``from m import name``; (module, None) for ``import m``
    imports: dict[str, tuple[str, str | None, str | None]] = field(default_factory=dict)

    @classmethod
    def read(cls, name: str) -> _Module:
        path = module_path(name)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        tree = ast.parse(text, path)
        m = cls(name, text.splitlines(), tree.body)
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defs[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            m.defs[n.id] = stmt
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                m.defs[stmt.target.id] = stmt
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level:
                    raise StandaloneError(f"{name}: a relative import; write it absolute")
                for a in stmt.names:
                    m.imports[a.asname or a.name] = (stmt.module or "", a.name, a.asname)
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    m.imports[a.asname or a.name.split(".")[0]] = (a.name, None, a.asname)
        return m

    def text(self, stmt: ast.stmt) -> str:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        return "\n".join(self.lines[first - 1:stmt.end_lineno])


def _is_cgsim(module: str) -> bool:
    return module == ROOT_PACKAGE or module.startswith(ROOT_PACKAGE + ".")


def _skipped(stmt: ast.stmt, index: int) -> bool:
    """Not taken from a whole module: its docstring, imports and ``__all__``."""
    if index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
            and isinstance(stmt.value.value, str):
        return True
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    return isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)


def _used_names(stmt: ast.stmt) -> list[str]:
    return list(dict.fromkeys(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)))


def standalone_source(parts: list[Part]) -> str:
    """The definitions ``parts`` ask for and everything they use from cgsim,
    after the imports they need from elsewhere (``from __future__`` left to
    the caller's module)."""
    imports, body = standalone(parts)
    return "\n".join(imports) + "\n" + body


def standalone(parts: list[Part]) -> tuple[list[str], str]:
    """(the import lines the definitions need from outside cgsim, the definitions)."""
    modules: dict[str, _Module] = {}

    def mod(name: str) -> _Module:
        if name not in modules:
            modules[name] = _Module.read(name)
        return modules[name]

    taken: list[tuple[str, ast.stmt]] = []  # (module, statement), in emission order
    seen_stmts: set[int] = set()
    owner: dict[str, str] = {}  # emitted top-level name -> its module
    external: dict[str, tuple[str, str | None, str | None]] = {}  # local name -> import

    def claim(m: _Module, stmt: ast.stmt) -> None:
        names = [k for k, v in m.defs.items() if v is stmt]
        for n in names:
            if owner.get(n, m.name) != m.name:
                raise StandaloneError(f"{n} is defined in both {owner[n]} and {m.name}: the standalone copy cannot "
                                      "hold both")
            owner[n] = m.name

    def resolve(m: _Module, stmt: ast.stmt, stack: tuple) -> None:
        """Take what ``stmt`` uses first (depth first), then ``stmt``."""
        if id(stmt) in seen_stmts:
            return
        seen_stmts.add(id(stmt))
        for n in _used_names(stmt):
            dep = m.defs.get(n)
            if dep is not None and dep is not stmt:
                resolve(m, dep, stack + (n,))
            elif n in m.imports and dep is None:
                source, orig, alias = m.imports[n]
                if _is_cgsim(source):
                    if orig is None or alias is not None:
                        raise StandaloneError(f"{m.name} imports {source} as {alias or n}; import names from cgsim "
                                              "modules without aliases for the standalone copy")
                    other = mod(source)
                    if orig not in other.defs:
                        raise StandaloneError(f"{m.name} imports {orig} from {source}, which does not define it "
                                              "at top level (a re-export?); import it from where it is defined")
                    resolve(other, other.defs[orig], stack + (n,))
                elif source != "__future__":
                    if external.get(n, m.imports[n]) != m.imports[n]:
                        raise StandaloneError(f"{n} is imported two ways ({external[n]} and {m.imports[n]})")
                    external[n] = m.imports[n]
        claim(m, stmt)
        taken.append((m.name, stmt))

    for part in parts:
        m = mod(part.module)
        if part.names is None:
            for i, stmt in enumerate(m.body):
                if not _skipped(stmt, i):
                    resolve(m, stmt, ())
        else:
            for n in part.names:
                if n not in m.defs:
                    raise StandaloneError(f"{part.module} defines no {n} at top level")
                resolve(m, m.defs[n], ())

    plain = sorted({f"import {s}" + (f" as {a}" if a else "") for s, o, a in external.values() if o is None})
    froms: dict[str, list[str]] = {}
    for source, orig, alias in external.values():
        if orig is not None:
            froms.setdefault(source, []).append(orig + (f" as {alias}" if alias else ""))
    lines = plain + [f"from {s} import {', '.join(sorted(set(names)))}" for s, names in sorted(froms.items())]
    out = ""
    current, previous_def = None, True
    for module, stmt in taken:
        is_def = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        text = modules[module].text(stmt)
        if module != current:
            out += "\n\n# from " + module_path(module).replace(_ROOT + os.sep, "") + " (generated from its source)\n"
            current = module
        elif is_def or previous_def:
            out += "\n\n"
        out += text + "\n"
        previous_def = is_def
    return lines, out
