"""Named crash points for crash-recovery tests: ``ICECDC_FAILPOINT=after-commit:3`` makes the
process SIGKILL itself the 3rd time it passes ``after-commit``; ``...:3:stop`` makes it SIGSTOP
itself there instead (frozen, as by a long pause, until someone sends SIGCONT). Unset (always, in
production), ``hit`` is a dictionary lookup."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

ENV = "ICECDC_FAILPOINT"
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
_passes: Counter[str] = Counter()
_lock = threading.Lock()  # the ingester passes after-commit on several threads at once


def hit(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    wanted, _, rest = spec.partition(":")
    if wanted != name:
        return
    count, _, action = rest.partition(":")
    with _lock:
        _passes[name] += 1
        now = _passes[name] == int(count or 1)
    if now:
        os.kill(os.getpid(), ACTIONS[action or "kill"])
