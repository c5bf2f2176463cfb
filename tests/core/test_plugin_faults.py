"""A plugin's faults are contained: a kernel that does not import, a supports() that raises or returns garbage, a
priority tie with a built-in kernel, sys.exit at import. Each becomes a PluginWarning and a reason that explain
and `dsv4hal info` show, the built-ins keep working, and strict mode turns it into a typed error."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest
from conftest import plugin_module, registry_with

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.errors import PluginFaultError, PluginLoadError, RegistryError
from dsv4hal.plugins import PluginWarning
from dsv4hal.registry import KernelImpl

MHC = "mhc_post"


def _ref_priority() -> int:
    reg = registry_with()
    return reg.kernels[MHC]["torch_reference"].priority_on("cpu")


def _cpu(reg, **kw):  # noqa: ANN001, ANN003, ANN202
    return dsv4hal.select_platform("cpu", info=dsv4hal.simulated("cpu", libraries={"torch": "2"}), registry=reg,
                                   **kw)


def test_priority_tie_with_a_builtin_is_contained() -> None:
    """A plugin kernel tying a built-in's priority warns and selection stays deterministic."""
    prio = _ref_priority()

    def tie(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=MHC, name="tied", target="m:f", platforms=("cpu",), priority=prio))

    with pytest.warns(PluginWarning, match="priority"):
        reg = registry_with(("tie", plugin_module("tie", tie)))
    assert "tied" not in reg.kernels[MHC] and "priority" in reg.plugin_errors["tie"]
    assert _cpu(reg).explain(MHC).chosen.name == "torch_reference"  # select_platform() still works
    with pytest.raises(RegistryError, match="priority"):
        registry_with(("tie", plugin_module("tie", tie)), strict=True)


def _bad_kernel(**kw):  # noqa: ANN003, ANN202
    def register(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=MHC, name="bad", platforms=("cpu",), priority=10**6, **kw))
    return plugin_module("bad", register)


def _raise(case, info):  # noqa: ANN001, ANN202
    raise RuntimeError("supports exploded")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"target": "dsv4hal_no_such_module:f"}, "did not import"),
    ({"target": "dsv4hal.errors:no_such_function"}, "did not import"),
    ({"target": "builtins:len", "supports": _raise}, "supports exploded"),
    ({"target": "builtins:len", "supports": lambda case, info: None}, "not a list"),
])
def test_kernel_faults_are_contained_and_shown(kw, needle, monkeypatch, capsys) -> None:  # noqa: ANN001
    """A plugin kernel that fails to import or whose supports() misbehaves is rejected with the reason shown."""
    reg = registry_with(("bad", _bad_kernel(**kw)))
    with pytest.warns(PluginWarning, match=needle):
        p = _cpu(reg)
    d = p.explain(MHC)
    assert d.chosen.name == "torch_reference"
    assert any(c.name == "bad" and needle in "; ".join(c.reasons) for c in d.candidates)
    assert needle in reg.plugin_errors["bad"]
    # dsv4hal info shows it instead of a traceback
    import dsv4hal.platform as platform_mod
    from dsv4hal.cli import main

    monkeypatch.setattr(platform_mod, "load_registry", lambda *a, **k: reg)
    assert main(["info"]) == 0
    assert needle in capsys.readouterr().out
    strict = registry_with(("bad", _bad_kernel(**kw)), strict=True)
    with pytest.raises(PluginFaultError, match=needle):
        _cpu(strict)


def test_sys_exit_in_a_plugin_is_contained(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A plugin calling sys.exit at import is contained as a warning, not a process exit."""
    (tmp_path / "dsv4hal_exiting_plugin.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint("exiting", "dsv4hal_exiting_plugin", "dsv4hal.platforms")
    import dsv4hal.plugins as plugins

    real = plugins._entry_points
    monkeypatch.setattr(plugins, "_entry_points", lambda: [*real(), ep])
    with pytest.warns(PluginWarning, match="SystemExit"):
        reg = plugins.build_registry()
    assert "exiting" in reg.plugin_errors and "cpu" in reg.platforms
    with pytest.raises(PluginLoadError, match="SystemExit"):
        plugins.build_registry(strict=True)

    def exits(registry):  # noqa: ANN001, ANN202
        sys.exit(1)

    with pytest.warns(PluginWarning, match="SystemExit"):
        reg = registry_with(("exits", plugin_module("exits", exits)))
    assert "exits" in reg.plugin_errors


def test_overrides_keep_working_with_fault_free_registry() -> None:
    """Fault containment does not hide an ordinary bad kernel override: it still raises BadOverrideError."""
    from dsv4hal.errors import BadOverrideError

    with pytest.raises(BadOverrideError):
        with ov.overrides(kernels={"pack_store": "nope"}):
            dsv4hal.select_platform()
