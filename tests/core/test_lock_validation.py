"""A lock file is configuration: it is checked whole against the lock schema when it is loaded, and anything that
does not fit (wrong JSON shape, not UTF-8, nested too deep, an unknown op or `files` entry, a path that is not one)
is a LockError naming the file, the JSON path of the field and the remedy, never a generic Python exception from
the code that reads the lock later (differences, pick, tune --check)."""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsv4hal
from dsv4hal import lock_schema
from dsv4hal.cli import main
from dsv4hal.errors import Dsv4HalError, LockError, LockMismatchError
from dsv4hal.lock import FORMAT, dsv4hal_version, enforce, load_lock, machine_of
from dsv4hal.ops.buckets import DECLARED, bucket_label

BUCKET = "k=512,page_transform=True,size=large"
BUCKET_PATH = f'ops.indexer_topk.buckets["{BUCKET}"]'
CASE = {"k": 512, "page_transform": True, "size": "large"}


def _valid_lock() -> dict[str, Any]:
    """A lock of this machine in the shape `dsv4hal tune` writes, for one bucket of indexer_topk (no measuring)."""
    return copy.deepcopy(_lock_of_this_machine())


@functools.cache
def _lock_of_this_machine() -> dict[str, Any]:
    p = _platform()
    candidate = {"priority": 0, "tier": "reference", "plugin": "cpu", "status": "measured", "us": 10.0,
                 "per_sample_us": {"b=1": 10.0}, "method": "wall-clock median", "max_error": 0.0,
                 "tolerance": "exact"}
    bucket = {"samples": ["b=1"], "case": CASE, "chosen": "torch_reference", "static": "torch_reference",
              "why": "fastest of 1 checked", "candidates": {"torch_reference": candidate}}
    return {"format": FORMAT, "created": "2026-01-01T00:00:00+00:00", "dsv4hal": dsv4hal_version(),
            "platform": "cpu", "machine": {**machine_of(p.info), "sm_count": 0, "device_count": 0,
                                           "detected_by": p.info.detected_by},
            "libraries": dict(p.info.libraries), "plugins": dict(p.registry.plugin_versions), "files": {},
            "settings": {"margin": 0.03, "interpreted": False},
            "ops": {"indexer_topk": {"features": list(DECLARED["indexer_topk"].features), "buckets": {BUCKET: bucket}}}}


