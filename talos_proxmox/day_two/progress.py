"""Progress lines for long day-two operations. The engine shows what a dynamic provider writes to stderr
(pulumi sdk/go/common/resource/plugin/plugin.go hides only other plugins' output), so a roll, a removal
or a wait prints one line per step: the operation, the node (with its place in the roll, "2 of 4"), the
step and the time since it started."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

PREFIX = "talos-proxmox"


def progress_printer(operation: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                     position: str | None = None) -> Callable[[str, str], None]:
    """An `on_event(step, node)` callback writing `talos-proxmox: <operation> <node> [(<n of N>)]: <step> (<n>s)`."""
    started = clock()
    place = f" ({position})" if position else ""

    def event(step: str, node: str) -> None:
        out = stream or sys.stderr
        out.write(f"{PREFIX}: {operation} {node}{place}: {step} ({clock() - started:.0f}s)\n")
        out.flush()

    return event


def note(operation: str, text: str, stream: TextIO | None = None) -> None:
    """One line `talos-proxmox: <operation>: <text>`, for what a step found (shown by the CLI as it runs)."""
    out = stream or sys.stderr
    out.write(f"{PREFIX}: {operation}: {text}\n")
    out.flush()
