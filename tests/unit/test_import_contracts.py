"""The import contracts of docs/architecture.md, checked on the source (a small AST walk).

- The library (``shared/mgrpo``) never imports the top-level ``services`` package (the
  container shells call the library, never the reverse), at module level or in a function.
- ``mgrpo.algo`` is pure math: it imports only ``mgrpo.algo`` itself, torch, numpy, pydantic
  and the standard library.
- The ground floor (``mgrpo/*.py``) imports no room, only itself, at module level or in a
  function.
- The room order: a room never imports the rooms above it (:data:`ABOVE`), at module level
  or in a function (an ``if TYPE_CHECKING:`` block, annotations only, may: the workflow
  spec names the ``RunConfig`` it reads).
- No first-party import circle, at module level (the imports a module runs when it is
  imported) nor with the imports inside functions counted too (``if TYPE_CHECKING:`` blocks
  left out): e.g. a workflow is a spec the training side plays (``mgrpo.training.runners``),
  never the reverse.
- A first-party import inside a function in the library says why it is there: a comment on
  its line or on the line above its block of imports (an import circle, or what it keeps out
  of the CLI's start or of a light module's import).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "shared"
SHELLS = ROOT / "services"
ALGO_ALLOWED = {"torch", "numpy", "pydantic", "__future__"}
# the one registry form (standard library only): algorithms and estimators register there
ALGO_ALLOWED_MODULES = {"mgrpo.registry"}
# room (or module) -> the rooms and modules above it, which it never imports
# (docs/architecture.md)
ABOVE = {
    "mgrpo.parallel": ("mgrpo.training", "mgrpo.experiments", "mgrpo.services", "mgrpo.cli",
                       "mgrpo.dashboard"),
    # the training loop < the experiments on it (demo, ablations, plots, ...) < the CLI;
    # the services run the loop and never an experiment
    "mgrpo.training": ("mgrpo.experiments", "mgrpo.services", "mgrpo.cli", "mgrpo.dashboard"),
    # a workflow is a spec (roles, turn order, rewards, checks) < the training side that
    # plays it (mgrpo.training.runners)
    "mgrpo.workflows": ("mgrpo.training", "mgrpo.experiments", "mgrpo.services", "mgrpo.cli",
                        "mgrpo.dashboard"),
    "mgrpo.experiments": ("mgrpo.services", "mgrpo.cli", "mgrpo.dashboard"),
    # the dashboard's data and run folder < the API that serves them < the CLI that composes
    # `mgrpo ui`'s app
    "mgrpo.dashboard": ("mgrpo.services", "mgrpo.experiments", "mgrpo.cli"),
    "mgrpo.services": ("mgrpo.experiments", "mgrpo.cli"),
    # the HTTP plumbing of every app < the sandbox service < the services that call it
    "mgrpo.web": ("mgrpo.sandbox", "mgrpo.services", "mgrpo.dashboard", "mgrpo.training",
                  "mgrpo.experiments", "mgrpo.cli"),
    "mgrpo.sandbox": ("mgrpo.services", "mgrpo.dashboard", "mgrpo.training",
                      "mgrpo.experiments", "mgrpo.cli"),
    # config text < the run config < its overrides < which file is which kind
    "mgrpo.training.config_yaml": ("mgrpo.training.config", "mgrpo.training.overrides",
                                   "mgrpo.training.config_files"),
    "mgrpo.training.config": ("mgrpo.training.overrides", "mgrpo.training.config_files"),
    "mgrpo.training.overrides": ("mgrpo.training.config_files",),
}
# mgrpo.services: the parts' rooms (planner, subagent, trainer, control) never import each
# other, the API or the entry points; the shared pieces at mgrpo.services level import none
# of those
SERVICE_PARTS = ("mgrpo.services.planner", "mgrpo.services.subagent", "mgrpo.services.trainer",
                 "mgrpo.services.control")
SERVICES_TOP = ("mgrpo.services.api", "mgrpo.services.entrypoints")
SERVICES_SHARED = ("batching", "checkpoints", "context", "dependencies", "dispatch", "health",
                   "launcher", "process", "rounds", "tree_calls")
ABOVE.update({part: tuple(p for p in SERVICE_PARTS if p != part) + SERVICES_TOP
              for part in SERVICE_PARTS})
ABOVE.update({f"mgrpo.services.{name}": SERVICE_PARTS + SERVICES_TOP
              for name in SERVICES_SHARED})


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """First-party module name -> file: the library and the container shells."""
    found = {module_name(p, LIBRARY): p for p in (LIBRARY / "mgrpo").rglob("*.py")}
    found.update({module_name(p, ROOT): p for p in SHELLS.rglob("*.py")})
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, name: str, module_level: bool,
            type_checking: bool | None = None) -> list[tuple[str, int]]:
    """(imported module, line) of every import in ``path`` (module ``name``); with
    ``module_level``, only those run at import time (not in functions or TYPE_CHECKING).
    ``type_checking``: count the ``if TYPE_CHECKING:`` blocks (default: not
    ``module_level``)."""
    if type_checking is None:
        type_checking = not module_level
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                           | ast.Lambda):
                continue
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                out.append((base, child.lineno))
                out.extend((f"{base}.{alias.name}", child.lineno) for alias in child.names)
            visit(child)

    visit(tree)
    return out


def first_party_graph(module_level: bool = True) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports at module level (``module_level=False``:
    in functions too); ``if TYPE_CHECKING:`` blocks left out."""
    modules = sources()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {target for target, _ in imports(path, name, module_level,
                                                       type_checking=False)
                       if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_library_never_imports_the_service_shells():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in sources().items() if name.startswith("mgrpo")
           for target, line in imports(path, name, module_level=False)
           if target == "services" or target.startswith("services.")]
    assert not bad, "the library imports the container shells (call it from them):\n" + \
        "\n".join(bad)


