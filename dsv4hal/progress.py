"""Progress of long CLI runs (conformance, demo, bench): a tqdm bar on a terminal when tqdm is installed,
plain lines otherwise (and always when the stream is not a terminal, e.g. in CI logs)."""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Progress:
    """`update(text)` advances by one step; `total` None when the count is not known in advance."""

    def __init__(self, total: int | None, desc: str, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self._bar: Any = None
        if enabled and self.stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, file=self.stream, leave=False, dynamic_ncols=True)

    @property
    def animated(self) -> bool:
        """A live bar (a terminal with tqdm), not plain lines."""
        return self._bar is not None

    def update(self, text: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text[:60], refresh=False)
            self._bar.update(1)
            return
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        print(f"[{self.desc} {count}] {text}".rstrip(), file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """A line that stays (a failure, a summary) without breaking the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
