"""Attributes most instances never set, kept in a side object that only the first write creates.

A broker holds one ``Connection`` and one ``Session`` per client, so every slot of theirs is paid ten
thousand times over; a will, a refusal or a delayed will is set on few of them. Such an attribute is a
``RareField`` of its class: reading it gives the default while the instance has no side object, writing the
default creates none, and any other write creates the side object (``RareSlots``) that holds them all from
then on. The owner has one slot, ``_rare``, instead of one per attribute; call sites are unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar, overload

__all__ = ["RareField", "RareSlots"]

T = TypeVar("T")


class RareSlots:
    """The side object: a subclass lists its attributes in ``__slots__`` and has its own ``defaults``."""

    __slots__ = ()
    defaults: ClassVar[dict[str, Any]]
    """Attribute → default, filled by each ``RareField`` of the owner class as it is defined."""

    def __init__(self) -> None:
        for name, value in self.defaults.items():
            setattr(self, name, value)


class RareField(Generic[T]):
    """One attribute of an owner whose instances have a ``_rare`` slot (None until the first write)."""

    __slots__ = ("default", "name", "side")

    def __init__(self, side: type[RareSlots], default: T) -> None:
        self.side = side
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        if name not in self.side.__slots__:
            raise TypeError(f"{self.side.__name__} has no slot for {owner.__name__}.{name}")
        self.name = name
        self.side.defaults[name] = self.default

    @overload
    def __get__(self, instance: None, owner: type) -> RareField[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: Any, owner: type) -> T | RareField[T]:
        if instance is None:
            return self
        rare = instance._rare
        if rare is None:
            return self.default
        value: T = getattr(rare, self.name)
        return value

    def __set__(self, instance: Any, value: T) -> None:
        rare = instance._rare
        if rare is None:
            if value is self.default:
                return
            rare = instance._rare = self.side()
        setattr(rare, self.name, value)
