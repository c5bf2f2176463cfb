"""Lock files: the kernel `dsv4hal tune` measured fastest per op and shape bucket on one machine, with the
machine, the library versions and every candidate's times, so that selection is reproducible.

A lock is configuration: load_lock checks the file whole against dsv4hal.lock_schema and raises LockError naming
the field that does not fit, so the code below indexes a lock of the right shape.

A lock is honoured or refused, never half-applied: select_platform(lock=...) (or DSV4HAL_LOCK) checks the
machine, the platform, dsv4hal's, the plugins' and the libraries' versions and that every locked kernel is
registered, and raises LockMismatchError naming each difference. With lock_mismatch="reselect" the caller
accepts static selection instead, and every decision says so in explain. Ops the lock does not cover
(tune --ops) keep the static choice, also said in explain."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsv4hal import lock_schema
from dsv4hal.errors import LockError, LockMismatchError
from dsv4hal.hardware import PlatformInfo
from dsv4hal.ops.buckets import DECLARED, bucket_of, missing_features

FORMAT = "dsv4hal-lock/1"
Mismatch = Literal["error", "reselect"]
MISMATCH_POLICIES: tuple[str, ...] = ("error", "reselect")
# The machine identity a lock must match. sm_count, device_count and how the machine was detected are left
# out: they change with CUDA initialisation or the number of GPUs, not with which kernel is fastest on one.
MACHINE_FIELDS = ("vendor", "arch", "device_name", "fp8")
# Libraries hashed at tune time: compiled kernels of modest size (torch and triton are versioned, not hashed).
_NOT_HASHED = lock_schema.NOT_HASHED
_HASH_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".hsaco", ".cubin")
_HASH_LIMIT = 1 << 30  # bytes per library; larger ones are recorded as skipped (hashing would take seconds)


def machine_of(info: PlatformInfo) -> dict[str, object]:
    return {f: (info.vendor.value if f == "vendor" else getattr(info, f)) for f in MACHINE_FIELDS}


def dsv4hal_version() -> str:
    import dsv4hal

    return str(dsv4hal.__version__)


def _library_files(name: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(name.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] or ([Path(spec.origin)] if spec.origin else [])
    files: list[Path] = []
    for root in roots:
        if root.is_file():
            files.append(root)
        elif root.is_dir():
            files += [p for p in root.rglob("*") if p.suffix in _HASH_SUFFIXES and p.is_file()]
    return sorted(files)


def hash_libraries(names: Iterable[str]) -> dict[str, dict[str, object]]:
    """sha256 over the compiled files of each vendor library (path relative to the package, then bytes)."""
    out: dict[str, dict[str, object]] = {}
    for name in sorted(set(names) - _NOT_HASHED):
        files = _library_files(name)
        if not files:
            out[name] = {"skipped": "no compiled files found (a torch-op namespace or a pure-Python package)"}
            continue
        total = sum(p.stat().st_size for p in files)
        if total > _HASH_LIMIT:
            out[name] = {"skipped": f"{total} bytes of compiled files: too large to hash cheaply", "files": len(files)}
            continue
        h = hashlib.sha256()
        base = files[0].parent
        for p in files:
            h.update(os.path.relpath(p, base).encode() + b"\0")
            h.update(p.read_bytes())
        out[name] = {"sha256": h.hexdigest(), "files": len(files), "bytes": total}
    return out


@dataclass(frozen=True)
class Lock:
    path: str
    data: Mapping[str, Any]

    @property
    def platform(self) -> str:
        return str(self.data["platform"])

    @property
    def ops(self) -> Mapping[str, Any]:
        return self.data["ops"]

    def describe(self) -> str:
        n = sum(len(o["buckets"]) for o in self.ops.values())
        return (f"{self.path} (platform {self.platform}, {self.data['machine'].get('device_name', '')}, "
                f"{len(self.ops)} ops, {n} buckets, made {self.data.get('created', '?')})")


REGENERATE = "re-run `dsv4hal tune` on this machine to write the lock again (`dsv4hal tune --out PATH`)"


def _read(path: object) -> tuple[str, Any]:
    """The lock's name and its parsed JSON; LockError for a path that is none, a missing or unreadable file,
    bytes that are not UTF-8 or not JSON, and JSON nested deeper than the parser's recursion limit."""
    if not isinstance(path, (str, os.PathLike)):
        raise LockError(f"lock={path!r} is not a path ({type(path).__name__})",
                        remedy="pass the lock file's path as a str or pathlib.Path, or None for no lock")
    name = os.fspath(path)
    if not isinstance(name, str) or "\0" in name:
        raise LockError(f"lock path {name!r} is not a file name (a NUL byte, or bytes)",
                        remedy="pass the lock file's path as text without NUL bytes")
    try:
        raw = Path(name).read_bytes()
    except FileNotFoundError:
        raise LockError(f"lock file {name!r} does not exist",
                        remedy="write one with `dsv4hal tune --out PATH`, or unset DSV4HAL_LOCK") from None
    except OSError as exc:
        raise LockError(f"lock file {name!r} cannot be read: {exc.strerror or exc}",
                        remedy="check the path and its permissions, or " + REGENERATE) from None
    try:
        return name, json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
    except json.JSONDecodeError as exc:
        problem = f"is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except RecursionError:
        problem = "is nested too deeply to be a lock"
    raise LockError(f"lock file {name!r} {problem}", remedy=REGENERATE)


