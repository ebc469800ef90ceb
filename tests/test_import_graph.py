"""The import rules of docs/architecture.md, read statically off every module
of the ``cgsim`` and ``fuzz`` packages (``ast``; nothing is imported):

1. no cycle among module-level imports, so any module imports on its own
   whatever imported it first (the assertion names each cycle as a path),
   nor among all imports, those inside functions included (a module that
   needs a piece of one that needs it back: the piece has two owners);
2. no module uses a private name of another cgsim or fuzz module, whether
   imported (``from x import _y``) or read off an imported module
   (``x._y``); a private module (``pkg/_y.py``) is private to its package,
   whose own modules may use it;
3. ``cgsim`` never imports ``fuzz``.

How an import statement becomes edges of the graph: ``import a.b.c`` runs
``a``, ``a.b`` and ``a.b.c``; ``from a.b import n`` runs ``a`` and ``a.b``,
and ``a.b.n`` too where ``a/b/n.py`` (or ``a/b/n/__init__.py``) exists, else
``n`` is a name that ``a/b/__init__.py`` (or ``a/b.py``) defines.  Running a
module's own enclosing packages adds no edge (they are initialised before
it, or are initialising it: a package ``__init__`` importing its own
submodules is no cycle), but reading a name one defines does (``from pkg
import name`` inside ``pkg``: a real cycle if ``pkg/__init__`` imports the
module first).  Relative imports resolve against the module's package.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("cgsim", "fuzz")


@dataclass(frozen=True)
class Import:
    importer: str
    line: int
    module: str  # the module the statement names (resolved when relative)
    names: tuple[str, ...]  # from-import: the names taken; import: ()
    binds: tuple[tuple[str, str], ...]  # (local name, the dotted name it stands for)
    module_level: bool  # runs when the importer is imported
    type_only: bool  # under ``if TYPE_CHECKING:``: never runs

    def text(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.importer}:{self.line}: {what}"


def modules(root: str = ROOT) -> dict[str, str]:
    """Module name -> path; a package is named by its ``__init__``."""
    out: dict[str, str] = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                    out[module.removesuffix(".__init__")] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(module: str, tree: ast.AST, is_package: bool) -> list[Import]:
    """Every import statement of a module, each with where it runs."""
    out: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, module_level: bool, type_only: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            module_level = False  # runs when called, after every module-level import is done
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, module_level, True)
            for child in node.orelse:
                visit(child, module_level, type_only)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                binds = ((a.asname, a.name),) if a.asname else ((a.name.partition(".")[0],) * 2,)
                out.append(Import(module, node.lineno, a.name, (), binds, module_level, type_only))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            binds = tuple((a.asname or a.name, f"{base}.{a.name}") for a in node.names)
            out.append(Import(module, node.lineno, base, tuple(a.name for a in node.names), binds, module_level,
                              type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, module_level, type_only)

    visit(tree, True, False)
    return out


def _chain(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: what importing it runs."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def edges(imp: Import, known: dict[str, str]) -> set[str]:
    """The project modules an import statement runs (or reads), as above."""
    own = set(_chain(imp.importer))
    runs = set(_chain(imp.module))
    reads: set[str] = set()
    if imp.names:
        submodules = {f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in known}
        runs |= submodules
        if len(submodules) < len(imp.names):
            reads.add(imp.module)  # a name its __init__ (or the module) defines
    return {m for m in (runs - own) | reads if m in known and m != imp.importer}


@dataclass(frozen=True)
class Project:
    known: dict[str, str]  # module -> path
    trees: dict[str, ast.AST]
    every: list[Import]

    @classmethod
    def read(cls, root: str = ROOT) -> "Project":
        known = modules(root)
        trees, every = {}, []
        for module, path in known.items():
            with open(path, encoding="utf-8") as fh:
                trees[module] = ast.parse(fh.read(), path)
            every += imports(module, trees[module], path.endswith("__init__.py"))
        return cls(known, trees, every)

    def graph(self, deferred: bool = False) -> dict[str, set[str]]:
        """What importing each module runs; with ``deferred``, what running
        it may import too (imports inside functions, which run after every
        module is loaded).  Imports for type checking only never run."""
        g: dict[str, set[str]] = {m: set() for m in self.known}
        for imp in self.every:
            if (imp.module_level or deferred) and not imp.type_only:
                g[imp.importer] |= edges(imp, self.known)
        return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle, as a path ``a, b, ..., a``, per strongly connected
    component of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_path(g, c) for c in components]


def _path(g: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth first)."""
    first = min(component)
    came: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v] & component):
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(came[path[-1]])
                    return path[::-1] + [first]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {first} in {sorted(component)}")


def _private_to(user: str, full: str, known: dict[str, str]) -> str | None:
    """Who may use the dotted name ``full``, if ``user`` may not: a private
    module or package is its package's, a private name a module defines is
    that module's own."""
    parts = full.split(".")
    for i, part in enumerate(parts):
        if not part.startswith("_") or part.startswith("__"):
            continue
        owner = ".".join(parts[:i])
        if ".".join(parts[:i + 1]) in known or i < len(parts) - 1:  # a private module
            if user != owner and not user.startswith(owner + "."):
                return owner
        elif user != owner:
            return owner
    return None


