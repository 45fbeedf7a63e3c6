"""Run a command as a child subreaper (Linux prctl): its descendants orphaned on the way
(the compile workers a pytest worker leaves to end on their own when it exits) are
re-parented to this process, not to pid 1, and reaped here, so their CPU seconds reach
whoever waits for this process (scripts/test.sh's phase report). Exits with the
command's status; once the command has ended, waits at most REAP_SECONDS for the rest.

    python3 scripts/reaper.py CMD [ARG...]
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
REAP_SECONDS = 60.0
POLL_SECONDS = 0.2


def main(argv: list) -> int:
    if not argv:
        print("reaper: usage: reaper.py CMD [ARG...]", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        # Never a reason to fail the run: only the CPU report is the poorer.
        print(f"reaper: no subreaper ({os.strerror(ctypes.get_errno())})", file=sys.stderr)
    child = subprocess.Popen(argv)
    # Ctrl-C reaches the whole foreground group; the command decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status = None
    deadline = None
    while True:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # none left
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(raw)
            child.returncode = status  # reaped here: Popen must not wait for it again
            deadline = time.monotonic() + REAP_SECONDS
        elif pid == 0:
            if deadline is not None and time.monotonic() > deadline:
                print("reaper: descendants still running; left to pid 1", file=sys.stderr)
                break
            time.sleep(POLL_SECONDS)
    if status is None:
        return 1
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
