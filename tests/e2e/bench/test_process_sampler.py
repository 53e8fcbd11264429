"""The cluster bench's process sampler counts a driver's JVM as the JVM: its process starts as the
spark-submit script and becomes Java with ``exec``, and reads an empty command line while it exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench.telemetry_cluster_bench import ProcessSampler

BUSY = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.6: pass"


def test_a_process_that_execs_java_is_the_driver_jvm_with_its_cpu_counted(tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"  # a stand-in: the sampler knows a JVM by its program's name
    java.parent.mkdir()
    java.symlink_to(os.path.realpath(sys.executable))
    launcher = f"sleep 0.3; exec {java} -c '{BUSY}'"
    driver_code = textwrap.dedent(
        f"""
        import subprocess, time
        child = subprocess.Popen(["bash", "-c", {launcher!r}])
        time.sleep(2.5)  # the child exits meanwhile and stays a zombie, its command line empty
        child.wait()
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", driver_code])
    with ProcessSampler(driver.pid, [], interval_s=0.05) as sampler:
        time.sleep(0.1)
        sampler.mark()
        driver.wait(timeout=30)
    roles = sampler.roles()
    assert roles["driver JVM"].processes == 1
    assert roles["driver JVM"].cpu_s >= 0.4
    assert roles["driver Python"].processes == 2  # the driver and the launcher's `sleep`
    assert roles["driver Python"].cpu_s < roles["driver JVM"].cpu_s
    assert set(roles) == {"driver Python", "driver JVM"}