def private_uses(project: Project) -> list[str]:
    """Uses of another project module's private names: imported (function-
    level and type-only imports too: they couple to the name all the same)
    or read as an attribute of a module the user imported (``mod._name``;
    names bound by any import of the module, whatever its scope)."""
    known = project.known
    out = []
    for imp in project.every:
        if not any(m in known for m in _chain(imp.module)):
            continue  # not a project module
        for full in [imp.module] + [f"{imp.module}.{n}" for n in imp.names]:
            owner = _private_to(imp.importer, full, known)
            if owner is not None:
                out.append(f"{imp.text()}  ({full} is private to {owner})")
    for module, tree in project.trees.items():
        bound = {local: target for imp in project.every if imp.importer == module
                 for local, target in imp.binds if target in known}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            chain, base = [], node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name) or base.id not in bound:
                continue
            target = ".".join([bound[base.id]] + chain)
            if target not in known:
                continue  # an attribute of something the module defines, not the module's own name
            owner = _private_to(module, f"{target}.{node.attr}", known)
            if owner is not None:
                out.append(f"{module}:{node.lineno}: {ast.unparse(node)}  ({target}.{node.attr} is private to {owner})")
    return sorted(set(out))


def fuzz_imports(project: Project) -> list[str]:
    return [imp.text() for imp in project.every
            if imp.importer.partition(".")[0] == "cgsim" and imp.module.partition(".")[0] == "fuzz"]


# -- the rules ----------------------------------------------------------------------


def test_no_import_cycles():
    found = cycles(Project.read().graph())
    assert not found, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# Cycles through imports inside functions not yet broken, each with the
# piece both sides need; one that is gone must leave this list.
DEFERRED_CYCLES_LEFT: dict[frozenset, str] = {}


def test_no_import_cycles_through_function_level_imports():
    found = cycles(Project.read().graph(deferred=True))
    new = [c for c in found if frozenset(c) not in DEFERRED_CYCLES_LEFT]
    assert not new, "import cycles (imports inside functions included):\n" + "\n".join(" -> ".join(c) for c in new)
    gone = set(DEFERRED_CYCLES_LEFT) - {frozenset(c) for c in found}
    assert not gone, f"no longer cycles, remove them from DEFERRED_CYCLES_LEFT: {[sorted(c) for c in gone]}"


def test_no_private_names_used_across_modules():
    found = private_uses(Project.read())
    assert not found, "private names used by another module:\n" + "\n".join(found)


def test_cgsim_never_imports_fuzz():
    found = fuzz_imports(Project.read())
    assert not found, "cgsim imports fuzz:\n" + "\n".join(found)


# -- the checker itself, on made-up modules -------------------------------------------

FAKE = {m: f"{m.replace('.', '/')}.py" for m in ("p", "p.a", "p.b", "p.sub", "p.sub.x", "q", "p._priv")}


def _fake(sources: dict[str, str]) -> Project:
    trees = {m: ast.parse(src) for m, src in sources.items()}
    every = [imp for m, tree in trees.items() for imp in imports(m, tree, m in ("p", "p.sub"))]
    return Project({**FAKE, **{m: f"{m.replace('.', '/')}.py" for m in sources}}, trees, every)


def _edges_of(module: str, source: str) -> set[str]:
    return _fake({module: source}).graph()[module]


def test_a_package_init_importing_its_submodules_is_no_cycle():
    # p/__init__ imports p.a; p.a takes its sibling p.b through the package: no edge back to p.
    assert _edges_of("p", "from p import a\n") == {"p.a"}
    assert _edges_of("p.a", "from p import b\nimport p.b\nfrom . import b\n") == {"p.b"}
    # ... but a name p/__init__ defines is read from it: that edge stays.
    assert _edges_of("p.a", "from p import run\n") == {"p"}
    # Outside p, importing p.sub.x runs p and p.sub first.
    assert _edges_of("q", "import p.sub.x\n") == {"p", "p.sub", "p.sub.x"}
    assert _edges_of("q", "from p.sub import x\n") == {"p", "p.sub", "p.sub.x"}
    assert _edges_of("p.sub.x", "from .. import a\nfrom ..b import name\n") == {"p.a", "p.b"}
    assert cycles(_fake({"p": "from p import a\n", "p.a": "from p import run\n"}).graph()) == [["p", "p.a", "p"]]


def test_what_runs_later_or_never_is_no_edge():
    source = ("import q\n"
              "from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    import p.b\nelse:\n    import p.sub\n"
              "try:\n    import p.a\nexcept ImportError:\n    pass\n"
              "class C:\n    import p.sub.x\n"
              "def f():\n    import p._priv\n")
    assert _edges_of("p.c", source) == {"q", "p.sub", "p.a", "p.sub.x"}
    # Counted among all imports: the function's, never the type checker's.
    assert _fake({"p.c": source}).graph(deferred=True)["p.c"] == {"q", "p.sub", "p.a", "p.sub.x", "p._priv"}
    lazy = _fake({"p.a": "from p.b import g\n", "p.b": "def g():\n    from p.a import f\n"})
    assert cycles(lazy.graph()) == [] and cycles(lazy.graph(deferred=True)) == [["p.a", "p.b", "p.a"]]


def test_private_names():
    found = private_uses(_fake({
        "q": "from p.a import _helper, public\nfrom p import _priv\nimport p.a as pa\npa._helper()\npa.public._x\n",
        "p.sub.x": "def f():\n    from p import _priv\n    from p.a import _helper\n    _priv._thing()\n",
        "p.a": "from p._priv import thing\nfrom . import _priv\n_priv.x\n",
    }))
    assert [line.split("  ")[0] for line in found] == [
        "p.sub.x:3: from p.a import _helper", "p.sub.x:4: _priv._thing",
        "q:1: from p.a import _helper, public", "q:2: from p import _priv", "q:4: pa._helper"]


def test_the_cycle_finder_names_a_path():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
