"""``timestone cluster status``: members, partition leaders and epochs, in-sync sets and replica lag.

Reads the cluster's keys from etcd, then asks every member's offsets API for its log ends (``GET /v1/logs``)
and compares each replica's end with its leader's, per partition (the sum over the partition's topics):
a lag of 0 means the replica holds as much of the partition as its leader; "?" means the replica or the
leader did not answer (or is not a live member). ``--json`` prints the same as one JSON document.

A node the partitions name but that is not a live member (its etcd lease expired: stopped, crashed, cut off)
is listed as DOWN, and marked ``(DOWN)`` wherever a partition names it; every node gets a summary (partitions
it leads, holds, is in sync for). ``--config broker.yaml`` takes etcd's URLs, the prefix, etcd's TLS and user
from a broker's ``cluster:`` section. Output cut short by a closed pipe (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from broker_edge.cluster.coordination.etcd_values import BadValues, read_cluster
from broker_edge.config.loader import ConfigError, sourced
from broker_edge.placement import Member, PartitionState
from broker_edge.settings.cluster import EtcdAuthConfig, EtcdTlsConfig, etcd_endpoint

__all__ = ["ClusterStatus", "cluster_main", "read_status", "render"]


@dataclass
class ClusterStatus:
    """What ``timestone cluster status`` shows."""

    prefix: str
    partitions: int | None
    """The partition count stored at creation (None: no cluster under this prefix yet)."""
    controller: str | None
    members: dict[str, Member] = field(default_factory=dict)
    states: dict[int, PartitionState] = field(default_factory=dict)
    lags: dict[int, dict[str, int | None]] = field(default_factory=dict)
    """partition → replica → records behind the leader (None: unknown)."""

    @property
    def down(self) -> list[str]:
        """Nodes the partitions name (as leader, replica or in sync) that are not live members: their etcd
        lease expired (stopped, crashed, cut off)."""
        named = {node for s in self.states.values() for node in (s.leader, *s.replicas, *s.isr) if node}
        return sorted(named - set(self.members))

    def summary(self) -> dict[str, dict[str, int | bool]]:
        """Per node, live or down: partitions it leads, holds a replica of, and is in sync for."""
        nodes = sorted({*self.members, *self.down})
        counts: dict[str, dict[str, int | bool]] = {
            node: {"live": node in self.members, "leaders": 0, "replicas": 0, "in_sync": 0} for node in nodes
        }
        for state in self.states.values():
            if state.leader in counts:
                counts[state.leader]["leaders"] = int(counts[state.leader]["leaders"]) + 1
            for replica in state.replicas:
                counts[replica]["replicas"] = int(counts[replica]["replicas"]) + 1
            for replica in state.isr:
                counts[replica]["in_sync"] = int(counts[replica]["in_sync"]) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "partitions": self.partitions,
            "controller": self.controller,
            "members": [
                {"node_id": m.node_id, "mqtt": m.mqtt, "offsets_api": m.offsets_api}
                for m in sorted(self.members.values(), key=lambda m: m.node_id)
            ],
            "down": self.down,
            "summary": self.summary(),
            "states": [
                {
                    "partition": s.partition,
                    "leader": s.leader,
                    "epoch": s.epoch,
                    "replicas": list(s.replicas),
                    "isr": list(s.isr),
                    "lag": self.lags.get(s.partition, {}),
                }
                for _, s in sorted(self.states.items())
            ],
        }


async def read_status(
    urls: Sequence[str],
    prefix: str,
    token: str | None = None,
    timeout_s: float = 2.0,
    tls: EtcdTlsConfig | None = None,
    auth: EtcdAuthConfig | None = None,
) -> ClusterStatus:
    """The cluster's status (``EtcdError`` if etcd does not answer within ``timeout_s``); ``tls`` and
    ``auth`` reach an etcd with TLS and user auth on, ``token`` is a reader token of the members' offsets
    API (for their log ends)."""
    from broker_edge.cluster.coordination.controller import read_log_ends
    from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd

    keys = ClusterKeys(prefix)
    async with Etcd(urls, timeout_s, tls, auth, explain_tls=False) as etcd:
        kvs, _ = await etcd.get_prefix(keys.root)
    stored = read_cluster(kvs, keys, None, BadValues())
    status = ClusterStatus(prefix, stored.partitions, stored.controller, stored.members, stored.states)
    if status.partitions is None or not status.members:
        return status
    ends = await read_log_ends(status.members.values(), status.partitions, token, timeout_s)
    for partition, state in status.states.items():
        leader_ends = ends.get(state.leader) if state.leader is not None else None
        lags: dict[str, int | None] = {}
        for replica in state.replicas:
            replica_ends = ends.get(replica)
            if leader_ends is None or replica_ends is None:
                lags[replica] = None
            else:
                lags[replica] = max(0, leader_ends.get(partition, 0) - replica_ends.get(partition, 0))
        status.lags[partition] = lags
    return status


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _number(value: int | None) -> str:
    return "?" if value is None else str(value)


def render(status: ClusterStatus, etcd: str) -> str:
    """The readable form: a summary line, the members (live and down) with what each holds, then one line
    per partition, a down node marked wherever it is named, and a legend."""
    if status.partitions is None and not status.members:
        return f"no cluster under {status.prefix} on {etcd}"
    created = f"{status.partitions} partitions" if status.partitions is not None else "not created yet"
    down = set(status.down)
    lines = [
        f"cluster {status.prefix} on {etcd}: {len(status.members)} members live"
        + (f", {len(down)} DOWN ({', '.join(sorted(down))})" if down else "")
        + f", {created}, controller {status.controller or '-'}",
        "",
        "members:",
    ]
    summary = status.summary()
    members = [["node", "state", "mqtt", "offsets API", "leads", "replicas", "in sync"]]
    for node, counts in summary.items():
        member = status.members.get(node)
        members.append(
            [
                node,
                "live" if member is not None else "DOWN",
                member.mqtt if member is not None else "-",
                member.offsets_api if member is not None else "-",
                str(counts["leaders"]),
                str(counts["replicas"]),
                str(counts["in_sync"]),
            ]
        )
    lines += _table(members)

    def named(node: str) -> str:
        return f"{node}(DOWN)" if node in down else node

    if status.states:
        offline = sum(1 for s in status.states.values() if s.leader is None)
        lines += ["", f"partitions ({offline} offline):" if offline else "partitions:"]
        rows = [["partition", "leader", "epoch", "replicas", "in sync", "lag (records behind the leader)"]]
        for partition, state in sorted(status.states.items()):
            lags = status.lags.get(partition, {})
            lag = " ".join(
                f"{replica}:{'?' if lags.get(replica) is None else lags[replica]}"
                for replica in state.replicas
            )
            rows.append(
                [
                    str(partition),
                    named(state.leader) if state.leader else "OFFLINE",
                    str(state.epoch),
                    ",".join(named(r) for r in state.replicas),
                    ",".join(named(r) for r in state.isr) or "-",
                    lag,
                ]
            )
        lines += _table(rows)
        lines += [
            "",
            "DOWN: named by a partition but not a live member (its lease expired); OFFLINE: no leader; "
            "lag ?: the replica or its leader did not answer",
        ]
    return "\n".join(lines)


CLUSTER_EXIT_STATUS = (
    "exit status: 0 printed; 1 etcd did not answer, or holds no cluster under the prefix; 2 a wrong command "
    "line, or a file it names that cannot be read"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone cluster", description="Inspect a broker cluster.", epilog=CLUSTER_EXIT_STATUS
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status",
        help="members, partition leaders and epochs, in-sync sets, lag",
        epilog=CLUSTER_EXIT_STATUS,
    )
    status.add_argument(
        "--config",
        "-c",
        help="a broker's config: etcd URLs, key prefix, etcd TLS and user from its cluster section (without "
        "one: from its timestone broker --workers members')",
    )
    status.add_argument("--etcd", action="append", help="etcd client URL (repeatable)")
    status.add_argument("--prefix", default=None, help="the cluster's cluster.key_prefix (/timestone)")
    status.add_argument("--token", default=None, help="a reader token of the members' offsets API")
    status.add_argument("--etcd-cacert", help="CA of etcd's server certificates (https:// etcd)")
    status.add_argument("--etcd-cert", help="client certificate for etcd (--client-cert-auth)")
    status.add_argument("--etcd-key", help="key of --etcd-cert")
    status.add_argument("--etcd-user", help="etcd user (etcd with auth enabled)")
    status.add_argument("--etcd-password-file", help="file holding --etcd-user's password")
    status.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for etcd and each member")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def cluster_main(argv: list[str] | None = None) -> int:
    """``timestone cluster status --etcd URL [--prefix P] [--json]``; 0, or 1 when etcd does not answer or
    there is no cluster under the prefix, 2 for bad arguments."""
    args = _parser().parse_args(argv)
    try:
        urls, prefix, tls, auth = _etcd_settings(args)
    except (ValueError, TypeError, OSError) as exc:  # ConfigError is a ValueError
        error = sourced(exc, args.config) if isinstance(exc, ConfigError) else exc
        print(f"timestone cluster status: {error}", file=sys.stderr)
        return 2
    # gRPC's own log lines (a failed TLS handshake's "Corruption detected", ...) would stand beside the one
    # line this command prints: gRPC reads this when it loads, so etcd's client is imported only after
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from broker_edge.cluster.coordination.etcd import EtcdError

    try:
        status = asyncio.run(read_status(urls, prefix, args.token, args.timeout, tls, auth))
    except EtcdError as exc:
        print(f"timestone cluster status: {exc}{_tls_hint(tls)}{_workers_hint(args)}", file=sys.stderr)
        return 1
    text = json.dumps(status.to_dict(), indent=2) if args.json else render(status, ",".join(urls))
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `| head` closed the pipe: what it read is all that was wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0 if status.partitions is not None or status.members else 1


def _tls_hint(tls: EtcdTlsConfig | None) -> str:
    """What to check when etcd over TLS could not be reached (a handshake refused either way looks like a
    closed connection)."""
    if tls is None:
        return ""
    if tls.certfile is None:
        return " (over TLS: does etcd ask for a client certificate? give --etcd-cert and --etcd-key)"
    return " (over TLS: did --etcd-cacert sign etcd's certificate, and etcd's CA --etcd-cert?)"


def _workers_hint(args: argparse.Namespace) -> str:
    """Whose etcd did not answer, when ``--config`` named no cluster: that of ``timestone broker --workers``,
    which runs only while the command does (on a port free at its start)."""
    if not args.config or args.etcd:
        return ""
    from broker_edge.settings.broker import read_broker_settings

    if read_broker_settings(args.config).cluster is not None:
        return ""
    return (
        f" (the etcd of timestone broker --workers --config {args.config}, which runs only with it: "
        "is it running?)"
    )


def _etcd_settings(
    args: argparse.Namespace,
) -> tuple[list[str], str, EtcdTlsConfig | None, EtcdAuthConfig | None]:
    """etcd's URLs, the key prefix, TLS and user: from ``--config`` (a broker's), then the options, which
    win; a ``ValueError`` names what is wrong."""
    urls: list[str] = []
    prefix = "/timestone"
    tls: EtcdTlsConfig | None = None
    auth: EtcdAuthConfig | None = None
    if args.config:
        from broker_edge.settings.broker import read_broker_settings, workers_cluster

        config = read_broker_settings(args.config)  # its etcd's settings: the broker's own files may be away
        cluster = config.cluster or workers_cluster(config)  # timestone broker --workers: its own etcd
        if cluster is None:
            raise ValueError(
                f"--config {args.config}: no cluster section, nor members of timestone broker --workers "
                f"with it (none under {config.storage.directory}/workers)"
            )
        urls, prefix, tls, auth = list(cluster.etcd), cluster.key_prefix, cluster.etcd_tls, cluster.etcd_auth
    if args.etcd:
        urls = list(args.etcd)
    if not urls:
        raise ValueError("give --etcd URL (repeatable) or --config BROKER_YAML")
    for url in urls:
        try:
            etcd_endpoint(url)
        except ValueError as exc:
            raise ValueError(f"--etcd: {exc}") from None
    if args.prefix:
        prefix = args.prefix
    if (args.etcd_cert or args.etcd_key) and not args.etcd_cacert:
        raise ValueError(
            "--etcd-cert and --etcd-key go with --etcd-cacert (the CA that signed etcd's certificate)"
        )
    if args.etcd_cacert:
        tls = EtcdTlsConfig(args.etcd_cacert, args.etcd_cert, args.etcd_key)
    plain = [url for url in urls if url.startswith("https://")] if tls is None else []
    if plain:
        raise ValueError(
            f"--etcd {plain[0]}: an https:// etcd needs --etcd-cacert (the CA that signed its certificate), "
            "and --etcd-cert/--etcd-key when it asks for client certificates"
        )
    if args.etcd_user:
        auth = EtcdAuthConfig(args.etcd_user, args.etcd_password_file)
    return urls, prefix, tls, auth
