"""A session's log of non-fatal errors: the first few of each minute at INFO, then only their count.

A client that repeats a refused message gets one error message per refusal, and used to get one INFO
line each as well (28 MB of log from one client in the attack round): the log is the operator's, and a
client must not be able to fill it. ``ErrorLog.refused`` logs the first ``FIRST_ERRORS`` errors of a
window of ``WINDOW_S``; the rest are counted by code, and one line at the end of the window says how many
were left out ("N more non-fatal errors suppressed"). Fatal errors are not its business: the session
logs them always, once, as it closes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

#: Errors of a session logged in full per window: enough to see what a client does wrong.
FIRST_ERRORS = 10
#: The window, in seconds: a client that errs steadily costs the log one line a minute.
WINDOW_S = 60.0


class ErrorLog:
    """Rate-limited INFO lines for one session's non-fatal errors.

    Args:
        log: the session's logger (its lines carry the session id).
    """

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self.log = log
        self.first = FIRST_ERRORS
        self.window_s = WINDOW_S
        self._window_start = float("-inf")
        self._logged = 0
        self._suppressed: collections.Counter[str] = collections.Counter()
        self._timer: asyncio.TimerHandle | None = None

    def refused(self, code: str, message: str) -> None:
        """A non-fatal error was reported to the client: log it, or count it once the window's share is
        spent (the count is logged when the window ends)."""
        now = time.monotonic()
        if now >= self._window_start + self.window_s:
            self.flush()
            self._window_start, self._logged = now, 0
        if self._logged < self.first:
            self._logged += 1
            self.log.info("error %s: %s", code, message)
            return
        self._suppressed[code] += 1
        if self._timer is None:
            delay = self._window_start + self.window_s - now
            self._timer = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        """Log how many errors were left out since the last such line, if any (a session's end calls it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._suppressed:
            return
        total = sum(self._suppressed.values())
        codes = ", ".join(f"{code} x{n}" for code, n in self._suppressed.most_common())
        self._suppressed.clear()
        self.log.info("%d more non-fatal errors suppressed (%s)", total, codes)
