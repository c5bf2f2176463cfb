"""dsv4hal.conformance.sequence on the CPU: it picks the cases whose kernel is a vendor's (here a stand-in plugin's
vendor-tier kernel that is the reference), runs them in an order shuffled by the seed, and checks each against the
oracle; the GPU-only parts (graph capture, garbage decode inputs) are the GPU run's (`dsv4hal run shape-sequence`)."""

from __future__ import annotations

from conftest import plugin_module, registry_with

import dsv4hal
from dsv4hal.conformance import sequence
from dsv4hal.registry import KernelImpl

OP = "dequant_gather"


def _platform() -> dsv4hal.Platform:
    def plugin(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="fake_vendor_gather", platforms=("cpu",), priority=10_000,
                                       target="dsv4hal.reference.pack_store:dequant_gather", tier="vendor"))
    return dsv4hal.select_platform("cpu", registry=registry_with(("fakevendor", plugin_module("fakevendor", plugin))))


def test_sequence_runs_only_vendor_bound_cases_shuffled_and_checked() -> None:
    """Only the vendor kernel's cases run, each one passes against the oracle, and the seed decides the order."""
    platform = _platform()
    cases = sequence.vendor_cases(platform)
    assert len(cases) >= 2 and {s.op for s, _ in cases} == {OP}
    first = sequence.run_sequence(platform, seed=0, rounds=1)
    again = sequence.run_sequence(platform, seed=0, rounds=1)
    other = sequence.run_sequence(platform, seed=1, rounds=1)
    assert len(first) == len(cases) and {c.implementation for c in first} == {"fake_vendor_gather"}
    assert all(c.status == "pass" and c.mode == "eager" for c in first), [c.detail for c in first]
    assert [c.case for c in first] == [c.case for c in again]
    assert sorted(c.case for c in other) == sorted(c.case for c in first)
    assert [c.case for c in other] != [c.case for c in first] or len(set(c.case for c in first)) == 1


def test_sequence_finds_nothing_to_run_without_a_vendor_kernel() -> None:
    """The CPU platform binds no vendor kernel: no cells, and no fixture is built to find that out."""
    assert sequence.run_sequence(dsv4hal.select_platform("cpu"), rounds=1) == []
