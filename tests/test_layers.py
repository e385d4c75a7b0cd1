"""The package layers (docs/architecture.md): the engine core imports no other layer, the server
never imports the lab, workloads stand on the core alone, and no module imports itself back
through any chain of imports (function-level and ``if TYPE_CHECKING:`` imports included: the
HTTP API once named ``Server`` only for its types, the one circle a review found; it now names
what it asks of the server as a Protocol of its own, ``http_api.Host``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "kernels", "app")

# layer -> the layers it may import (besides itself, the standard library and third parties)
ALLOWED = {
    "kernels": set(),
    "engine.core": {"kernels"},
    "engine.workloads": {"engine.core"},
    "engine.server": {"engine.core", "engine.workloads"},
    "engine.lab": {"engine.core", "engine.workloads", "engine.server", "kernels"},
    "engine": {"engine.core", "engine.workloads", "engine.server", "engine.lab"},  # command shims
    "app": {"engine.core", "engine.workloads", "engine.server"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def type_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (
            (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        ):
            out.update(id(n) for child in node.body for n in ast.walk(child))
    return out


def imports(path: Path, known: set[str], runtime_only: bool = False) -> set[str]:
    """Every first-party module ``path`` imports, at any depth of the file (``runtime_only``:
    leaving out the type-only imports under ``if TYPE_CHECKING:``)."""
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = type_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from engine.lab import replay`` imports the module engine.lab.replay; our packages'
            # __init__ files define nothing, so a name that is not a submodule is a stale path
            names = [f"{node.module}.{a.name}" for a in node.names]
            if node.module in known and node.module.split(".")[0] in PACKAGES:
                package = ROOT / node.module.replace(".", "/") / "__init__.py"
                out.update(f"missing:{n}" for n in names if n not in known and package.exists())
            names.append(node.module)
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def layer(name: str) -> str:
    for candidate in sorted(ALLOWED, key=len, reverse=True):
        if name == candidate or name.startswith(candidate + "."):
            return candidate
    raise AssertionError(f"{name} belongs to no layer")


def graph(runtime_only: bool = False) -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {
        m: {d for d in imports(p, known, runtime_only) if d != m and not m.startswith(d + ".")}
        for m, p in mods.items()
    }


def test_every_import_respects_the_layers():
    bad = []
    for mod, deps in graph().items():
        own = layer(mod)
        stale = [d[len("missing:") :] for d in deps if d.startswith("missing:")]
        bad += [f"{mod} imports {name}, which is no module" for name in stale]
        for dep in (d for d in deps if not d.startswith("missing:")):
            other = layer(dep)
            if other != own and other not in ALLOWED[own]:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports across layers that the architecture forbids:\n" + "\n".join(bad)


def test_no_import_cycles():
    g = graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
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
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_layering_test_sees_a_forbidden_import(tmp_path):
    """The checker itself: a core module importing the server is caught."""
    fake = tmp_path / "m.py"
    fake.write_text("def f():\n    from engine.server import protocol\n")
    known = set(modules())
    assert "engine.server.protocol" in imports(fake, known)
    fake.write_text("if TYPE_CHECKING:\n    from engine.server import protocol\n")
    assert "engine.server.protocol" in imports(fake, known)  # a layer is a layer, types too
    assert "engine.server.protocol" not in imports(fake, known, runtime_only=True)
    fake.write_text("from engine import scenario\n")  # a module that moved into engine.lab
    assert "missing:engine.scenario" in imports(fake, known)
