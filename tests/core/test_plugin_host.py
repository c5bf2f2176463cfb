"""The plugin host: plugins are called through pluggy one at a time, each inside the registry's scope for it,
which records what it registered and rolls it back when it fails; the portable Triton kernels are offered to
platforms by capability (PlatformSpec.runs_triton), not by name."""

from __future__ import annotations

import types

import pytest
from conftest import plugin_module, registry_with

from dsv4hal.errors import PluginLoadError, RegistryError
from dsv4hal.hookspecs import hookimpl
from dsv4hal.kernels.triton import registrations
from dsv4hal.plugins import PluginWarning
from dsv4hal.registry import KernelImpl, PlatformSpec, Registry

GPU = ("cuda_sm90", "cuda_sm100", "rocm")


def _spec(name: str, **kw: object) -> PlatformSpec:
    return PlatformSpec(name, "test platform", 1, lambda info: ["never"], "cuda", **kw)  # type: ignore[arg-type]


def test_registry_records_what_each_plugin_registered() -> None:
    """The registry records each plugin's platforms and kernels."""
    reg = registry_with()
    assert reg.registered["cpu"].platforms == ("cpu",)
    assert reg.registered["portable_triton"].platforms == ()
    assert ("indexer_topk", "triton_radix_topk") in reg.registered["portable_triton"].kernels
    sm90 = reg.registered["cuda_sm90"]
    assert sm90.platforms == ("cuda_sm90",)
    assert ("sparse_attention_decode", "flashmla_sm90_sgl") in sm90.kernels
    assert ("indexer_logits", "deepgemm_paged_mqa_logits_sm90") in sm90.kernels
    for plugin, entries in reg.registered.items():  # the record and the entries' own attribution agree
        assert all(reg.platforms[p].plugin == plugin for p in entries.platforms)
        assert all(reg.kernels[op][k].plugin == plugin for op, k in entries.kernels)


def test_scope_rolls_back_everything_including_capability_offers() -> None:
    """A failed registry scope rolls back all it added, capability offers included."""
    reg = Registry()
    with reg.scope("triton"):
        reg.add_kernel(KernelImpl(op="mhc_post", name="t", target="m:f", platforms=(), priority=1,
                                  platform_capability="runs_triton"))
    with pytest.raises(RuntimeError, match="late"), reg.scope("vendor"):
        reg.add_platform(_spec("v", runs_triton=True))
        assert reg.kernels["mhc_post"]["t"].platforms == ("v",)  # offered as soon as the platform exists
        raise RuntimeError("late failure")
    assert reg.platforms == {} and reg.kernels["mhc_post"]["t"].platforms == ()
    assert "vendor" not in reg.registered and reg.registered["triton"].kernels == (("mhc_post", "t"),)
    with pytest.raises(RegistryError, match="inside scope"), reg.scope("a"), reg.scope("b"):
        pass


def test_scope_refuses_a_tie_it_brought() -> None:
    """A scope adding a kernel tying another's priority is refused."""
    reg = Registry()
    with reg.scope("a"):
        reg.add_platform(_spec("p"))
        reg.add_kernel(KernelImpl(op="mhc_post", name="x", target="m:f", platforms=("p",), priority=5))
    with pytest.raises(RegistryError, match="priority 5"), reg.scope("b"):
        reg.add_kernel(KernelImpl(op="mhc_post", name="y", target="m:f", platforms=("p",), priority=5))
    assert set(reg.kernels["mhc_post"]) == {"x"} and "b" not in reg.registered


def test_triton_kernels_follow_the_capability_not_names() -> None:
    """Triton kernels go to every platform offering the capability, at that platform's priority."""
    reg = registry_with()
    for impl in reg.kernels["indexer_topk"].values():
        if impl.name == "triton_radix_topk":
            assert set(impl.platforms) == {"cpu", *GPU}
            assert [impl.priority_on(p) for p in ("cpu", *GPU)] == [-10, 100, 100, 100]

    def third_party(registry):  # noqa: ANN001, ANN202
        registry.add_platform(_spec("acme_triton", runs_triton=True))
        registry.add_platform(_spec("acme_native"))

    reg = registry_with(("acme", plugin_module("acme", third_party)))
    triton_topk = reg.kernels["indexer_topk"]["triton_radix_topk"]
    assert triton_topk.applies_to("acme_triton") and not triton_topk.applies_to("acme_native")
    assert registrations.CAPABILITY == "runs_triton" and not hasattr(registrations, "GPU_PLATFORMS")


def test_hooks_go_through_pluggy() -> None:
    """Plugin hooks are validated by pluggy, so a misspelt hook is an error, not ignored."""
    misspelt = types.ModuleType("misspelt")

    @hookimpl
    def dsv4hal_registr(registry):  # noqa: ANN001, ANN202
        raise AssertionError("never called")

    misspelt.dsv4hal_registr = dsv4hal_registr  # type: ignore[attr-defined]
    with pytest.warns(PluginWarning, match="dsv4hal_registr"):
        reg = registry_with(("misspelt", misspelt))
    assert "not a valid dsv4hal plugin" in reg.plugin_errors["misspelt"]
    with pytest.raises(PluginLoadError, match="dsv4hal_registr"):
        registry_with(("misspelt", misspelt), strict=True)

    unmarked = types.ModuleType("unmarked")
    unmarked.dsv4hal_register = lambda registry: None  # type: ignore[attr-defined]
    with pytest.warns(PluginWarning, match="no dsv4hal_register"):
        reg = registry_with(("unmarked", unmarked))
    assert "unmarked" in reg.plugin_errors and "unmarked" not in reg.registered


def test_each_plugin_hook_runs_once() -> None:
    """Each plugin's register hook runs once per registry build."""
    calls: list[str] = []

    def one(registry):  # noqa: ANN001, ANN202
        calls.append("one")

    def two(registry):  # noqa: ANN001, ANN202
        calls.append("two")

    reg = registry_with(("one", plugin_module("one", one)), ("two", plugin_module("two", two)))
    assert calls == ["one", "two"] and reg.registered["one"].kernels == ()
