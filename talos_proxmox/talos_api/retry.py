"""Retrying with exponential backoff under one overall deadline (pure; clock and sleep injectable)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays initial, initial*factor, ... capped at maximum."""

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 15.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * self.factor, self.maximum)


class GaveUp(TimeoutError):
    """The overall timeout passed while the call kept failing; last_error is the final failure."""

    def __init__(self, what: str, timeout: float, attempts: int, last_error: BaseException):
        self.last_error = last_error
        self.attempts = attempts
        super().__init__(f"{what}: gave up after {timeout:g}s and {attempts} attempts; last error: {last_error}")


def is_retryable(error: BaseException) -> bool:
    return bool(getattr(error, "retryable", False))


def call_with_retry(
    call: Callable[[float], T],
    *,
    timeout: float,
    what: str,
    backoff: Backoff = Backoff(),
    retry_if: Callable[[BaseException], bool] = is_retryable,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """call(remaining_seconds) until it returns, or raise GaveUp once `timeout` seconds have passed.

    Errors for which retry_if is false propagate at once. The remaining time is passed to the call
    so it can bound its own deadline. No attempt starts after a sleep that would reach the deadline,
    so the last error reported is a real one, not a deadline cut short by us.
    """
    deadline = clock() + timeout
    attempts = 0
    for delay in backoff.delays():
        attempts += 1
        try:
            return call(max(deadline - clock(), 0.001))
        except Exception as exc:  # noqa: BLE001 - filtered by retry_if
            if not retry_if(exc):
                raise
            if deadline - clock() <= delay:
                raise GaveUp(what, timeout, attempts, exc) from exc
            sleep(delay)
    raise AssertionError("unreachable")  # Backoff.delays never ends
