"""scripts/bench.py states how busy the machine was, so that a figure measured beside another job shows it."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

SPIN_SECONDS = 1.0


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="CPU accounting reads Linux's /proc/stat")
def test_cpu_watch_counts_another_process_and_not_its_own(load_script):
    bench = load_script("bench")

    # Our own busy CPU is not someone else's: spinning here reads like sleeping (whatever else runs).
    watch = bench.CpuWatch()
    time.sleep(SPIN_SECONDS)
    asleep = watch.stop()
    watch = bench.CpuWatch()
    _spin(SPIN_SECONDS)
    own = watch.stop()
    assert own["other_cpus"] < asleep["other_cpus"] + 0.5, (own, asleep)

    spinner = f"import time\nend = time.perf_counter() + {SPIN_SECONDS}\nwhile time.perf_counter() < end: pass"
    # A process we have not waited for is someone else's (a figure's reaped subprocess is its own).
    watch = bench.CpuWatch()
    other_process = subprocess.Popen([sys.executable, "-c", spinner])
    time.sleep(SPIN_SECONDS)
    other = watch.stop()
    other_process.wait()
    assert other["other_cpus"] > 0.6, other

    watch = bench.CpuWatch()
    subprocess.run([sys.executable, "-c", spinner], check=True)
    child = watch.stop()
    assert child["other_cpus"] < asleep["other_cpus"] + 0.5, (child, asleep)
    assert set(other) == {"other_cpus", "steal_cpus"}
