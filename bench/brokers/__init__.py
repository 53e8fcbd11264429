"""The brokers the benchmark can run, by the names used on the command line."""

from __future__ import annotations

from collections.abc import Callable

from bench.brokers.aedes import Aedes
from bench.brokers.amqtt import Amqtt
from bench.brokers.base import BrokerUnavailable, BrokerUnderTest, RunningBroker
from bench.brokers.floor import Floor
from bench.brokers.mosquitto import Mosquitto
from bench.brokers.timestone import Timestone

BROKER_NAMES = ("timestone", "mosquitto", "aedes", "amqtt")
VARIANT_NAMES = ("timestone-asyncio", "timestone-native", "floor")
"""Brokers run only when named: Timestone with its listener's ``transport`` set, and the uvloop floor."""

__all__ = [
    "BROKER_NAMES",
    "VARIANT_NAMES",
    "Aedes",
    "Amqtt",
    "BrokerUnavailable",
    "BrokerUnderTest",
    "Floor",
    "Mosquitto",
    "RunningBroker",
    "Timestone",
    "default_broker",
]


def default_broker(name: str) -> BrokerUnderTest:
    """The broker of that name in the configuration used by every scenario but the persisted one."""
    factories: dict[str, Callable[[], BrokerUnderTest]] = {
        "timestone": Timestone,
        "timestone-asyncio": lambda: Timestone(transport="asyncio"),
        "timestone-native": lambda: Timestone(transport="native"),
        "mosquitto": Mosquitto,
        "aedes": Aedes,
        "amqtt": Amqtt,
        "floor": Floor,
    }
    try:
        return factories[name]()
    except KeyError:
        raise ValueError(f"unknown broker {name!r}; choose from {', '.join(BROKER_NAMES)}") from None
