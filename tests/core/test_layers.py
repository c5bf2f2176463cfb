"""Layers only point down, checked by scanning every import statement (top level and inside functions):
op contracts never import the references, the core never imports a vendor plugin, no vendor plugin imports
another one, and the formats (what an engine passes in) import no implementation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = {"dsv4hal_cuda_sm90": "cuda_sm90", "dsv4hal_cuda_sm100": "cuda_sm100", "dsv4hal_rocm": "rocm"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, `from X import Y` counted as X and X.Y."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations(folder: str, banned) -> list[str]:  # noqa: ANN001
    return [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in sorted((ROOT / folder).rglob("*.py"))
            for line, mod in imports(p) if banned(p, mod)]


def _under(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def test_ops_never_import_the_references() -> None:
    """Modules under dsv4hal/ops never import dsv4hal.reference."""
    assert violations("dsv4hal/ops", lambda p, mod: _under(mod, "dsv4hal.reference")) == []


def test_ops_do_not_even_name_the_references() -> None:
    """`grep -r "dsv4hal.reference" dsv4hal/ops` finds nothing: not even a docstring names the references."""
    root = Path(__file__).resolve().parents[2] / "dsv4hal" / "ops"
    assert [p.name for p in sorted(root.rglob("*.py")) if "dsv4hal.reference" in p.read_text()] == []


def test_core_never_imports_a_vendor_plugin() -> None:
    """The dsv4hal core never imports a vendor plugin package."""
    assert violations("dsv4hal", lambda p, mod: any(_under(mod, name) for name in PLUGINS)) == []


def test_no_plugin_imports_another_plugin() -> None:
    """No vendor plugin imports another vendor plugin."""
    def banned(path: Path, mod: str) -> bool:
        own = path.relative_to(ROOT / "platforms").parts[0]
        return any(_under(mod, name) for name, folder in PLUGINS.items() if folder != own)

    assert violations("platforms", banned) == []


def test_formats_import_no_implementation() -> None:
    """dsv4hal/formats imports no reference, kernel, conformance, platform or plugin module."""
    above = ("dsv4hal.reference", "dsv4hal.kernels", "dsv4hal.conformance", "dsv4hal.platform", "dsv4hal.plugins")
    assert violations("dsv4hal/formats", lambda p, mod: any(_under(mod, a) for a in above)) == []


def test_the_scan_sees_function_level_imports(tmp_path: Path) -> None:
    """The import scan finds imports inside functions."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from dsv4hal.reference.moe import quantize_experts\n")
    assert (2, "dsv4hal.reference.moe") in imports(src)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _runtime_imports(tree: ast.AST, names: set[str]) -> set[str]:
    """The dsv4hal modules a module imports when it runs (top level and inside functions, not under `if
    TYPE_CHECKING:`): `from P import m` is the module P.m where that is a module, else P itself."""
    found: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= set().union(*(_runtime_imports(n, names) for n in node.orelse)) if node.orelse else set()
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & names
            found |= subs
            if len(subs) < len(node.names) and node.module in names:
                found.add(node.module)
        found |= _runtime_imports(node, names)
    return found


def module_graph() -> dict[str, set[str]]:
    """Every dsv4hal module -> the dsv4hal modules it imports when it runs."""
    paths = sorted((ROOT / "dsv4hal").rglob("*.py"))
    names = {_module_name(p) for p in paths}
    return {_module_name(p): _runtime_imports(ast.parse(p.read_text(), str(p)), names) - {_module_name(p)}
            for p in paths}


def import_circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circles() -> None:
    """The package's import graph has no circle: the CLI, the tools, the conformance runner and its decode-step
    cells, the platform and its custom ops, the kernels and the formats import nothing that imports them back."""
    assert import_circles(module_graph()) == []


def test_import_circles_are_found() -> None:
    """The circle finder finds a circle of three and ignores a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_circles(graph) == [("a", "b", "c")]


def test_formats_import_only_errors_and_checks() -> None:
    """The formats (what an engine passes in) sit below the ops: of dsv4hal they import only the formats, the errors
    and the argument checks."""
    allowed = ("dsv4hal.formats", "dsv4hal.errors", "dsv4hal.checks")
    assert violations("dsv4hal/formats", lambda p, mod: _under(mod, "dsv4hal")
                      and mod != "dsv4hal" and not any(_under(mod, a) for a in allowed)) == []


# The tools run on the library, never on the command line: `dsv4hal.cli` parses arguments and passes the values in
TOOLS = ("dsv4hal/demo", "dsv4hal/engine_model", "dsv4hal/runner", "dsv4hal/bench", "dsv4hal/conformance",
         "dsv4hal/soak.py", "dsv4hal/tune.py")


def _tool_violations(banned) -> list[str]:  # noqa: ANN001
    out = []
    for tool in TOOLS:
        paths = [ROOT / tool] if tool.endswith(".py") else sorted((ROOT / tool).rglob("*.py"))
        out += [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in paths for line, mod in imports(p)
                if banned(p, mod)]
    return out


def test_tools_never_import_the_command_line() -> None:
    """The demo, the engine model, the runner, the benchmarks, the conformance runner, soak and tune import
    nothing of dsv4hal.cli."""
    assert _tool_violations(lambda p, mod: _under(mod, "dsv4hal.cli")) == []


def test_engine_model_imports_neither_the_command_line_nor_the_references_nor_its_users() -> None:
    """The engine-shaped model is a package of its own on the public API: it imports neither dsv4hal.cli nor
    dsv4hal.reference, nor the tools that run it (demo, soak, runner)."""
    banned = ("dsv4hal.cli", "dsv4hal.reference", "dsv4hal.demo", "dsv4hal.soak", "dsv4hal.runner",
              "dsv4hal.conformance")
    assert violations("dsv4hal/engine_model", lambda p, mod: any(_under(mod, b) for b in banned)) == []


def test_demo_and_soak_reach_the_model_only_through_the_engine_model_package() -> None:
    """soak runs the engine model, not the demo; neither soak nor the demo imports the references."""
    assert _tool_violations(lambda p, mod: p.name == "soak.py" and _under(mod, "dsv4hal.demo")) == []
    demo_or_soak = [ROOT / "dsv4hal" / "soak.py", *sorted((ROOT / "dsv4hal" / "demo").rglob("*.py"))]
    assert [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in demo_or_soak for line, mod in imports(p)
            if _under(mod, "dsv4hal.reference")] == []



def test_formats_and_their_leaves_import_only_the_standard_library_and_torch() -> None:
    """Outside dsv4hal the formats, the argument checks and the errors import only the standard library and torch;
    of dsv4hal the checks and the errors import only the errors, so nothing above the formats comes in through them."""
    import sys

    def banned(path: Path, mod: str) -> bool:
        top = mod.split(".")[0]
        if top == "dsv4hal":  # the formats' own dsv4hal imports: test_formats_import_only_errors_and_checks
            return path.parent.name != "formats" and not _under(mod, "dsv4hal.errors")
        return top not in sys.stdlib_module_names and top != "torch"

    leaves = [ROOT / "dsv4hal" / "checks.py", ROOT / "dsv4hal" / "errors.py"]
    found = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in leaves for line, mod in imports(p)
             if banned(p, mod)]
    assert violations("dsv4hal/formats", banned) + found == []
