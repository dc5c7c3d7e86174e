"""The benchmark's CPU meter counts a part's processes and their descendants, including
those that end inside the window (a service's helper process), never less than before."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.cpu import CpuMeter

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
# a parent that starts a child burning 0.4 s of CPU, waits for it, then idles
PARENT = (f"import subprocess, sys, time\n"
          f"subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n"
          "print('done', flush=True)\n"
          "time.sleep(30)\n")


def test_a_child_that_ends_inside_the_window_is_still_counted() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)  # the child is running, and is part of the tree at the start
        meter = CpuMeter({"service": [parent.pid]})
        meter.start()
        assert parent.stdout is not None and parent.stdout.readline().strip() == "done"
        use = meter.stop()
    finally:
        parent.kill()
        parent.communicate()
    # the child burned about 0.2 s more after the start; it left the tree, but its parent
    # waited for it, so its time is in the parent's children times
    assert 0.1 <= use.seconds["service"] <= 1.5
