"""The share of topic logs one identity may create, so that a few clients cannot fill ``storage.max_topics``.

Client ids cost nothing, so ``limits.max_topics_per_client`` alone does not stop one user (or one host)
with many client ids. ``TopicShares`` also counts the logs each identity created: its user name when it
logged in (or its certificate's CN), else its address; anonymous clients on loopback are local processes
(the pipelines, simulators) and are counted by client id only. ``limits.topic_quota_exempt_users`` are not
bounded by either share: the accounts of the pipelines that legitimately publish to many topics.
"""

from __future__ import annotations

from broker_edge.auth import is_loopback_host

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

    def __init__(self, per_identity: int, exempt_users: list[str]) -> None:
        self.per_identity = per_identity
        self.exempt = {f"user:{name}" for name in exempt_users}
        self._created: dict[str, set[str]] = {}

    def take(self, identity: str | None, topic: str) -> bool:
        """Whether ``identity`` may create the log of ``topic`` (counted from now on if so)."""
        if identity is None or not self.per_identity or identity in self.exempt:
            return True
        created = self._created.setdefault(identity, set())
        if topic in created:
            return True
        if len(created) >= self.per_identity:
            return False
        created.add(topic)
        return True

    def exempt_user(self, username: str | None) -> bool:
        return username is not None and f"user:{username}" in self.exempt
