"""The soak's reconnect churn: every device drops once per round, none twice, and one away waits its turn."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.soak_load import Rotation


@dataclass(eq=False)
class Device:
    name: int
    connected: bool = True


def test_every_device_drops_once_per_round_in_a_new_order_each_round():
    devices = [Device(n) for n in range(100)]
    rotation = Rotation(devices, random.Random(1))
    first = [device.name for _ in range(4) for device in rotation.next(25)]
    second = [device.name for _ in range(4) for device in rotation.next(25)]
    assert sorted(first) == sorted(second) == list(range(100))
    assert first != second


def test_a_device_away_at_its_turn_goes_at_the_next_call():
    devices = [Device(n) for n in range(10)]
    rotation = Rotation(devices, random.Random(2))
    upcoming = rotation.order = list(devices)  # the end of the list goes first
    away = upcoming[-1]
    away.connected = False
    assert away not in rotation.next(3)
    away.connected = True
    assert rotation.next(1) == [away]


def test_with_every_device_away_none_is_taken():
    devices = [Device(n, connected=False) for n in range(10)]
    assert Rotation(devices, random.Random(3)).next(5) == []
