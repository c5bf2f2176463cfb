"""Measured dispatch: `dsv4hal tune` writes a lock, selection follows it (source "lock"), and a lock that does
not match the machine, its libraries or the registry is refused with a typed error unless re-selection is
asked for explicitly."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import TRITON_DEVICE, on_the_cpu, plugin_module, registry_with, run_cli

from dsv4hal import hardware
from dsv4hal.errors import BadOverrideError, LockError, LockMismatchError
from dsv4hal.ops.buckets import bucket_of, missing_features
from dsv4hal.override import from_env, overrides
from dsv4hal.platform import select_platform
from dsv4hal.registry import KernelImpl

DEFAULT_TOPK = "k=512,page_transform=True,size=large"


@pytest.fixture(scope="module")
def lock_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The issue's command, run once through the CLI."""
    out = tmp_path_factory.mktemp("lock") / "lock.json"
    r = run_cli("tune", "--platform", "cpu", "--ops", "indexer_topk,pack_store", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "[indexer_topk 8/8]" in r.stderr and "[pack_store 6/6]" in r.stderr  # a line per (op, bucket)
    return out


def _edited(src: Path, dst: Path, edit) -> Path:  # noqa: ANN001
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return dst


def test_tune_writes_a_lock_with_reasons(lock_file: Path) -> None:
    """tune writes a lock naming machine, libraries and each tuned op's buckets."""
    data = json.loads(lock_file.read_text())
    assert data["format"] == "dsv4hal-lock/1" and data["platform"] == "cpu"
    assert data["machine"]["arch"] == "cpu" and "torch" in data["libraries"] and data["dsv4hal"]
    assert set(data["ops"]) == {"indexer_topk", "pack_store"}
    topk = data["ops"]["indexer_topk"]["buckets"]
    assert len(topk) == 8 and DEFAULT_TOPK in topk
    for b in topk.values():
        ref = b["candidates"]["torch_reference"]
        assert b["chosen"] == "torch_reference" and ref["status"] == "measured" and ref["us"] > 0
        assert ref["max_error"] == 0.0 and b["why"]
        # Triton on the CPU platform is listed with why it was not timed: under the interpreter (the tests run
        # TRITON_INTERPRET=1 on a CPU machine) it runs but is not timed; on a GPU machine it is not eligible there
        want = "not-timed" if TRITON_DEVICE.type == "cpu" else "ineligible"
        assert b["candidates"]["triton_radix_topk"]["status"] == want
        assert "interpreter" in b["candidates"]["triton_radix_topk"]["reasons"][0]
    assert len(data["ops"]["pack_store"]["buckets"]) == 6


def test_explain_names_the_lock_with_measured_times(lock_file: Path) -> None:
    """explain and info name the lock in force and show measured times."""
    r = run_cli("explain", "indexer_topk", "--platform", "cpu", env={"DSV4HAL_LOCK": str(lock_file)})
    assert r.returncode == 0, r.stderr
    assert "source lock" in r.stdout and str(lock_file) in r.stdout and "measured" in r.stdout
    r = run_cli("info", "--platform", "cpu", env={"DSV4HAL_LOCK": str(lock_file)})
    assert r.returncode == 0, r.stderr
    assert f"lock: {lock_file}" in r.stdout and "in force" in r.stdout


def test_selection_follows_the_lock(lock_file: Path) -> None:
    """With a lock, selection takes the locked kernel; untuned ops stay automatic."""
    plain = select_platform("cpu")
    assert plain.lock is None and plain.default_decisions["indexer_topk"].source == "auto"
    p = select_platform("cpu", lock=lock_file)
    d = p.explain("indexer_topk")
    assert d.source == "lock" and d.measured["torch_reference"] > 0 and "triton_radix_topk" in d.measured
    assert p.explain("moe_route").source == "auto"  # not tuned: static, and said so
    assert "does not cover moe_route" in p.explain("moe_route").notes[0]


@on_the_cpu
def test_the_lock_not_the_priority_decides(lock_file: Path, tmp_path: Path) -> None:
    """A lock overrides kernel priority, and a forced kernel overrides the lock."""
    # a lock naming the Triton kernel (eligible on the CPU platform under the interpreter only)
    forced = _edited(lock_file, tmp_path / "triton.json",
                     lambda d: d["ops"]["indexer_topk"]["buckets"][DEFAULT_TOPK].update(chosen="triton_radix_topk"))
    d = select_platform("cpu", lock=forced).explain("indexer_topk")
    assert d.chosen.name == "triton_radix_topk" and d.source == "lock"
    # a forced kernel still wins over the lock, and explain says so
    with overrides(kernels={"indexer_topk": "torch_reference"}):
        d = select_platform("cpu", lock=forced).explain("indexer_topk")
    assert d.chosen.name == "torch_reference" and d.source == "api" and "wins over the lock" in d.notes[-1]


def test_changed_library_version_is_a_typed_error(lock_file: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock from another library version raises LockMismatchError; the CLI exits 2."""
    bad = _edited(lock_file, tmp_path / "old.json", lambda d: d["libraries"].update(torch="1.0.0"))
    monkeypatch.setenv("DSV4HAL_LOCK", str(bad))
    with pytest.raises(LockMismatchError, match=r"library torch version .* differs from the locked 1\.0\.0"):
        select_platform()
    r = run_cli("info", env={"DSV4HAL_LOCK": str(bad)})
    assert r.returncode == 2 and "LockMismatch" not in r.stdout and "locked 1.0.0" in r.stderr
    # re-selection only when asked, and recorded
    p = select_platform(lock_mismatch="reselect")
    d = p.explain("indexer_topk")
    assert d.source == "auto" and "not applied" in d.notes[0] and "locked 1.0.0" in d.notes[0]
    monkeypatch.setenv("DSV4HAL_LOCK_MISMATCH", "reselect")
    assert not select_platform().lock.applied


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["ops"]["indexer_topk"]["buckets"][DEFAULT_TOPK].update(chosen="gone_kernel"),
     "'gone_kernel' is not registered"),
    (lambda d: d["machine"].update(device_name="other cpu"), "machine device_name"),
    (lambda d: d.update(platform="cuda_sm90"), "the lock is for platform cuda_sm90"),
    (lambda d: d.update(dsv4hal="0.0.0"), "dsv4hal version"),
    (lambda d: d["libraries"].update(no_such_library="1.0"),
     "no_such_library 1.0 was in the lock but is not installed"),
    (lambda d: d["ops"]["indexer_topk"]["buckets"].pop(DEFAULT_TOPK), "no measurement for indexer_topk bucket"),
    (lambda d: d["ops"]["indexer_topk"].update(features=["k", "size"]),
     r"indexer_topk: the lock's buckets are by \(k, size\)"),
])
def test_lock_mismatches_are_refused(lock_file: Path, tmp_path: Path, edit, message: str) -> None:  # noqa: ANN001
    """Each lock mismatch is refused by name, and lock_mismatch=reselect falls back to auto."""
    bad = _edited(lock_file, tmp_path / "bad.json", edit)
    with pytest.raises(LockMismatchError, match=message):
        select_platform("cpu", lock=bad)
    d = select_platform("cpu", lock=bad, lock_mismatch="reselect").explain("indexer_topk")
    assert d.source == "auto" and "lock_mismatch=reselect" in d.notes[0]


def test_unreadable_locks_and_bad_policy(tmp_path: Path) -> None:
    """A missing or foreign-format lock and a bad mismatch policy raise typed errors."""
    with pytest.raises(LockError, match="does not exist"):
        select_platform("cpu", lock=tmp_path / "nope.json")
    (tmp_path / "old.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(LockError, match="format"):
        select_platform("cpu", lock=tmp_path / "old.json")
    with pytest.raises(BadOverrideError):
        from_env({"DSV4HAL_LOCK_MISMATCH": "maybe"})


def test_simulated_other_machine_is_refused(lock_file: Path) -> None:
    """A lock from another machine is refused, naming the device."""
    info = hardware.simulated("cpu", libraries=hardware.detect().libraries)
    with pytest.raises(LockMismatchError, match="machine device_name is 'simulated cpu'"):
        select_platform("cpu", info=info, lock=lock_file)


def _wrong_topk(scores, lengths, k, page_table=None, page_size=64):  # noqa: ANN001, ANN202
    raw = torch.arange(k, dtype=torch.int32).repeat(scores.shape[0], 1)  # ignores the scores: wrong beyond k
    pages = None if page_table is None else raw.clone()
    return raw, pages


def _crashing_topk(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    raise RuntimeError("kernel exploded")


def test_a_wrong_or_crashing_kernel_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune never locks a kernel that gives wrong results or crashes."""
    from dsv4hal.tune import summary, tune

    fakes = types.ModuleType("dsv4hal_tune_fakes")
    fakes.wrong, fakes.crash = _wrong_topk, _crashing_topk  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dsv4hal_tune_fakes", fakes)

    def register(registry) -> None:  # noqa: ANN001
        for name, target, prio in (("fast_but_wrong", "wrong", 50), ("crashes", "crash", 40)):
            registry.add_kernel(KernelImpl(op="indexer_topk", name=name, target=f"dsv4hal_tune_fakes:{target}",
                                           platforms=("cpu",), priority=prio, requires=("torch",)))

    reg = registry_with(("fakes", plugin_module("fakes", register)))
    assert reg.kernels["indexer_topk"]["fast_but_wrong"].target == "dsv4hal_tune_fakes:wrong"
    data = tune("cpu", ops=["indexer_topk"], registry=reg)
    for label, b in data["ops"]["indexer_topk"]["buckets"].items():
        assert b["static"] == "fast_but_wrong", label  # the static priority would have picked the wrong one
        assert b["chosen"] == "torch_reference"
        assert b["candidates"]["fast_but_wrong"]["status"] == "wrong"
        assert "differ from the" in b["candidates"]["fast_but_wrong"]["reasons"][0]
        assert b["candidates"]["crashes"]["status"] == "failed"
        assert "kernel exploded" in b["candidates"]["crashes"]["reasons"][0]
        assert "was wrong" in b["why"]
    table = summary(data)  # the results-README table lists every bucket where measurement overruled priority
    assert len(table) == 2 + 8 and "| fast_but_wrong (not measured) | torch_reference" in table[2]


def test_update_adds_ops_of_the_same_machine_only(lock_file: Path, tmp_path: Path) -> None:
    """tune --update adds ops to a lock of the same machine only."""
    from dsv4hal.cli import main

    out = tmp_path / "lock.json"
    shutil.copy(lock_file, out)
    args = ["tune", "--platform", "cpu", "--ops", "mhc_post", "--out", str(out), "--update"]
    assert main(args) == 0  # mhc_post declares no samples: they come from its conformance cases
    data = json.loads(out.read_text())
    assert set(data["ops"]) == {"indexer_topk", "pack_store", "mhc_post"}
    assert data["ops"]["mhc_post"]["buckets"]["(any case)"]["chosen"] == "torch_reference"
    _edited(out, out, lambda d: d["machine"].update(device_name="another cpu"))
    assert main(args) == 2


def test_bucket_of_projects_on_declared_features() -> None:
    """bucket_of keys a case on the op's declared features only."""
    assert bucket_of("indexer_topk", {"k": 1024, "page_transform": False, "size": "small", "extra": 1}) == \
        "k=1024,page_transform=False,size=small"
    assert bucket_of("pack_store", {"fp8": "e4m3fnuz", "page_size": 64, "size": "large"}) == "page_size=64,size=large"
    # an op without a declaration is keyed on its whole case
    assert bucket_of("compress", {"ratio": 4, "hd": 512, "hadamard": False}) == "hadamard=False,hd=512,ratio=4"
    # a partial case (the catalog's typical case of moe_route) is not decided by the lock: said in explain
    assert missing_features("moe_route", {"hash": False, "top_k": 6}) == ["tokens"]


def test_declared_cpu_samples_land_in_their_buckets() -> None:
    """Each declared tuning sample lands in the bucket its label names."""
    from dsv4hal.tune import declared_samples

    info = hardware.detect()
    got = declared_samples("dequant_gather", False, torch.device("cpu"), info)  # raises if a sample is misfiled
    assert [label for label, _ in got] == [f"page_size={p},size={s}" for p in (256, 64, 2)
                                          for s in ("small", "large")]


def _decode_case(t: int, h: int, ratio: int, width: int | None) -> dict:
    from dsv4hal.ops.sparse_attention import decode_token_class, extra_width_class

    return {"compress_ratio": ratio, "h_q": h, "extra_class": extra_width_class(width),
            "tokens": decode_token_class(t)}


def test_decode_buckets_are_classes_that_real_calls_fall_in() -> None:
    """Decode buckets group real contexts by class: 32K and 128K share one, 1M does not."""
    # a C128 width grows with the context: 32K and 128K contexts share a bucket, 1M does not
    at = {ctx: bucket_of("sparse_attention_decode", _decode_case(1, 64, 128, -(-ctx // 128 // 64) * 64))
          for ctx in (32768, 131072, 1048576)}
    assert at[32768] == at[131072] == "compress_ratio=128,extra_class=short,h_q=64,tokens=single"
    assert at[1048576] == "compress_ratio=128,extra_class=long,h_q=64,tokens=single"
    assert bucket_of("sparse_attention_decode", _decode_case(64, 64, 4, 512)).endswith("tokens=batch")
    assert bucket_of("sparse_attention_decode", _decode_case(65, 64, 4, 512)).endswith("tokens=wide")


def test_every_decode_bucket_has_a_conformance_sample() -> None:
    """tune measures a bucket only from the conformance cases that fall in it; a bucket without one leaves a lock
    unable to decide real calls of that class (refused loudly). The model's shapes: SWA, C4 at its top-k and C128
    at short and long contexts, for V4-Flash (h_q 64) and V4-Pro (h_q 128), one row, a batch and a wider batch."""
    from dsv4hal.conformance.cases_sparse_attention import CASES

    seen = set()
    for spec in CASES:
        if spec.op != "sparse_attention_decode" or spec.deferred:
            continue
        reqs, ratio = spec.params["requests"], spec.compress_ratio or 0
        rows = sum(n for _, n in reqs)
        width = {0: None, 4: int(spec.params.get("topk", 512)),
                 128: max(64, -(-max((p + n) // 128 for p, n in reqs) // 64) * 64)}[ratio]
        for mode in spec.modes:
            if mode not in spec.unreachable:
                t = 3 * len(reqs) if mode in ("verify", "draft_extend") else rows
                seen.add(bucket_of("sparse_attention_decode", _decode_case(t, spec.params.get("h_q", 64), ratio,
                                                                            width)))
    want = {bucket_of("sparse_attention_decode", _decode_case(t, h, r, w))
            for t in (1, 64, 72) for h in (64, 128) for r, w in ((0, None), (4, 512 if h == 64 else 1024),
                                                              (128, 1024), (128, 8192))}
    assert want <= seen, sorted(want - seen)


def test_gpu_samples_are_built_per_bucket_and_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a sample keeps no fixture between its case being read and its bucket being measured (full-size
    MoE samples of all buckets together exceed an H200's memory); rebuilt, it holds the same inputs."""
    from dsv4hal import tune

    catalog = tune.load_catalog
    monkeypatch.setattr(tune, "load_catalog", lambda ops, **kw: list(catalog(ops, **kw))[:6])
    buckets = tune.derived_samples("build_attention_metadata", True, torch.device("cpu"))
    samples = [s for _, group in buckets for s in group]
    assert samples and all(s.built is None for s in samples)
    first = samples[0]
    fx = first.fixture
    assert first.built is fx and first.fixture is fx  # built once per bucket, not per access
    first.release()
    assert first.built is None
    again = first.fixture
    assert again is not fx and again.args.keys() == fx.args.keys()
    for name, value in fx.args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(again.args[name], value), name
    kept = tune.derived_samples("build_attention_metadata", False, torch.device("cpu"))
    assert all(s.built is not None for _, group in kept for s in group)  # on the CPU: small, kept
