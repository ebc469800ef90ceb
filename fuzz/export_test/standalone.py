"""cgsim code an exported test needs, as standalone source generated from
the real modules (read as files, never retyped), so it cannot drift from
what cgsim runs.

``standalone_source`` takes modules whole (``Part(module)``: every top-level
statement but the docstring, imports, ``__all__`` and the ``omit`` ones) or names from them
(``Part(module, names)``: those definitions only), and follows every name a
taken definition uses that its module defines or imports from ``cgsim``, to
the definition in that module's source (through a package's re-export),
transitively.  Names a definition
imports from outside cgsim (the standard library, torch) become import
statements at the top.  The result imports nothing from cgsim; a name
defined twice (two modules' ``_group``, say) or a cgsim import under an alias
raises ``StandaloneError``, and the writer that asked for it fails loudly.

Two options serve a host module with names of its own: ``provided`` names
are left to the host (vLLM's ``CUDAGraphMode`` for cgsim's, whose runtime
members share their names), never followed; ``annotations=False`` drops the
signatures' annotations (they name cgsim's classes, which the host lacks),
cut out of the source text so that the rest of it, comments included, is
kept as written."""

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
    omit: tuple[str, ...] = ()  # of a whole module: definitions the host has no use for (and what only they use)


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

    def text(self, stmt: ast.stmt, annotations: bool = True) -> str:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        lines = self.lines[first - 1:stmt.end_lineno]
        if not annotations:
            # Cut from the end backwards: earlier offsets stay valid.
            for (l0, c0, l1, c1), replacement in sorted(_annotation_cuts(stmt, self.lines), reverse=True):
                head, tail = lines[l0 - first][:c0], lines[l1 - first][c1:]
                lines[l0 - first:l1 - first + 1] = [head + replacement + tail]
        return "\n".join(lines)


def _annotation_cuts(stmt: ast.stmt, lines: list[str]) -> list[tuple[tuple[int, int, int, int], str]]:
    """(span, replacement) for every annotation of ``stmt``'s functions: an
    annotated argument becomes its bare name (``name=default`` with a default,
    as PEP 8 writes an unannotated one), ``-> T`` goes."""
    cuts = []
    for fn in ast.walk(stmt):
        if isinstance(fn, ast.AnnAssign):
            raise StandaloneError(f"line {fn.lineno}: a variable annotation; the standalone copy drops annotations "
                                  "only from signatures")
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = fn.args
        positional = a.posonlyargs + a.args
        defaults = dict(zip(positional[len(positional) - len(a.defaults):], a.defaults))
        defaults.update((arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)
        for arg in positional + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]:
            if arg.annotation is None:
                continue
            default = defaults.get(arg)
            if default is not None:
                cuts.append(((arg.lineno, arg.col_offset, default.lineno, default.col_offset), arg.arg + "="))
            else:
                cuts.append(((arg.lineno, arg.col_offset, arg.end_lineno, arg.end_col_offset), arg.arg))
        if fn.returns is not None:
            r = fn.returns
            head = lines[r.lineno - 1][:r.col_offset]
            if not head.rstrip().endswith("->"):
                raise StandaloneError(f"line {r.lineno}: a return annotation not on the line of its arrow")
            start = len(head.rstrip()[:-2].rstrip())
            cuts.append(((r.lineno, start, r.end_lineno, r.end_col_offset), ""))
    return cuts


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


def _used_names(stmt: ast.stmt, annotations: bool = True) -> list[str]:
    skipped: set[int] = set()
    if not annotations:
        for fn in ast.walk(stmt):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = fn.args
                args = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]
                for node in [arg.annotation for arg in args] + [fn.returns]:
                    skipped |= {id(n) for n in ast.walk(node)} if node is not None else set()
    return list(dict.fromkeys(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and id(n) not in skipped))


def standalone_source(parts: list[Part]) -> str:
    """The definitions ``parts`` ask for and everything they use from cgsim,
    after the imports they need from elsewhere (``from __future__`` left to
    the caller's module)."""
    imports, body = standalone(parts)
    return "\n".join(imports) + "\n" + body


def standalone(parts: list[Part], provided: frozenset[str] = frozenset(),
               annotations: bool = True) -> tuple[list[str], str]:
    """(the import lines the definitions need from outside cgsim, the definitions).

    ``provided``: names the host module defines itself, left unresolved;
    ``annotations``: False drops the signatures' annotations (and what only
    they use)."""
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
        for n in _used_names(stmt, annotations):
            if n in provided:
                continue
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
                    # A package's re-export (``from cgsim.spec import padding_key``): followed to its definition.
                    while orig not in other.defs and orig in other.imports and _is_cgsim(other.imports[orig][0]) \
                            and other.imports[orig][1:] == (orig, None):
                        other = mod(other.imports[orig][0])
                    if orig not in other.defs:
                        raise StandaloneError(f"{m.name} imports {orig} from {source}, which does not define it "
                                              "at top level, nor re-exports it from a cgsim module that does")
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
            omitted = [m.defs[n] for n in part.omit if n in m.defs]
            if len(omitted) != len(part.omit):
                raise StandaloneError(f"{part.module} defines no {set(part.omit) - set(m.defs)} to omit")
            for i, stmt in enumerate(m.body):
                if not _skipped(stmt, i) and not any(stmt is o for o in omitted):
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
        text = modules[module].text(stmt, annotations)
        if module != current:
            out += "\n\n# from " + module_path(module).replace(_ROOT + os.sep, "") + " (generated from its source)\n"
            current = module
        elif is_def or previous_def:
            out += "\n\n"
        out += text + "\n"
        previous_def = is_def
    return lines, out
