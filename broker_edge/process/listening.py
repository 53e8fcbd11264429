"""Which TCP ports a process listens on, read from Linux's ``/proc``.

A port that accepts connections may be another process's: a launcher that chose a free port for its child
and then sees the port answer cannot tell from that alone whether its child bound it or another process
took it in between (the child then fails to bind, maybe only after it did other work). The child's own
listening sockets tell.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["listening_ports"]

#: the state column of a listening socket in ``/proc/net/tcp`` (``TCP_LISTEN``)
_LISTEN = "0A"


def listening_ports(pid: int) -> set[int] | None:
    """The TCP ports process ``pid`` holds listening sockets on; None where ``/proc`` cannot tell (not
    Linux, or the process's descriptors may not be read)."""
    try:
        inodes = _socket_inodes(pid)
        listeners = _listening_sockets(pid)
    except OSError:
        return None
    return {port for inode, port in listeners.items() if inode in inodes}


def _socket_inodes(pid: int) -> set[str]:
    """The inode numbers of the sockets among ``pid``'s open descriptors."""
    directory = f"/proc/{pid}/fd"
    inodes = set()
    for name in os.listdir(directory):
        try:
            target = os.readlink(f"{directory}/{name}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _listening_sockets(pid: int) -> dict[str, int]:
    """inode → local port of every listening TCP socket (IPv4 and IPv6) in ``pid``'s network namespace."""
    listeners: dict[str, int] = {}
    for table in (Path(f"/proc/{pid}/net/tcp"), Path(f"/proc/{pid}/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                listeners[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return listeners