def load_lock(path: str | os.PathLike[str]) -> Lock:
    """Read a lock and check it whole against the lock schema (dsv4hal.lock_schema): LockError naming the file
    and the JSON path of the first field that does not fit, so that nothing later meets a malformed lock."""
    name, data = _read(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else lock_schema.describe(data)
        raise LockError(f"lock file {name!r} has format {got!r}, this dsv4hal reads {FORMAT!r}",
                        remedy="regenerate it with this version's `dsv4hal tune`")
    try:
        lock_schema.validate(data)
    except lock_schema.Invalid as bad:
        raise LockError(f"lock file {name!r}: {bad}", remedy=REGENERATE) from None
    return Lock(name, data)


def _diff_versions(what: str, locked: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    out = []
    for name in sorted(set(locked) | set(now)):
        a, b = locked.get(name), now.get(name)
        if a == b:
            continue
        if a is None:
            out.append(f"{what} {name} {b} is installed but was absent when the lock was made")
        elif b is None:
            out.append(f"{what} {name} {a} was in the lock but is not installed now")
        else:
            out.append(f"{what} {name} version {b} differs from the locked {a}")
    return out


def differences(lock: Lock, platform: str, info: PlatformInfo, registry: Any) -> list[str]:
    """Everything that makes `lock` not describe this machine and registry (empty: it does)."""
    d = lock.data
    out = []
    if lock.platform != platform:
        out.append(f"the lock is for platform {lock.platform}, the selected platform is {platform}")
    now = machine_of(info)
    for f in MACHINE_FIELDS:
        if d["machine"].get(f) != now[f]:
            out.append(f"machine {f} is {now[f]!r}, the lock was made on {d['machine'].get(f)!r}")
    if d.get("dsv4hal") != dsv4hal_version():
        out.append(f"dsv4hal version {dsv4hal_version()} differs from the locked {d.get('dsv4hal')}")
    out += _diff_versions("library", d["libraries"], info.libraries)
    out += _diff_versions("plugin", d.get("plugins", {}), registry.plugin_versions)
    for op, entry in d["ops"].items():
        declared, features = DECLARED.get(op), entry["features"]  # a list, or "all" (keyed on the whole case)
        if declared is not None and features != list(declared.features):
            by = features if isinstance(features, str) else ", ".join(features)
            out.append(f"{op}: the lock's buckets are by ({by}), this dsv4hal's by "
                       f"({', '.join(declared.features)}): re-run `dsv4hal tune --ops {op} --update`")
        names = set(registry.kernels.get(op, {}))
        for label, b in entry["buckets"].items():
            if b["chosen"] is not None and b["chosen"] not in names:
                out.append(f"{op} [{label}]: locked implementation {b['chosen']!r} is not registered")
    return out


def check_hashes(lock: Lock) -> list[str]:
    """Differences between the lock's library file hashes and the installed files (reads them: not cheap)."""
    locked = lock.data.get("files", {})
    now = hash_libraries(locked)
    out = []
    for n, v in sorted(locked.items()):
        got = now.get(n, {})
        if "sha256" in v and got.get("sha256") != v["sha256"]:
            out.append(f"library {n} files changed (sha256 {got.get('sha256', got.get('skipped'))} != locked "
                       f"{v['sha256']})")
    return out


@dataclass(frozen=True)
class Pick:
    """What the lock says for one decision: the implementation (None: keep the static choice), notes for
    explain, and the measured microseconds of every candidate of the bucket (None: not measured)."""

    name: str | None
    notes: tuple[str, ...] = ()
    measured: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class LockInForce:
    """A loaded lock, the differences found at selection and the caller's policy for mismatches."""

    lock: Lock
    mismatch: Mismatch = "error"
    problems: tuple[str, ...] = ()  # global differences (only kept under "reselect"; "error" raised them)

    @property
    def applied(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        state = "in force" if self.applied else "NOT applied (lock_mismatch=reselect): " + "; ".join(self.problems)
        return f"{self.lock.describe()}: {state}"

    def pick(self, op: str, case: Mapping[str, object], verdicts: Mapping[str, list[str]], *,
             advisory: bool = False) -> Pick:
        """The lock's choice for (op, case) given every candidate's reasons against the case (empty: eligible).
        Raises LockMismatchError for anything the lock cannot honour, unless the policy is "reselect" or the
        pick is only `advisory` (a forced implementation decides anyway)."""
        path = self.lock.path
        if not self.applied:
            return Pick(None, (f"lock {path} not applied: " + "; ".join(self.problems) + "; static priority used "
                               "(lock_mismatch=reselect)",))
        entry = self.lock.ops.get(op)
        if entry is None:
            return Pick(None, (f"lock {path} does not cover {op} (tuned ops: {', '.join(self.lock.ops)}); "
                               "static priority",))
        missing = missing_features(op, case)
        if missing:
            return Pick(None, (f"case states no {', '.join(missing)}: lock {path} decides the full cases of calls "
                               f"(buckets of {op}: {', '.join(entry['buckets'])}); static priority shown",))
        label = bucket_of(op, case)
        b = entry["buckets"].get(label)
        measured = {n: c.get("us") for n, c in (b or {}).get("candidates", {}).items()}
        if b is None:
            problem = (f"lock {path} has no measurement for {op} bucket [{label}] (tuned buckets: "
                       f"{', '.join(entry['buckets'])})")
        elif b["chosen"] is None:  # the schema makes `chosen` a name or null, with `why` saying which
            problem = f"lock {path}: no implementation of {op} passed the check in bucket [{label}]: {b['why']}"
        elif b["chosen"] not in verdicts:
            problem = f"lock {path}: locked {op} implementation {b['chosen']!r} is not registered"
        elif verdicts[b["chosen"]]:
            problem = (f"lock {path}: locked {op} implementation {b['chosen']!r} cannot run case "
                       f"[{_case_text(case)}]: {'; '.join(verdicts[b['chosen']])}")
        else:
            return Pick(b["chosen"], (f"lock {path} [{label}]: {b['why']}",), measured)
        if advisory:
            return Pick(None, (problem,), measured)
        if self.mismatch == "reselect":
            return Pick(None, (problem + "; static priority used (lock_mismatch=reselect)",), measured)
        raise LockMismatchError(problem, remedy="re-run `dsv4hal tune` on this machine, or pass "
                                "lock_mismatch='reselect' (DSV4HAL_LOCK_MISMATCH=reselect) to accept static selection")


def _case_text(case: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(case.items()))


def enforce(path: str | os.PathLike[str], platform: str, info: PlatformInfo, registry: Any,
            mismatch: str = "error") -> LockInForce:
    """Load a lock and check it against the selected platform; raise LockMismatchError naming every
    difference unless `mismatch` is "reselect" (then the lock is recorded as not applied)."""
    if mismatch not in MISMATCH_POLICIES:
        raise LockError(f"lock_mismatch={mismatch!r} is not a policy", remedy="use 'error' or 'reselect'")
    lock = load_lock(path)
    diffs = differences(lock, platform, info, registry)
    if diffs and mismatch == "error":
        raise LockMismatchError(
            f"lock {lock.path} does not match this machine:\n" + "\n".join(f"  - {x}" for x in diffs),
            remedy="re-run `dsv4hal tune` here and ship the new lock, or pass lock_mismatch='reselect' "
                   "(DSV4HAL_LOCK_MISMATCH=reselect) to accept static selection, or unset DSV4HAL_LOCK")
    return LockInForce(lock, mismatch, tuple(diffs))  # type: ignore[arg-type]
