"""A key one member at a time holds: created only while absent, bound to the member's lease.

The controller's election and the site's link holder (``link_holder``) both campaign this way. etcd
deletes the key when the holder's lease ends (it died, or was fenced long enough), and the others take it
then. A member that still holds the key under its current lease (fenced for a moment without losing it)
holds it still.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_edge.cluster.coordination.etcd import Etcd, KeyValue

__all__ = ["Claim", "claim_key"]


@dataclass(frozen=True, slots=True)
class Claim:
    """What one campaign found."""

    revision: int | None
    """The key's mod_revision when this member holds it (None: it does not)."""
    holder: KeyValue | None
    """The key as another holds it (None: held here, or gone meanwhile: campaign again at once)."""


async def claim_key(etcd: Etcd, key: str, value: bytes, lease: int) -> Claim:
    """Create ``key`` with ``value`` under ``lease`` if it is absent; held here also when it already carries
    ``value`` under ``lease``."""
    revision = await etcd.create(key, value, lease)
    if revision is not None:
        return Claim(revision, None)
    current = await etcd.get(key)
    if current is None:
        return Claim(None, None)
    if current.lease == lease and current.value == value:
        return Claim(current.mod_revision, None)
    return Claim(None, current)
