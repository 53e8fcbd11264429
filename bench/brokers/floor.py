"""The uvloop floor: `floor_relay.py`, the least any Python broker on uvloop pays for the same sockets and
frames, run as a broker under test so that it is read side by side with Timestone and its peers."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from bench.brokers.base import BrokerUnderTest

RELAY = Path(__file__).resolve().parent / "floor_relay.py"
ABOUT = (
    "The uvloop floor is no broker: a relay in Python on uvloop (bench/brokers/floor_relay.py) that frames "
    "each packet, appends the turn's PUBLISH frames to a file with one write (no fsync), PUBACKs them and "
    "forwards each to the subscribers with a packet id of their own (64 in flight, as for the brokers), and "
    "checks, matches, stores and counts nothing: what any Python broker on uvloop pays for the same sockets "
    "and frames. It takes part in no target."
)
"""What the floor is, for the results of the benches that run it."""


class Floor(BrokerUnderTest):
    """A relay that frames, logs a turn's PUBLISH frames with one write, acknowledges and forwards them."""

    name = "floor"

    @property
    def label(self) -> str:
        return "uvloop floor (relay)"

    @property
    def summary(self) -> str:
        return "in flight 64, TCP_NODELAY, a write per turn before the PUBACKs, no fsync"

    @property
    def persists(self) -> bool:
        return True

    def command(self, port: int, workdir: Path) -> list[str]:
        log = workdir / "data" / "publishes.log"
        return [sys.executable, str(RELAY), "--port", str(port), "--log", str(log)]

    def config_notes(self) -> str:
        return (
            "bench/brokers/floor_relay.py, the project's interpreter: every PUBLISH forwarded to every "
            "subscriber (no topic matched; at QoS 1 a packet id of the subscriber's own, 64 in flight), the "
            "turn's frames appended to one file with one write (no fsync) before the PUBACKs, each "
            "connection written once per loop turn; nothing validated, stored or counted"
        )

    def version(self) -> str:
        return f"Python {sys.version.split()[0]}, uvloop {metadata.version('uvloop')}"
