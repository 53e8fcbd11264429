"""The members' configurations of ``timestone broker --workers N``: each one made from the YAML given,
with the shared listeners (``SO_REUSEPORT``), a listener of its own, its data directory and its ``cluster:``
section (the command's own etcd, or the one configured, with each member's own certificate where members
prove who they are: ``member_certificate``)."""

from __future__ import annotations

import contextlib
import copy
import os
import socket
from pathlib import Path
from typing import Any

from broker_edge.config.loader import ConfigError, EnvironmentValue
from broker_edge.settings.bound_ports import WILDCARD_HOSTS
from broker_edge.settings.broker import WORKERS_DIRECTORY, BrokerConfig

__all__ = ["host_name", "member_certificate", "member_documents", "node_id", "write_yaml"]


def node_id(config: BrokerConfig, index: int) -> str:
    """The node id of member ``index``: ``w<index>``, or ``<node_id>-<index>`` in a configured cluster."""
    cluster = config.cluster
    return f"{cluster.node_id}-{index}" if cluster is not None else f"w{index}"


def member_certificate(path: str, index: int) -> str:
    """Member ``index``'s file of ``cluster.tls.certfile`` or ``keyfile`` ``path``: its name with ``-<index>``
    before its suffix (``member-edge.pem``: ``member-edge-0.pem``), as ``timestone pki issue member edge-0``
    names the files of node ``edge-0`` in a directory. A certificate names one node, so each member has its
    own."""
    file = Path(path)
    return str(file.with_name(f"{file.stem}-{index}{file.suffix}"))


def member_documents(
    document: dict[str, Any], config: BrokerConfig, workers: int, etcd_url: str | None
) -> list[tuple[str, dict[str, Any]]]:
    """(node id, configuration) of each member, made from ``document`` (the YAML given, already loaded as
    ``config``); ``etcd_url``: the command's own etcd (None when ``config`` names a cluster)."""
    for index, listener in enumerate(config.listeners):
        if listener.port == 0:
            raise ConfigError(
                f"listeners[{index}].port", "--workers needs a fixed port (0 would give each member its own)"
            )
    if not config.storage.enabled:
        raise ConfigError("storage.enabled", "--workers runs a cluster, whose members keep their logs")
    if not config.offsets_api.enabled:
        raise ConfigError("offsets_api.enabled", "--workers runs a cluster, whose members read each other")
    if config.uplink_hub is not None:
        raise ConfigError(
            "uplink_hub", "a hub's endpoint is served by one broker process: not with --workers"
        )
    if config.offsets_api.host in WILDCARD_HOSTS:
        raise ConfigError(
            "offsets_api.host",
            "--workers: each member's offsets API is advertised to readers (the Spark source, /v1/cluster) "
            "at the address it binds, on a port of its own: give an address of this host (its network's, "
            "or 127.0.0.1), not every interface",
        )
    nodes = {node_id(config, index) for index in range(workers)}
    for index, listener in enumerate(config.listeners):
        if listener.name in nodes:
            raise ConfigError(
                f"listeners[{index}].name",
                f"--workers names each member's own listener after the member: {listener.name!r} is one",
            )
    base = Path(config.storage.directory) / WORKERS_DIRECTORY
    members = []
    for index in range(workers):
        node = node_id(config, index)
        member = copy.deepcopy(document)
        listeners = member.get("listeners") or [{}]
        shared = [{**listener, "reuse_port": True} for listener in listeners]
        own = _own_listener(listeners[0], config.listeners[0].host, node)
        member["listeners"] = [own, *shared] if own is not None else shared
        member["storage"] = {**member.get("storage", {}), "directory": str(base / node)}
        if index:  # the first member keeps the configured side ports, the others take free ones
            for side in ("offsets_api", "admin_http"):
                member[side] = {**(member.get(side) or {}), "port": 0}
        cluster = member["cluster"] = _cluster_section(member.get("cluster"), node, etcd_url, own is not None)
        if config.cluster is not None and config.cluster.tls is not None:
            cluster["tls"] = {
                **cluster["tls"],
                "certfile": member_certificate(config.cluster.tls.certfile, index),
                "keyfile": member_certificate(config.cluster.tls.keyfile, index),
            }
        if own is None and "mqtt" not in cluster.setdefault("advertise", {}):
            # every interface: the devices' way to the shared listener is this host's name, as best known
            cluster["advertise"]["mqtt"] = f"{host_name()}:{config.listeners[0].port}"
        members.append((node, member))
    return members


def host_name() -> str:
    """This host's name as devices may know it: its fully qualified name, or its name where that is a
    loopback name (the host's name mapped to 127.0.0.1 beside ``localhost``, as in many containers)."""
    fqdn = socket.getfqdn()
    if fqdn.split(".")[0] == "localhost":
        return socket.gethostname()
    return fqdn


def _own_listener(first: dict[str, Any], host: str, node: str) -> dict[str, Any] | None:
    """A listener of this member alone, like the first one on a free port: the address the cluster
    advertises for it (where a configured ``cluster.redirect_publishers`` sends devices, and a fenced member
    sends its clients). None when the first listener binds every interface: then no address of the host is
    known to be the devices' way to it."""
    if host in WILDCARD_HOSTS:
        return None
    return {**first, "name": node, "port": 0, "reuse_port": False}


def _cluster_section(
    configured: dict[str, Any] | None, node: str, etcd_url: str | None, own_address: bool
) -> dict[str, Any]:
    if configured is None:
        assert etcd_url is not None, "a cluster without a configured one runs on the command's etcd"
        return {
            "node_id": node,
            "etcd": [etcd_url],
            "listen": {"host": "127.0.0.1", "port": 0},
            "replication_factor": 1,
            "min_insync_replicas": 1,
        }
    section = copy.deepcopy(configured)
    section["node_id"] = node
    section["listen"] = {**(section.get("listen") or {}), "port": 0}
    advertise = {**(section.get("advertise") or {})}
    for own in ("offsets_api", "peer", *(("mqtt",) if own_address else ())):  # each member's own, bound
        advertise.pop(own, None)
    section["advertise"] = advertise
    return section


def write_yaml(path: Path, document: dict[str, Any]) -> None:
    """Write a member's configuration ``document`` to ``path`` whole (a temporary file renamed), readable by
    this user alone (0600: it holds the file given's secrets written inline); a value written ``!env NAME``
    in the file given stays so (the member reads the variable, and a secret kept out of files stays out of
    this one)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        """YAML's safe dumper, plus ``!env NAME``."""

    Dumper.add_representer(
        EnvironmentValue, lambda dumper, value: dumper.represent_scalar("!env", value.name)
    )
    text = "# Made by timestone broker --workers from its configuration: changes here are overwritten.\n"
    temporary = path.with_suffix(".yaml.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()  # one a killed command left: opened anew with this mode
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text + yaml.dump(document, Dumper=Dumper, sort_keys=False))
    os.replace(temporary, path)
