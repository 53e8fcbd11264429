"""The suite's own Spark settings reach its JVMs (``tests/spark-conf``, README *Developing*): the shared
SparkSession's driver, and a driver the tests start as a process of its own, run with the client compiler
only; the shared session interprets its queries' expressions, a driver process generates their code as
production does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tests.conftest import INTERPRETED_EXPRESSIONS

CLIENT_COMPILER_ONLY = "-XX:TieredStopAtLevel=1"
REPO = Path(__file__).resolve().parents[2]


def _jvm_arguments(spark: SparkSession) -> list[str]:
    jvm: Any = spark.sparkContext._jvm  # py4j's view of the driver's JVM
    return list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())


def _code_generation(spark: SparkSession) -> dict[str, str | None]:
    return {key: spark.conf.get(key) for key in INTERPRETED_EXPRESSIONS}


def test_the_shared_session_and_a_driver_process_run_with_the_suites_spark_settings(
    spark: SparkSession,
) -> None:
    assert CLIENT_COMPILER_ONLY in _jvm_arguments(spark)
    assert _code_generation(spark) == INTERPRETED_EXPRESSIONS
    printed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json\n"
            "from pipelines.spark_session import local_spark_session\n"
            "from tests.e2e.test_suite_jvms import _code_generation, _jvm_arguments\n"
            "session = local_spark_session('jvm-arguments', 'local[1]')\n"
            "print('ARGS', ' '.join(_jvm_arguments(session)))\n"
            "print('CODEGEN', json.dumps(_code_generation(session)))\n"
            "session.stop()\n",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    ).stdout
    arguments = next(line for line in printed.splitlines() if line.startswith("ARGS ")).split()
    assert CLIENT_COMPILER_ONLY in arguments
    codegen = next(line for line in printed.splitlines() if line.startswith("CODEGEN "))
    assert json.loads(codegen.removeprefix("CODEGEN ")) == {
        "spark.sql.codegen.wholeStage": "true",
        "spark.sql.codegen.factoryMode": "FALLBACK",
    }
