"""pytest's JUnit XML as the cases and counts of a result file."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

STATUS = {"failure": "failed", "error": "error", "skipped": "skipped"}


def junit_cases(path: Path) -> dict[str, Any]:
    """{"summary": counts per status, "cases": [{test, status, detail (not for a pass)}]}."""
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        case: dict[str, str] = {"test": f"{tc.get('classname')}::{tc.get('name')}", "status": "passed"}
        for tag, status in STATUS.items():
            el = tc.find(tag)
            if el is not None:
                case.update(status=status, detail=(el.get("message") or "")[:300])
                break
        cases.append(case)
    summary = {s: sum(c["status"] == s for c in cases) for s in ("passed", "failed", "error", "skipped")}
    return {"summary": summary, "cases": cases}
