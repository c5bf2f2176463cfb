"""The shape of a lock file (dsv4hal-lock/1), checked whole when it is loaded, so that the code reading it
(lock.differences, LockInForce.pick, tune --check and --update) can trust every field it indexes.

A schema here is a function check(value, path) that raises Invalid naming the JSON path of the first field
that does not fit (`ops.indexer_topk.buckets["k=512,..."].chosen`). The checks descend only as deep as the
schema, so a hostile file cannot make them recurse. Fields tune writes for people (settings, a candidate's
tolerance text) are checked for their type only; unknown keys inside records are allowed (informative fields
added by a later tune), unknown ops and unexpected `files` entries are not (nothing could read them)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dsv4hal.ops.catalog import OP_NAMES

Check = Callable[[Any, str], None]
# Libraries recorded by version in `libraries`, never hashed into `files` (dsv4hal.lock hashes the others).
NOT_HASHED = frozenset({"torch", "triton", "triton-interpreter"})
CANDIDATE_STATUSES = ("measured", "wrong", "failed", "not-timed", "ineligible")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Invalid(Exception):
    """A field of the lock does not fit its schema: `path` is its JSON path, `problem` what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the lock'} {problem}")
        self.path, self.problem = path, problem


def child(path: str, key: str | int) -> str:
    """The JSON path of a member: .name for identifiers, ["label"] for other keys, [i] for list items."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENT.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def describe(value: Any) -> str:
    """A JSON value as an error message shows it: its JSON type, and short values themselves."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40] + ('...' if len(value) > 40 else ''))}"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    return f"an object ({', '.join(list(map(str, value))[:4])}{', ...' if len(value) > 4 else ''})"


def leaf(expected: str, test: Callable[[Any], bool]) -> Check:
    def check(value: Any, path: str) -> None:
        if not test(value):
            raise Invalid(path, f"is {describe(value)}, expected {expected}")
    return check


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


STR = leaf("a string", lambda v: isinstance(v, str))
NAME = leaf("a non-empty string", lambda v: isinstance(v, str) and bool(v))
BOOL = leaf("true or false", lambda v: isinstance(v, bool))
COUNT = leaf("a non-negative integer", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
INT = leaf("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
MICROSECONDS = leaf("a finite non-negative number of microseconds",
                    lambda v: _is_number(v) and math.isfinite(v) and v >= 0)
SCALAR = leaf("a string, number, boolean or null", lambda v: v is None or isinstance(v, (str, int, float)))
ERROR_SIZE = leaf("a number (or its text, for inf and nan)", lambda v: _is_number(v) or isinstance(v, str))
SHA256 = leaf("64 hex digits", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None)


def nullable(check: Check) -> Check:
    def run(value: Any, path: str) -> None:
        if value is not None:
            check(value, path)
    return run


def obj(required: Mapping[str, Check], optional: Mapping[str, Check] | None = None) -> Check:
    """An object with these keys (others are allowed and not read)."""
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            with_keys = f" with {', '.join(required)}" if required else ""
            raise Invalid(path, f"is {describe(value)}, expected an object{with_keys}")
        for key, sub in required.items():
            if key not in value:
                raise Invalid(child(path, key), "is missing")
            sub(value[key], child(path, key))
        for key, sub in (optional or {}).items():
            if key in value:
                sub(value[key], child(path, key))
    return check


def map_of(value_check: Check, *, keys: Callable[[str], str | None] | None = None, what: str = "entries") -> Check:
    """An object of any keys (`keys` returns why a key is refused, or None) whose values fit `value_check`."""
    def check(value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(path, f"is {describe(value)}, expected an object of {what}")
        for key, member in value.items():
            why = keys(key) if keys else None
            if why:
                raise Invalid(child(path, key), why)
            value_check(member, child(path, key))
    return check


def list_of(item: Check, what: str) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            raise Invalid(path, f"is {describe(value)}, expected an array of {what}")
        for i, member in enumerate(value):
            item(member, child(path, i))
    return check


def one_of(values: Iterable[str]) -> Check:
    allowed = tuple(values)
    return leaf("one of " + ", ".join(allowed), lambda v: isinstance(v, str) and v in allowed)


def _features(value: Any, path: str) -> None:
    if value != "all":  # an op without declared buckets is keyed on its whole case
        list_of(NAME, 'feature names (or "all")')(value, path)


_CANDIDATE_FIELDS = obj({"status": one_of(CANDIDATE_STATUSES)}, {
    "us": nullable(MICROSECONDS), "per_sample_us": map_of(MICROSECONDS, what="sample times"), "method": STR,
    "max_error": ERROR_SIZE, "tolerance": STR, "reasons": list_of(STR, "reasons"), "priority": INT, "tier": STR,
    "plugin": STR})


def _candidate(value: Any, path: str) -> None:
    _CANDIDATE_FIELDS(value, path)
    if value["status"] == "measured" and value.get("us") is None:
        state = "is null" if "us" in value else "is missing"
        raise Invalid(child(path, "us"), f"{state}: a measured candidate records its time")


def _op_key(name: str) -> str | None:
    if name in OP_NAMES:
        return None
    return f"names an op this dsv4hal does not have (its ops: {', '.join(OP_NAMES)})"


def _files_key(name: str) -> str | None:
    if name in NOT_HASHED:
        return f"names {name}, which is recorded by version in `libraries`: `files` holds vendor libraries' hashes only"
    return None


def _file_hash(value: Any, path: str) -> None:
    if isinstance(value, dict) and "skipped" in value:
        obj({"skipped": STR}, {"files": COUNT})(value, path)
    else:
        obj({"sha256": SHA256}, {"files": COUNT, "bytes": COUNT})(value, path)


BUCKET = obj({"chosen": nullable(NAME), "why": STR, "candidates": map_of(_candidate, what="candidates")},
             {"static": nullable(NAME), "samples": list_of(STR, "sample names"),
              "case": map_of(SCALAR, what="case features")})
LOCK = obj({
    "format": STR, "platform": NAME, "dsv4hal": STR,
    "machine": obj({"vendor": STR, "arch": STR, "device_name": STR, "fp8": STR},
                   {"sm_count": COUNT, "device_count": COUNT, "detected_by": STR}),
    "libraries": map_of(STR, what="library versions"),
    "ops": map_of(obj({"features": _features, "buckets": map_of(BUCKET, what="buckets")}), keys=_op_key,
                  what="ops"),
}, {
    "created": STR, "plugins": map_of(STR, what="plugin versions"),
    "files": map_of(_file_hash, keys=_files_key, what="library hashes"),
    "settings": obj({}, {"margin": leaf("a number", _is_number), "interpreted": BOOL}),
})


def validate(data: Any) -> None:
    """Raise Invalid naming the first field of `data` (a parsed lock) that does not fit the lock schema."""
    LOCK(data, "")