def test_algo_imports_only_algo_torch_numpy_pydantic_and_the_standard_library():
    allowed = ALGO_ALLOWED | set(sys.stdlib_module_names)
    bad = []
    for name, path in sources().items():
        if name != "mgrpo.algo" and not name.startswith("mgrpo.algo."):
            continue
        for target, line in imports(path, name, module_level=False):
            top = target.partition(".")[0]
            if target == "mgrpo.algo" or target.startswith("mgrpo.algo.") or top in allowed \
                    or target.rpartition(".")[0] in ALGO_ALLOWED_MODULES \
                    or target in ALGO_ALLOWED_MODULES:
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "mgrpo.algo is pure math (torch, numpy, pydantic, stdlib, registry):\n" + \
        "\n".join(bad)


IMPORT_LINE = re.compile(r"^\s*(from \S+ import|import \S)|^\s*\)\s*$|^\s*[\w, ]+,\s*$")


def unexplained_imports(path: Path) -> list[int]:
    """Lines of first-party imports inside functions with no comment on the line or above
    their block (the imports and blank lines right before it)."""
    lines = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for child in ast.walk(node):
            first_party = isinstance(child, ast.ImportFrom) and not child.level and \
                (child.module or "").split(".")[0] == "mgrpo" or \
                isinstance(child, ast.Import) and any(a.name.split(".")[0] == "mgrpo"
                                                      for a in child.names)
            if not first_party or "#" in lines[child.lineno - 1]:
                continue
            above = child.lineno - 2
            while above >= 0 and (not lines[above].strip() or IMPORT_LINE.match(lines[above])):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                out.append(child.lineno)
    return out


def test_function_level_first_party_imports_say_why():
    bad = [f"{path.relative_to(ROOT)}:{line}" for name, path in sources().items()
           if name.startswith("mgrpo") for line in unexplained_imports(path)]
    assert not bad, "a first-party import inside a function with no comment saying why " \
        "(move it to the top, or say which circle or heavy import it avoids):\n" + \
        "\n".join(bad)


