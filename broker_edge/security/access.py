"""What one request to the offsets API may do: decided once, by the endpoint's authenticator, before any
handler runs, and asked by the handlers before they list or read a topic.

Two kinds of callers read a broker's logs over HTTP. Readers (the Spark source, the OTA jobs, notebooks,
tools) present a bearer token, which may be limited to topic filters
(``broker_edge.security.reader_tokens``); an API without tokens (loopback only) lets everyone read
everything. Members of a cluster come in on their own endpoint, known by their certificate
(``broker_edge.cluster.links.member_api``), and read everything: they hold copies of the logs anyway.
Nothing else is decided here: member-only endpoints exist only on the members' endpoint, so no reader
access can reach them.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_edge.protocol.topics import topic_matches

__all__ = ["EVERYONE", "Access", "member_access"]


@dataclass(frozen=True, slots=True)
class Access:
    """Who a request is (for logs) and which topics it may list and read."""

    name: str
    """A reader token's name, ``member <node>``, or ``anyone``; never a secret."""
    topics: tuple[str, ...] | None
    """Topic filters it may read; None: every topic."""
    member: str | None = None
    """The node id a member proved (members' endpoint only)."""

    def may_read(self, topic: str) -> bool:
        topics = self.topics
        return topics is None or any(topic_matches(topic_filter, topic) for topic_filter in topics)


EVERYONE = Access("anyone", None)
"""The access of every request to an API that asks for no token (it listens on loopback only)."""


def member_access(node_id: str) -> Access:
    """The access of a member that proved it is ``node_id``."""
    return Access(f"member {node_id}", None, node_id)
