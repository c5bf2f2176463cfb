"""The pure parts of `dsv4hal bench mhc`'s pre-norm GEMM comparison (dsv4hal.bench.mhc) on CPU: shapes,
floors, DeepGEMM split counts and skip reasons, and whole rows built with a fake `deep_gemm` (DeepGEMM 2.5.0's
tf32_hc_prenorm_gemm contract) and the Triton partials under the interpreter, with a stand-in timer."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import on_the_cpu
from vendor_fakes import fake_module, install_modules

from dsv4hal.bench import mhc as bench

pytest.importorskip("triton")


def _fake_prenorm_gemm(calls: list[dict[str, Any]], fail: set[int | None] = frozenset()) -> Callable[..., None]:
    """tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None) with the host checks of DeepGEMM 2.5.0
    (csrc/apis/hyperconnection.hpp, csrc/jit_kernels/impls/sm90_tf32_hc_prenorm_gemm.hpp) and its K split:
    split i owns K // 64 // splits 64-column blocks, the first (K // 64) % splits one more."""

    def gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
             num_splits: int | None = None) -> None:
        calls.append({"a": (tuple(a.shape), a.dtype), "b": (tuple(b.shape), b.dtype), "d": tuple(d.shape),
                      "sqr_sum": tuple(sqr_sum.shape), "num_splits": num_splits})
        if num_splits in fail:
            raise RuntimeError("Assertion error (fake): refused")
        m, k = a.shape
        n = b.shape[0]
        assert a.stride(1) == 1 and b.stride(1) == 1 and sqr_sum.is_contiguous()
        assert a.dtype == torch.bfloat16 and b.dtype == d.dtype == sqr_sum.dtype == torch.float32
        assert n <= 32 and n % 8 == 0 and k % 64 == 0 and b.shape[1] == k
        s = 1 if num_splits is None else num_splits
        lead = () if num_splits is None else (s,)
        assert tuple(d.shape) == (*lead, m, n) and tuple(sqr_sum.shape) == (*lead, m)
        blocks, per, rem = k // 64, k // 64 // s, k // 64 % s
        af = a.float()
        mix, sq = d.view(s, m, n), sqr_sum.view(s, m)
        for i in range(s):
            lo = (i * per + min(i, rem)) * 64
            hi = lo + (per + (i < rem)) * 64
            assert hi <= blocks * 64
            mix[i] = af[:, lo:hi] @ b[:, lo:hi].t()
            sq[i] = af[:, lo:hi].pow(2).sum(1)

    return gemm


def _timer(times: dict[str, float]) -> bench.Timer:
    def timer(name: str, fn: Callable[[], object]) -> tuple[float, str]:
        fn()  # the timed call must be repeatable
        return times.get(name, 10.0), "eager" if name == "torch_reference" else "graph"

    return timer


def _row(monkeypatch: pytest.MonkeyPatch, calls: list[dict[str, Any]], *, arch_major: int = 9,
         fail: set[int | None] = frozenset(), times: dict[str, float] | None = None) -> dict[str, Any]:
    install_modules(monkeypatch, {"deep_gemm": fake_module("deep_gemm", __version__="2.5.0",
                                                           tf32_hc_prenorm_gemm=_fake_prenorm_gemm(calls, fail))})
    return bench.gemm_row(3, 256, copy_bw=1e12, timer=_timer(times or {}), device="cpu", arch_major=arch_major,
                          num_sms=4)


def test_shapes_floor_and_splits() -> None:
    """The mHC GEMM benchmark's shapes, floor bytes and DeepGEMM split candidates are as specified."""
    assert bench.gemm_shapes() == [(d, t) for d in (4096, 7168) for t in (1, 8, 64, 512, 4096)]
    assert bench.gemm_shapes(quick=True) == [(4096, 1), (4096, 64), (7168, 1), (7168, 64)]
    assert bench.gemm_bytes(1, 4096) == 4 * 4096 * 2 + 24 * 4 * 4096 * 4
    assert bench.gemm_bytes(64, 7168) == 64 * 4 * 7168 * 2 + 24 * 4 * 7168 * 4
    # one wave = 132 SMs over the 64-token blocks; never more splits than 64-column K blocks
    assert bench.deep_gemm_splits(1, 16384, 132) == [None, 16, 32, 64, 132]
    assert bench.deep_gemm_splits(512, 16384, 132) == [None, 16, 32, 64]
    assert bench.deep_gemm_splits(4096, 28672, 132) == [None, 16, 32, 64, 2]
    assert bench.deep_gemm_splits(1, 16384, 132, quick=True) == [None, 16]
    assert bench.deep_gemm_splits(1, 1024, 132) == [None, 16]
    assert [bench.deep_gemm_name(s) for s in (None, 16)] == ["deep_gemm", "deep_gemm splits=16"]