def _write(tmp_path: Path, data: Any, name: str = "lock.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _edited(edit: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    data = _valid_lock()
    edit(data)
    return data


def _bucket(d: dict[str, Any]) -> dict[str, Any]:
    return d["ops"]["indexer_topk"]["buckets"][BUCKET]


def test_a_valid_lock_is_accepted_and_followed(tmp_path: Path) -> None:
    """The schema accepts what tune writes: selection follows the lock (source "lock")."""
    assert bucket_label(CASE) == BUCKET
    path = _write(tmp_path, _valid_lock())
    d = dsv4hal.select_platform("cpu", lock=path).explain("indexer_topk", CASE)
    assert d.source == "lock" and d.chosen.name == "torch_reference"


def test_the_committed_locks_fit_the_schema() -> None:
    """Locks made by tune on a GPU (kept in bench/results) load: the schema is not narrower than tune's output."""
    locks = sorted(ROOT.glob("bench/results/**/*.lock*.json"))
    assert locks
    for path in locks:
        assert load_lock(path).ops, path


WRONG_SHAPES = {
    "machine_null": (lambda d: d.update(machine=None), "machine is null, expected an object"),
    "libraries_a_list": (lambda d: d.update(libraries=["torch"]), "libraries is an array of 1"),
    "ops_a_list": (lambda d: d.update(ops=[]), "ops is an array of 0"),
    "op_without_buckets": (lambda d: d["ops"].update(indexer_topk={}), "ops.indexer_topk.features is missing"),
    "chosen_a_list": (lambda d: _bucket(d).update(chosen=["torch_reference"]), f"{BUCKET_PATH}.chosen is an array"),
    "candidates_null": (lambda d: _bucket(d).update(candidates=None), f"{BUCKET_PATH}.candidates is null"),
    "bucket_without_chosen": (lambda d: _bucket(d).pop("chosen"), f"{BUCKET_PATH}.chosen is missing"),
    "measured_without_time": (lambda d: _bucket(d)["candidates"]["torch_reference"].pop("us"),
                              f"{BUCKET_PATH}.candidates.torch_reference.us is missing"),
    "time_a_boolean": (lambda d: _bucket(d)["candidates"]["torch_reference"].update(us=True),
                       f"{BUCKET_PATH}.candidates.torch_reference.us is true"),
    "unknown_status": (lambda d: _bucket(d)["candidates"]["torch_reference"].update(status="fast"),
                       "status is the string \"fast\", expected one of measured"),
    "case_value_a_list": (lambda d: _bucket(d)["case"].update(k=[512]), f"{BUCKET_PATH}.case.k is an array"),
    "feature_a_number": (lambda d: d["ops"]["indexer_topk"].update(features=[1]),
                         "ops.indexer_topk.features[0] is the number 1"),
    "unknown_op": (lambda d: d["ops"].update(no_such_op={"features": "all", "buckets": {}}),
                   "ops.no_such_op names an op this dsv4hal does not have"),
    "files_names_torch": (lambda d: d.update(files={"torch": {"sha256": "0" * 64}}), "files.torch names torch"),
    "file_hash_not_hex": (lambda d: d.update(files={"flash_mla": {"sha256": "xyz"}}),
                          "files.flash_mla.sha256 is the string \"xyz\", expected 64 hex digits"),
    "platform_missing": (lambda d: d.pop("platform"), "platform is missing"),
}


@pytest.mark.parametrize("edit, field", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_lock_of_the_wrong_shape_is_refused_naming_the_field(tmp_path: Path, edit, field: str) -> None:  # noqa: ANN001
    """Each malformed field is a LockError (not a mismatch that re-selection could wave through) naming the file,
    the field's JSON path and the remedy; lock_mismatch="reselect" refuses it too."""
    path = _write(tmp_path, _edited(edit))
    for policy in ("error", "reselect"):
        with pytest.raises(LockError) as err:
            dsv4hal.select_platform("cpu", lock=path, lock_mismatch=policy)
        assert not isinstance(err.value, LockMismatchError)
        assert field in str(err.value) and str(path) in str(err.value)
        assert err.value.remedy and "dsv4hal tune" in err.value.remedy


def test_lock_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    """A latin-1 byte in a lock is a LockError saying it is not UTF-8, with the offending byte and offset."""
    raw = json.dumps(_valid_lock()).replace('"cpu"', '"cpu\u00e9"', 1).encode("latin-1")
    path = tmp_path / "latin1.json"
    path.write_bytes(raw)
    with pytest.raises(LockError, match=r"is not UTF-8 \(byte 0xe9 at offset \d+\)"):
        load_lock(path)


def test_lock_nested_too_deep_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    """A 100000-deep JSON array is a LockError, not the parser's RecursionError."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(LockError, match="nested too deeply") as err:
        load_lock(path)
    assert "dsv4hal tune" in (err.value.remedy or "")


def test_lock_that_is_not_json_is_refused_with_its_position(tmp_path: Path) -> None:
    """Broken JSON is a LockError giving the line and column of the parse error."""
    path = tmp_path / "broken.json"
    path.write_text('{"format": "dsv4hal-lock/1",\n  "platform": }')
    with pytest.raises(LockError, match="is not JSON .* line 2 column"):
        load_lock(path)


@pytest.mark.parametrize("bad, message", [(5, "lock=5 is not a path"), (b"lock.json", "is not a path"),
                                          ("lock.json\x00", "NUL byte")])
def test_lock_argument_that_is_not_a_path_is_refused(bad: object, message: str) -> None:
    """select_platform(lock=...) with an int, bytes or a NUL byte in the name is a LockError, not Type/ValueError."""
    with pytest.raises(LockError, match=message):
        dsv4hal.select_platform("cpu", lock=bad)  # type: ignore[arg-type]


def test_tune_check_with_a_files_entry_for_torch_exits_2_naming_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`tune --check` on a lock whose `files` names torch (versioned, never hashed) is exit 2, not KeyError."""
    path = _write(tmp_path, _edited(lambda d: d.update(files={"torch": {"sha256": "0" * 64}})))
    assert main(["tune", "--check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "files.torch names torch" in err and "Traceback" not in err


def test_info_with_a_malformed_lock_exits_2_with_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`info --lock BAD` and `DSV4HAL_LOCK=BAD info` exit 2 with the typed message and its remedy, nothing else."""
    path = _write(tmp_path, _edited(lambda d: _bucket(d).update(candidates=None)))
    assert main(["info", "--platform", "cpu", "--lock", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"dsv4hal info: error: lock file {str(path)!r}: {BUCKET_PATH}.candidates is null, "
                                "expected an object of candidates",
                                "Remedy: re-run `dsv4hal tune` on this machine to write the lock again "
                                "(`dsv4hal tune --out PATH`)"]
    monkeypatch.setenv("DSV4HAL_LOCK", str(path))
    assert main(["info", "--platform", "cpu"]) == 2
    assert "candidates is null" in capsys.readouterr().err


def test_info_with_a_malformed_lock_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    """The installed command, not only main(): exit 2 and no traceback for a lock of the wrong shape."""
    path = _write(tmp_path, _edited(lambda d: d.update(machine=None)))
    r = run_cli("info", "--platform", "cpu", env={"DSV4HAL_LOCK": str(path)})
    assert r.returncode == 2 and "Traceback" not in r.stderr and "machine is null" in r.stderr


def test_tune_update_refuses_a_malformed_existing_lock_before_measuring(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`tune --update` reads the existing lock through the schema first: a bad one costs no measurement."""
    import dsv4hal.tune as tune_module

    monkeypatch.setattr(tune_module, "tune", lambda *a, **k: pytest.fail("measured before reading the old lock"))
    path = _write(tmp_path, _edited(lambda d: d.update(ops=[])))
    assert main(["tune", "--platform", "cpu", "--ops", "mhc_post", "--out", str(path), "--update"]) == 2
    assert "ops is an array" in capsys.readouterr().err


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
TOP_LEVEL = ("platform", "dsv4hal", "machine", "libraries", "plugins", "files", "settings", "ops")
_SCRATCH = Path(tempfile.mkdtemp(prefix="dsv4hal-lock-fuzz-"))


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every member path inside a JSON value (keys and list indices)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def _use(data: Any) -> None:
    """Load `data` as a lock and run what reads it at selection (enforce: load and differences), at a decision
    (pick, for the lock's bucket and for a bucket it lacks) and in `dsv4hal info` (describe)."""
    path = _SCRATCH / "lock.json"
    path.write_text(json.dumps(data))
    p = _platform()
    in_force = enforce(path, "cpu", p.info, p.registry, "reselect")
    in_force.describe()
    for case in (CASE, {**CASE, "k": 1024}):
        in_force.pick("indexer_topk", case, {"torch_reference": []})


@functools.cache
def _platform() -> dsv4hal.Platform:
    return dsv4hal.select_platform("cpu")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON | st.dictionaries(st.sampled_from(TOP_LEVEL), JSON).map(lambda d: {**d, "format": FORMAT}))
def test_any_json_value_as_a_lock_is_a_lock_or_a_lock_error(value: Any) -> None:
    """Whatever JSON a lock file holds, loading it gives a lock or LockError, never another exception."""
    try:
        _use(value)
    except LockError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_field_of_a_valid_lock_replaced_is_accepted_or_a_lock_error(data: st.DataObject) -> None:
    """A valid lock with any one member replaced by any JSON value is either followed (differences and pick run)
    or refused with a dsv4hal error: the code after load_lock never meets a shape it does not expect."""
    lock = _valid_lock()
    where = data.draw(st.sampled_from(_paths(lock)[1:]), label="path")
    parent = lock
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = data.draw(JSON, label="value")
    try:
        _use(lock)
    except Dsv4HalError:
        pass


def test_schema_paths_quote_labels_that_are_not_names() -> None:
    """Field paths read like JSONPath: .name for identifiers, ["label"] for bucket labels, [i] for items."""
    assert lock_schema.child("", "ops") == "ops"
    assert lock_schema.child("ops.x.buckets", "k=1,size=small") == 'ops.x.buckets["k=1,size=small"]'
    assert lock_schema.child("ops.x.features", 2) == "ops.x.features[2]"
