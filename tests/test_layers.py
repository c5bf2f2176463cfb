"""Layers only point down, checked by scanning every import statement (top level and inside functions):
op contracts never import the references, the core never imports a vendor plugin, no vendor plugin imports
another one, and the formats (what an engine passes in) import no implementation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    assert violations("dsv4hal/ops", lambda p, mod: _under(mod, "dsv4hal.reference")) == []


def test_ops_do_not_even_name_the_references() -> None:
    """`grep -r "dsv4hal.reference" dsv4hal/ops` finds nothing: not even a docstring names the references."""
    root = Path(__file__).resolve().parents[1] / "dsv4hal" / "ops"
    assert [p.name for p in sorted(root.rglob("*.py")) if "dsv4hal.reference" in p.read_text()] == []


def test_core_never_imports_a_vendor_plugin() -> None:
    assert violations("dsv4hal", lambda p, mod: any(_under(mod, name) for name in PLUGINS)) == []


def test_no_plugin_imports_another_plugin() -> None:
    def banned(path: Path, mod: str) -> bool:
        own = path.relative_to(ROOT / "platforms").parts[0]
        return any(_under(mod, name) for name, folder in PLUGINS.items() if folder != own)

    assert violations("platforms", banned) == []


def test_formats_import_no_implementation() -> None:
    above = ("dsv4hal.reference", "dsv4hal.kernels", "dsv4hal.conformance", "dsv4hal.platform", "dsv4hal.plugins")
    assert violations("dsv4hal/formats", lambda p, mod: any(_under(mod, a) for a in above)) == []


def test_the_scan_sees_function_level_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from dsv4hal.reference.moe import quantize_experts\n")
    assert (2, "dsv4hal.reference.moe") in imports(src)
