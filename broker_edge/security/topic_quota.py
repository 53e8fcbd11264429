"""The share of topic logs one identity may create, so that a few clients cannot fill ``storage.max_topics``.

Client ids cost nothing, so ``limits.max_topics_per_client`` alone does not stop one user (or one host)
with many client ids. ``TopicShares`` also counts the logs each identity created: its user name when it
logged in (or its certificate's CN), else its address; anonymous clients on loopback are local processes
(the pipelines, simulators) and are counted by client id only. ``limits.exempt_users`` (the accounts of the
pipelines that legitimately publish to many topics) are bound by neither quota: the handler checks them first.
"""

from __future__ import annotations

from broker_edge.security.auth import is_loopback_host

__all__ = ["TopicShares", "identity_of"]


def identity_of(username: str | None, address: str) -> str | None:
    """Whom the logs of a client count for: ``user:<name>``, ``address:<ip>``, or None (local anonymous)."""
    if username is not None:
        return f"user:{username}"
    if not address or is_loopback_host(address):
        return None
    return f"address:{address}"


class TopicShares:
    """Logs created per identity since the broker started, each at most ``per_identity`` (0: unbounded)."""

    def __init__(self, per_identity: int) -> None:
        self.per_identity = per_identity
        self._created: dict[str, set[str]] = {}

    def take(self, identity: str | None, topic: str) -> bool:
        """Whether ``identity`` may create the log of ``topic`` (counted from now on if so)."""
        if identity is None or not self.per_identity:
            return True
        created = self._created.setdefault(identity, set())
        if topic in created:
            return True
        if len(created) >= self.per_identity:
            return False
        created.add(topic)
        return True
