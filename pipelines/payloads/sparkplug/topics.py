"""The Sparkplug B topic namespace: ``spBv1.0/<group_id>/<message_type>/<edge_node_id>[/<device_id>]``.

The host application's own ``spBv1.0/STATE/<host_id>`` is the one topic of the namespace of another form.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "spBv1.0"
#: Every message an edge node or a host sends about an edge node (level) or a device (level).
NODE_MESSAGES = ("NBIRTH", "NDEATH", "NDATA", "NCMD")
DEVICE_MESSAGES = ("DBIRTH", "DDEATH", "DDATA", "DCMD")
TOPIC_FILTER = f"{NAMESPACE}/#"


@dataclass(frozen=True)
class SparkplugTopic:
    group_id: str
    message_type: str
    edge_node_id: str
    device_id: str | None = None

    @property
    def name(self) -> str:
        levels = [NAMESPACE, self.group_id, self.message_type, self.edge_node_id]
        return "/".join(levels if self.device_id is None else [*levels, self.device_id])


def parse_topic(topic: str) -> SparkplugTopic:
    """The parts of an edge node's or a device's topic; ``ValueError`` saying why for any other topic."""
    levels = topic.split("/")
    if levels[0] != NAMESPACE:
        raise ValueError(f"topic {topic!r} is not in the {NAMESPACE} namespace")
    if len(levels) == 3 and levels[1] == "STATE":
        raise ValueError(f"topic {topic!r} is a host application's STATE")
    if len(levels) not in (4, 5):
        raise ValueError(f"topic {topic!r} has {len(levels)} levels; Sparkplug B's have 4 or 5")
    if "" in levels:
        raise ValueError(f"topic {topic!r} has an empty level")
    message_type = levels[2]
    expected = NODE_MESSAGES if len(levels) == 4 else DEVICE_MESSAGES
    if message_type not in expected:
        kind = "an edge node's" if len(levels) == 4 else "a device's"
        known = ", ".join(expected)
        raise ValueError(f"topic {topic!r}: {message_type!r} is not {kind} message type ({known})")
    return SparkplugTopic(levels[1], message_type, levels[3], levels[4] if len(levels) == 5 else None)


def state_topic(host_id: str) -> str:
    """Where the host application ``host_id`` publishes its STATE (its birth, and its will)."""
    return f"{NAMESPACE}/STATE/{host_id}"
