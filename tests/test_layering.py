"""kvsim's import layering (issue 15; docs/architecture.md, "Layers").

Every kvsim module is parsed with ``ast``. An *import* is any ``import``/``from ... import``
statement naming a kvsim module, at module level or inside a function or class (as import-linter and
grimp count them), plus ``importlib.import_module("kvsim...")`` with a literal name; imports under
``if TYPE_CHECKING:`` are left out (they never run). ``from kvsim.x import y`` counts as an import
of the module ``kvsim.x.y`` when that is a module, else of ``kvsim.x``.

A *component* is a top-level piece of the package: ``kvsim.timing`` for every module under
kvsim/timing/, ``kvsim.errors`` for kvsim/errors.py, and ``kvsim`` for the package root
(kvsim/__init__.py, a facade that lazily re-exports the API). :data:`LAYERS` orders the components,
lowest first; the names in one layer are independent siblings. The checks:

(a) every import from one component into another goes strictly down the order (siblings in one
    layer do not import each other), and every component is declared exactly once;
(b) no cycle among modules, counting module-level imports (what runs when a module is imported);
(c) no cycle among components, counting all imports (nor among modules counting all imports).

Each check is also run on a planted violation below, so none of them passes vacuously.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvsim"

# The declared order, lowest first. A component may import only components in layers below its own.
# docs/architecture.md ("Layers") lists the same order (checked by test_docs_list_the_declared_layers).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("kvsim.errors", "kvsim.version", "kvsim.hw", "kvsim.record", "kvsim.cliargs", "kvsim.units"),  # leaf utilities: import no kvsim module
    ("kvsim.config_base", "kvsim.yamlio"),
    ("kvsim.registry", "kvsim.outdir"),
    ("kvsim.models", "kvsim.trace", "kvsim.calibration_data"),  # inputs: models, traces, calibration files
    ("kvsim.timing", "kvsim.frontend", "kvsim.client"),
    ("kvsim.kv",),
    ("kvsim.sched",),
    ("kvsim.metrics",),
    ("kvsim.fast",),
    ("kvsim.replica",),  # one engine replica's state and fast-path install (plain Python)
    ("kvsim.engine",),
    ("kvsim.config",),
    ("kvsim.build",),  # a run's parts (allocator, timing, scheduler, replicas) built from a scenario
    ("kvsim.simulate",),
    ("kvsim.results", "kvsim.plots"),
    ("kvsim.dropped",),
    ("kvsim.report",),
    ("kvsim.realengine",),  # a running engine (vLLM) beside the simulator: replay and engine calibration
    ("kvsim.api", "kvsim.capacity", "kvsim.calibration", "kvsim.kernel_cli", "kvsim.memory_cli", "kvsim.conformance",
     "kvsim.servebench"),  # tools over the run
    ("kvsim.sweep",),
    ("kvsim.cli", "kvsim"),  # the command line; the package root's lazy facade
    ("kvsim.__main__",),
)


@dataclass(frozen=True)
class Import:
    importer: str  # module, e.g. "kvsim.sched.scheduler"
    imported: str  # module, e.g. "kvsim.kv.base"
    line: int
    module_level: bool  # False: inside a function (runs when called)


# -- scanning --------------------------------------------------------------------------------------

def module_files(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package __init__)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(name: str, modules) -> str:
    """The longest prefix of ``name`` that is a kvsim module (an attribute import names its module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports_in(source: str, module: str, is_pkg: bool, modules) -> list[Import]:
    """The kvsim imports in one module's source (see the module docstring for what counts)."""
    package = module if is_pkg else module.rpartition(".")[0]
    found: list[Import] = []

    def add(target: str, node: ast.AST, module_level: bool) -> None:
        if target == "kvsim" or target.startswith("kvsim."):
            imp = Import(module, _resolve(target, modules), node.lineno, module_level)
            if imp not in found:  # `from m import a, b` is one import of m
                found.append(imp)

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:  # the else branch runs
                    visit_one(other, module_level)
                continue
            visit_one(child, module_level)

    def visit_one(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node, module_level)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source_mod = ".".join(base + ([node.module] if node.module else []))
            else:
                source_mod = node.module or ""
            for alias in node.names:
                sub = f"{source_mod}.{alias.name}"
                add(sub if sub in modules else source_mod, node, module_level)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            add(node.args[0].value, node, module_level)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                visit_one(other, module_level)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            visit(node, False)
        else:
            visit(node, module_level)

    visit(ast.parse(source), True)
    return found


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or \
        (isinstance(func, ast.Name) and func.id == "import_module")


@lru_cache(maxsize=1)
def all_imports() -> tuple[Import, ...]:
    modules = module_files()
    out: list[Import] = []
    for name, (path, is_pkg) in modules.items():
        out.extend(imports_in(path.read_text(encoding="utf-8"), name, is_pkg, modules))
    return tuple(out)


def component(module: str) -> str:
    return ".".join(module.split(".")[:2])


# -- the checks (pure functions of the imports, so that planted violations can exercise them) -----

def layer_index(layers) -> dict[str, int]:
    return {name: i for i, layer in enumerate(layers) for name in layer}


def undeclared(components: set[str], layers) -> list[str]:
    problems = []
    declared = [name for layer in layers for name in layer]
    for name in sorted(components - set(declared)):
        problems.append(f"{name} is in no layer: add it to LAYERS in tests/test_layering.py and to "
                        f"docs/architecture.md ('Layers')")
    for name in sorted(set(declared) - components):
        problems.append(f"{name} is declared in LAYERS but no such module exists")
    for name in sorted({n for n in declared if declared.count(n) > 1}):
        problems.append(f"{name} is declared in more than one layer")
    return problems


def upward_edges(imports, layers) -> list[str]:
    """Imports between components that do not go strictly down the declared order."""
    index = layer_index(layers)
    problems = []
    for imp in imports:
        src, dst = component(imp.importer), component(imp.imported)
        if src == dst or src not in index or dst not in index:
            continue  # inside one component; undeclared components are reported by undeclared()
        if index[dst] < index[src]:
            continue
        how = "a sibling in the same layer" if index[dst] == index[src] else "a higher layer"
        problems.append(f"{imp.importer} (line {imp.line}, layer {index[src]}: {src}) imports {imp.imported} "
                        f"(layer {index[dst]}: {dst}), {how}: move the code to the layer it belongs "
                        f"to, or hand it down through a Protocol declared below")
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (or a self-loop), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1 or node in edges.get(node, ()):
                        found.append(sorted(comp))
    return found


def shortest_loop(start: str, graph: dict[str, set[str]]) -> list[str]:
    """A shortest path start -> ... -> start (breadth first; ``start`` must be on a cycle)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    raise ValueError(f"{start} is on no cycle")


def describe_cycles(imports, key) -> list[str]:
    """One message per cycle in the graph of ``key(importer) -> key(imported)``: its members and
    one shortest loop through the first, with an import for each hop."""
    graph: dict[str, set[str]] = defaultdict(set)
    example: dict[tuple[str, str], Import] = {}
    for imp in imports:
        a, b = key(imp.importer), key(imp.imported)
        if a != b:
            graph[a].add(b)
            example.setdefault((a, b), imp)
    out = []
    for comp in cycles(graph):
        loop = shortest_loop(comp[0], graph)
        hops = []
        for a, b in zip(loop, loop[1:]):
            imp = example[(a, b)]
            hops.append(f"{imp.importer}:{imp.line} imports {imp.imported}"
                        f"{'' if imp.module_level else ' (in a function)'}")
        out.append(f"import cycle among {', '.join(comp)}; for example " + ", then ".join(hops))
    return out


# -- the tests -------------------------------------------------------------------------------------

def test_every_component_is_declared_once():
    components = {component(m) for m in module_files()}
    assert undeclared(components, LAYERS) == []


def test_imports_between_components_go_down_the_declared_layers():
    problems = upward_edges(all_imports(), LAYERS)
    assert not problems, "\n".join(problems)


def test_no_cycle_among_modules_counting_module_level_imports():
    problems = describe_cycles([i for i in all_imports() if i.module_level], key=lambda m: m)
    assert not problems, "\n".join(problems)


def test_no_cycle_among_modules_counting_all_imports():
    """Stricter than (b): a function-level import does not close a cycle between modules either."""
    problems = describe_cycles(all_imports(), key=lambda m: m)
    assert not problems, "\n".join(problems)


def test_no_cycle_among_components_counting_all_imports():
    problems = describe_cycles(all_imports(), key=component)
    assert not problems, "\n".join(problems)


# Third-party packages confined to their components: torch and triton to the calibration tools (the
# simulator never needs a GPU stack) and torch also to the real-engine driver, vllm to the real-engine
# driver, simpy to the engine (it owns simulated time).
CONFINED = {"torch": ("kvsim.calibration", "kvsim.realengine"), "triton": ("kvsim.calibration",),
            "vllm": ("kvsim.realengine", "kvsim.conformance"), "simpy": ("kvsim.engine",)}


def confined_imports_outside(sources: dict[str, str], confined=CONFINED) -> list[str]:
    """Imports of a confined package (TYPE_CHECKING blocks included: annotations must not need it
    either) from a module outside its component."""
    problems = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in confined and component(module) not in confined[top]:
                    problems.append(f"{module} (line {node.lineno}) imports {name}: only "
                                    f"{' and '.join(confined[top])} may")
    return problems


def test_torch_triton_and_simpy_stay_in_their_component():
    sources = {m: path.read_text(encoding="utf-8") for m, (path, _) in module_files().items()}
    problems = confined_imports_outside(sources)
    assert not problems, "\n".join(problems)
    planted = confined_imports_outside({"kvsim.timing.kernel": "def f():\n    import torch.nn\n",
                                        "kvsim.fast.group": "from simpy.core import URGENT\n",
                                        "kvsim.calibration.timer": "import torch\n"})
    assert planted == ["kvsim.timing.kernel (line 2) imports torch.nn: only kvsim.calibration and kvsim.realengine may",
                       "kvsim.fast.group (line 1) imports simpy.core: only kvsim.engine may"]


def test_docs_list_the_declared_layers():
    """docs/architecture.md's "Layers" block lists LAYERS lowest first, one layer a line, siblings
    joined by " | ", each name without its "kvsim." prefix (the root is "kvsim")."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"## Layers\n.*?```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no '## Layers' section with a code block"
    listed = []
    for line in block.group(1).splitlines():
        m = re.match(r"\s*\d+\s+(.+?)\s*(?:#.*)?$", line)
        if m:
            listed.append(tuple(n.strip() for n in m.group(1).split("|")))

    def short(name: str) -> str:
        return name.removeprefix("kvsim.") if name != "kvsim" else "kvsim"

    assert listed == [tuple(short(n) for n in layer) for layer in LAYERS]


# -- each check can fail ---------------------------------------------------------------------------

PLANTED = '''
from typing import TYPE_CHECKING
import kvsim.kv.base
from kvsim.metrics import request_log
from . import plan
if TYPE_CHECKING:
    from kvsim.simulate import simulate
else:
    from kvsim.timing.base import BatchShape
def f():
    from kvsim.engine import Replica
    import importlib
    importlib.import_module("kvsim.fast.group")
'''


def _planted_imports() -> list[Import]:
    modules = module_files()
    return imports_in(PLANTED, "kvsim.sched.scheduler", False, modules)


def test_the_scanner_counts_function_level_imports_and_skips_type_checking():
    found = {(i.imported, i.module_level) for i in _planted_imports()}
    assert found == {("kvsim.kv.base", True), ("kvsim.metrics.request_log", True), ("kvsim.sched.plan", True),
                     ("kvsim.timing.base", True), ("kvsim.engine", False), ("kvsim.fast.group", False)}


def test_a_planted_upward_import_is_reported_with_both_layers():
    problems = upward_edges(_planted_imports(), LAYERS)
    index = layer_index(LAYERS)
    upward = [p for p in problems if "kvsim.metrics.request_log" in p]
    assert len(upward) == 1
    assert f"layer {index['kvsim.sched']}: kvsim.sched" in upward[0]
    assert f"layer {index['kvsim.metrics']}: kvsim.metrics" in upward[0]
    assert upward[0].startswith("kvsim.sched.scheduler (line 4")
    assert any("kvsim.engine" in p for p in problems) and any("kvsim.fast.group" in p for p in problems)
    assert not any("kvsim.kv.base" in p or "kvsim.timing.base" in p or "kvsim.simulate" in p for p in problems)
    sibling = upward_edges([Import("kvsim.results", "kvsim.plots", 1, True)], LAYERS)
    assert len(sibling) == 1 and "same layer" in sibling[0]


def test_a_planted_cycle_is_reported():
    real = list(all_imports())
    module_cycle = real + [Import("kvsim.errors", "kvsim.hw", 1, True), Import("kvsim.hw", "kvsim.errors", 2, True)]
    problems = describe_cycles([i for i in module_cycle if i.module_level], key=lambda m: m)
    assert problems == ["import cycle among kvsim.errors, kvsim.hw; for example kvsim.errors:1 imports kvsim.hw, "
                        "then kvsim.hw:2 imports kvsim.errors"]
    # a function-level import closing a cycle between components (timing -> kv -> timing)
    component_cycle = real + [Import("kvsim.timing.transfer", "kvsim.kv.paged", 9, False)]
    problems = describe_cycles(component_cycle, key=component)
    assert len(problems) == 1 and "kvsim.kv, kvsim.timing" in problems[0]
    assert "kvsim.timing.transfer:9 imports kvsim.kv.paged (in a function)" in problems[0]


def test_an_undeclared_component_is_reported():
    components = {component(m) for m in module_files()} | {"kvsim.newthing"}
    problems = undeclared(components, LAYERS)
    assert len(problems) == 1 and "kvsim.newthing is in no layer" in problems[0]