def test_shape_skip_reasons() -> None:
    """deep_gemm_shape_skip names the arch, split or K-multiple rule a shape breaks, or None."""
    assert bench.deep_gemm_shape_skip(9, 24, 16384) is None
    assert bench.deep_gemm_shape_skip(10, 40, 28672) is None
    assert "SM90 and SM100 only" in bench.deep_gemm_shape_skip(8, 24, 16384)
    assert "multiple of 8 <= 32" in bench.deep_gemm_shape_skip(9, 40, 16384)
    assert "multiple of 64" in bench.deep_gemm_shape_skip(9, 24, 1000)


def test_entry_skip_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    """deep_gemm_entry says why DeepGEMM is unusable: not importable or lacking the GEMM."""
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm raises ImportError
    entry, why = bench.deep_gemm_entry()
    assert entry is None and why.startswith("deep_gemm not importable: ModuleNotFoundError")
    install_modules(monkeypatch, {"deep_gemm": fake_module("deep_gemm", __version__="2.4.2")})
    entry, why = bench.deep_gemm_entry()
    assert entry is None and why == "deep_gemm 2.4.2 has no tf32_hc_prenorm_gemm"


@on_the_cpu
def test_row_with_fake_deep_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark row times every split candidate with the shapes DeepGEMM expects."""
    calls: list[dict[str, Any]] = []
    row = _row(monkeypatch, calls, times={"triton_partials": 3.0, "deep_gemm splits=4": 1.5})
    dg = ["deep_gemm", "deep_gemm splits=16", "deep_gemm splits=4"]  # K = 1024: 16 blocks; wave = 4 SMs
    assert list(row["us"]) == ["triton_partials", *dg, "torch_reference"]
    assert [c["num_splits"] for c in calls[::2]] == [None, 16, 4]  # each: the checked call, then the timed one
    assert calls[0]["a"] == ((3, 1024), torch.bfloat16) and calls[0]["b"] == ((24, 1024), torch.float32)
    assert calls[2]["d"] == (16, 3, 24) and calls[2]["sqr_sum"] == (16, 3)
    assert row["splits"]["deep_gemm"] == 1 and row["splits"]["deep_gemm splits=16"] == 16
    assert row["splits"]["triton_partials"] >= 1 and "torch_reference" not in row["splits"]
    assert row["floor_us"] == pytest.approx(bench.gemm_bytes(3, 256) / 1e12 * 1e6)
    assert row["floor_ratio"]["triton_partials"] == pytest.approx(3.0 / row["floor_us"])
    assert row["timing"] == {"torch_reference": "eager"} and row["skipped"] == {}
    for name in dg:  # exact fp32 on both sides here (the interpreter's dots are IEEE)
        err = row["rel_err"][name]
        assert max(err.values()) < 1e-5, (name, err)
    assert set(row["rel_err"]["triton_partials"]) == {"mix_vs_fp64", "sumsq_vs_fp64"}
    assert row["max_rel_err_deep_gemm_vs_triton"] < 1e-5
    assert row["best"] == row["deep_gemm_best"] == "deep_gemm splits=4"
    assert row["deep_gemm_wins"] and row["deep_gemm_speedup_vs_triton"] == pytest.approx(2.0)
    line = bench.gemm_line(row)
    assert line.startswith("mhc_pre_gemm d=256 T=3: floor") and "WINS" in line and "err vs triton" in line
    json.dumps(row)  # the bench writes rows as JSON


@on_the_cpu
def test_row_records_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing split is recorded under skipped with its error, and left out of times and errors."""
    calls: list[dict[str, Any]] = []
    row = _row(monkeypatch, calls, fail={16}, times={"triton_partials": 1.0})
    assert row["skipped"] == {"deep_gemm splits=16": "RuntimeError: Assertion error (fake): refused"}
    assert "deep_gemm splits=16" not in row["us"] and "deep_gemm splits=16" not in row["rel_err"]
    assert row["deep_gemm_wins"] is False and "loses" in bench.gemm_line(row)

    calls.clear()
    row = _row(monkeypatch, calls, arch_major=8)
    assert calls == [] and list(row["us"]) == ["triton_partials", "torch_reference"]
    assert "SM90 and SM100 only" in row["skipped"]["deep_gemm"]
    assert "deep_gemm_wins" not in row and "max_rel_err_deep_gemm_vs_triton" not in row
    assert "skipped: deep_gemm (" in bench.gemm_line(row)
