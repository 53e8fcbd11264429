"""Which birth in force gives each alias of one edge node: its NBIRTH's, or one device's DBIRTH's.

Sparkplug 3.0 [tck-id-payloads-alias-uniqueness]: an alias given in an NBIRTH or a DBIRTH must be unique
across the edge node's entire set of metrics, its own and all its devices'. A DBIRTH giving an alias the
NBIRTH or another device's DBIRTH in force already gives breaks it: which metric the node means by that alias
is unknown, so a host takes no such birth. :class:`NodeAliases` answers, for each DBIRTH, whether one of its
aliases is taken, in time proportional to that birth's aliases (a gateway births hundreds of devices at
once), and is kept up to date as births come and go.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: A birth's aliases: each alias's metric name.
Aliases = Mapping[int, str]


@dataclass(frozen=True)
class TakenAlias:
    """An alias a DBIRTH gives that another birth in force gives too: whose (None: the node's) and what."""

    alias: int
    device_id: str | None
    name: str

    def describe(self, node: str) -> str:
        """Whose the alias is, as a quarantine detail says it (``node``: ``group/edge_node``)."""
        whose = node if self.device_id is None else f"{node}/{self.device_id}"
        return f"alias {self.alias} is {self.name!r}'s in the birth of {whose} too"


@dataclass
class NodeAliases:
    """Each alias of an edge node's births in force: the device whose birth gives it (None: the node's
    NBIRTH) and its metric's name."""

    owners: dict[int, tuple[str | None, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, node: Aliases | None, devices: Mapping[str, Aliases]) -> NodeAliases:
        """The aliases of a node's birth (None: no birth in force) and of its devices' births."""
        index = cls()
        for device_id, aliases in [(None, node or {}), *devices.items()]:
            index.owners.update((alias, (device_id, name)) for alias, name in aliases.items())
        return index

    def taken(self, device_id: str, aliases: Aliases) -> TakenAlias | None:
        """The first alias of ``device_id``'s new birth that the node's birth or another device's in force
        gives; None when each is its own (the device's birth before, which the new one replaces, takes
        none)."""
        for alias in aliases:
            owner = self.owners.get(alias)
            if owner is not None and owner[0] != device_id:
                return TakenAlias(alias, *owner)
        return None

    def put(self, device_id: str, aliases: Aliases, before: Aliases | None) -> None:
        """``device_id``'s birth of ``aliases`` in force, in place of the one of ``before`` (None: none)."""
        self.drop(device_id, before)
        self.owners.update((alias, (device_id, name)) for alias, name in aliases.items())

    def drop(self, device_id: str, aliases: Aliases | None) -> None:
        """``device_id``'s birth of ``aliases`` no longer in force (None: it had none)."""
        for alias in aliases or ():
            owner = self.owners.get(alias)
            if owner is not None and owner[0] == device_id:
                del self.owners[alias]