def test_the_why_check_sees_a_silent_function_level_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\n\ndef f():\n    x = 1\n\n    from mgrpo import a\n"
                      "\n\ndef g():\n    # on use: a circle through mgrpo.b\n"
                      "    import json\n\n    from mgrpo.b import (\n        c,\n    )\n"
                      "    from mgrpo import d\n    from mgrpo import e  # why\n")
    assert unexplained_imports(source) == [7]


def in_room(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def test_no_room_imports_a_room_above_it():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in sources().items() for room, above in ABOVE.items()
           if in_room(name, room)
           for target, line in imports(path, name, module_level=False, type_checking=False)
           if any(in_room(target, upper) for upper in above)]
    assert not bad, "a room imports a room above it (hand the work down instead):\n" + \
        "\n".join(bad)


def ground_floor() -> set[str]:
    """The ground floor's modules: ``shared/mgrpo/*.py`` (config, errors, validation, ...)."""
    return {f"mgrpo.{path.stem}" for path in (LIBRARY / "mgrpo").glob("*.py")
            if path.name != "__init__.py"}


def test_the_ground_floor_imports_no_room():
    """``mgrpo/*.py`` imports only the ground floor, at module level or in a function: e.g.
    ``validation`` names the ``MGRPO_*`` variables of the settings classes its caller hands
    it (``services.process``), and imports neither ``mgrpo.sandbox`` nor any other room."""
    floor = ground_floor()
    bad = [f"{path.relative_to(ROOT)}:{line} imports {target}"
           for name, path in sources().items() if name in floor
           for target, line in imports(path, name, module_level=False, type_checking=False)
           if in_room(target, "mgrpo") and target != "mgrpo"
           and ".".join(target.split(".")[:2]) not in floor]
    assert not bad, "the ground floor imports a room (pass what it needs in instead):\n" + \
        "\n".join(bad)


def test_no_module_level_first_party_import_circle():
    found = cycles(first_party_graph())
    assert not found, "module-level import circles (move the shared piece down a room, or " \
        "import inside the function with a comment why):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_no_first_party_import_circle_with_function_level_imports():
    """No circle even counting the imports inside functions (``if TYPE_CHECKING:`` left out):
    e.g. mgrpo.training and mgrpo.workflows never import each other; a workflow is a spec the
    training side plays (``mgrpo.training.runners``)."""
    found = cycles(first_party_graph(module_level=False))
    assert not found, "import circles, function-level imports counted (move the shared " \
        "piece down a room):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_a_circle_and_a_forbidden_import(tmp_path):
    """The walk itself: a two-module circle is found, a function-level import is not an
    edge, and relative imports resolve."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("from . import a\ndef f():\n    import pkg.c\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.b\n")
    names = {module_name(p, tmp_path): p for p in (tmp_path / "pkg").rglob("*.py")}
    graph = {n: {t for t, _ in imports(p, n, module_level=True) if t in names and t != n}
             for n, p in names.items()}
    assert graph["pkg.b"] == {"pkg", "pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    # with function-level imports counted, b -> c is an edge (and c -> b closes a circle)
    deep = {n: {t for t, _ in imports(p, n, module_level=False, type_checking=False)
                if t in names and t != n} for n, p in names.items()}
    assert deep["pkg.b"] == {"pkg", "pkg.a", "pkg.c"}
    assert cycles(deep) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_container_shells_are_the_librarys_entry_points():
    """``services/<name>/`` only names the library's entry point (the CLI runs the same)."""
    from mgrpo.sandbox.app import create_app
    from mgrpo.services import entrypoints
    from services.control import main as control
    from services.planner import app, worker
    from services.sandbox import app as sandbox_app
    from services.subagent import main as subagent
    from services.trainer import main as trainer

    assert app.main is entrypoints.serve_api
    assert worker.main is entrypoints.serve_planner_worker
    assert subagent.main is entrypoints.serve_subagent
    assert trainer.main is entrypoints.serve_trainer
    assert control.main is entrypoints.serve_control
    assert sandbox_app.create_app is create_app
