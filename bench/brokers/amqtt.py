"""amqtt (a pure-Python broker from PyPI), installed into its own virtualenv beside the benchmark.

amqtt's dependencies (pydantic, typer, websockets, ...) may conflict with the project's, so it never enters
the project's virtualenv: `prepare()` creates `bench/.venv-amqtt` (git-ignored) with `python -m venv` and
`pip install amqtt` the first time, and the broker runs with that interpreter through `amqtt_launch.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.brokers.base import BrokerUnavailable, BrokerUnderTest

BENCH_DIR = Path(__file__).resolve().parent.parent
DEFAULT_VENV = BENCH_DIR / ".venv-amqtt"
LAUNCHER = Path(__file__).resolve().parent / "amqtt_launch.py"
REQUIREMENT = "amqtt"
INSTALL_TIMEOUT_S = 600


class Amqtt(BrokerUnderTest):
    """amqtt with anonymous access only: no $SYS, event or packet logging plugins, logging at WARNING."""

    name = "amqtt"

    def __init__(self, venv: Path = DEFAULT_VENV) -> None:
        self.venv = venv

    @property
    def python(self) -> Path:
        """The interpreter of amqtt's own virtualenv."""
        return self.venv / "bin" / "python"

    def prepare(self) -> None:
        if self._installed_version():
            return
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(self.venv)],
            [str(self.python), "-m", "pip", "install", "--quiet", REQUIREMENT],
        ]
        for step in steps:
            try:
                done = subprocess.run(
                    step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BrokerUnavailable(f"installing amqtt failed: `{' '.join(step)}`: {exc}") from exc
            if done.returncode:
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise BrokerUnavailable(f"installing amqtt failed: `{' '.join(step)}`: {tail}")
        if not self._installed_version():
            raise BrokerUnavailable("amqtt was installed but cannot be imported")

    def command(self, port: int, workdir: Path) -> list[str]:
        config = workdir / "amqtt.yaml"
        config.write_text(
            "listeners:\n"
            "  default:\n"
            "    type: tcp\n"
            f"    bind: 127.0.0.1:{port}\n"
            "plugins:\n"
            "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: true\n"
        )
        # -I: the launcher's directory must not shadow the `amqtt` package with this module
        return [str(self.python), "-I", str(LAUNCHER), str(config)]

    @property
    def summary(self) -> str:
        return "no in-flight limit, TCP_NODELAY (asyncio default), in memory"

    def config_notes(self) -> str:
        return (
            "anonymous auth plugin only, log level WARNING, default asyncio loop (TCP_NODELAY on), no limit "
            "on QoS 1 messages in flight to a subscriber, own venv"
        )

    def version(self) -> str:
        return self._installed_version() or "not installed"

    def _installed_version(self) -> str | None:
        if not self.python.exists():
            return None
        try:
            done = subprocess.run(
                [str(self.python), "-c", "import importlib.metadata as m; print(m.version('amqtt'))"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
