"""The trace package's structure: no import cycles, nothing above it imported, old paths kept."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import kvsim.trace

TRACE = Path(kvsim.trace.__file__).parent
# Outside kvsim.trace, the trace package may use only these kvsim modules (it is the bottom layer:
# the scheduler, engine and config import it, never the other way round). kvsim.config_base (the
# pydantic base and the non-finite check), kvsim.yamlio (the bounded YAML loader), kvsim.outdir
# (output-file safety) and kvsim.cliargs (argparse types) are leaf modules
# that import only kvsim.errors or nothing of kvsim, so they sit at the same bottom layer.
ALLOWED_OUTSIDE = {"kvsim.errors", "kvsim.config_base", "kvsim.yamlio", "kvsim.outdir", "kvsim.cliargs"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(TRACE.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every kvsim module ``path`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kvsim"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("kvsim"):
                continue
            found.add(mod)
            for a in node.names:  # ``from kvsim.trace import coerce`` imports a submodule
                if importlib.util.find_spec(f"{mod}.{a.name}") if _is_package(mod) else False:
                    found.add(f"{mod}.{a.name}")
    return found


def _is_package(mod: str) -> bool:
    spec = importlib.util.find_spec(mod)
    return spec is not None and spec.submodule_search_locations is not None


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in TRACE.rglob("*.py")}
    return {name: _imports(path, name) for name, path in modules.items()}


def _internal(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Edges between trace modules, ignoring a module's import of its own parent package
    (``kvsim.trace`` only re-exports lazily)."""
    return {m: {d for d in deps if d in graph and d != m and not m.startswith(d + ".")}
            for m, deps in graph.items()}


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_the_trace_package_has_no_import_cycle():
    edges = _internal(_graph())
    assert "kvsim.trace.load" in edges and "kvsim.trace.containers.jsonl" in edges
    assert _find_cycle(edges) is None, " -> ".join(_find_cycle(edges))
    # the circle that used to be here
    assert "kvsim.trace.config" not in edges["kvsim.trace.synthetic"]


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_trace_package_imports_nothing_above_it():
    for mod, deps in _graph().items():
        upward = {d for d in deps if not d.startswith("kvsim.trace")} - ALLOWED_OUTSIDE
        assert not upward, f"{mod} imports {sorted(upward)}"


def test_load_is_split_by_responsibility():
    # Containers (bytes -> chunks), formats (what columns mean), coercion (column checks) and the
    # loader that ties them together live in separate modules, none of them large.
    for name in ("load.py", "formats.py", "coerce.py", "containers/csv_text.py", "containers/jsonl.py",
                 "containers/parquet.py"):
        assert len((TRACE / name).read_text().splitlines()) < 400, name
    load_imports = _graph()["kvsim.trace.load"]
    assert {"kvsim.trace.coerce", "kvsim.trace.containers", "kvsim.trace.formats"} <= load_imports


@pytest.mark.parametrize("module,names", [
    ("kvsim.trace.load", ["load_trace", "TraceWarning", "TraceSchema", "SCHEMAS", "FORMATS", "FORMAT_CHOICES",
                          "MOONCAKE_BLOCK_TOKENS", "CHUNK_LINES", "detect_format"]),
    ("kvsim.trace.config", ["TraceConfig", "build_trace", "resolve_path"]),
    ("kvsim.trace", ["Trace", "TraceConfig", "build_trace", "load_trace", "write_trace", "generate_trace",
                     "SyntheticTraceSpec", "block_keys", "trace_stats"]),
])
def test_public_import_paths_still_work(module, names):
    mod = importlib.import_module(module)
    for n in names:
        assert getattr(mod, n) is not None, f"{module}.{n}"


def test_load_trace_reads_the_chunk_size_at_call_time(tmp_path, monkeypatch):
    from kvsim.trace import load as load_mod

    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},5,3\n" for i in range(7)))
    seen = []
    real = load_mod.open_container

    def spy(opened, where, chunk_rows):
        seen.append(chunk_rows)
        return real(opened, where, chunk_rows)

    monkeypatch.setattr(load_mod, "open_container", spy)
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 3)
    assert len(load_mod.load_trace(f)) == 7 and seen == [3]
