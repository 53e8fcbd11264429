"""``timestone broker --workers N``: one broker made of N member processes on this host.

The members form a cluster (docs/cluster.md): the topic space in partitions led by one member each, a publish
received by any member appended on its partition's leader, sessions, subscriptions and retained messages
across members. Every member binds the configured MQTT listeners with ``SO_REUSEPORT``
(``listeners[].reuse_port``): clients reach one address and the kernel spreads their connections over the
members, so they see one broker using N cores.

Without a ``cluster:`` section the cluster's etcd is this command's own: Debian's ``etcd`` (package
etcd-server) on free loopback ports, its data beside the members' so that a restart finds the cluster as it
left it, started before the members (once it serves) and stopped after them; started again when it exits or
hangs (no answer for ``workers_etcd.ETCD_HUNG_S``: killed), and tried again while it cannot start (a full
disk), the members kept. Its members keep one copy of each log (replication factor 1): a log is on its
member's disk, a member's crash loses nothing acknowledged, and the member, started again, serves its
partitions again. With a ``cluster:`` section the members join that cluster (its etcd, its replication) as
``<node_id>-<n>``. Its parts: ``workers_config`` (the members' configurations), ``workers_etcd`` (the
command's etcd), ``workers_members`` (one member's process), ``workers_supervision`` (the loop).

Before it starts anything the command makes sure nobody else serves what it is about to: it locks the data
directory (``runtime.data_lock``: the same configuration started twice is refused, exit 2, before a second
etcd opens the first one's data or a file of the first is touched), then claims each shared listener's
address and probes that nobody listens there (``process.port_claim``: ``SO_REUSEPORT`` would otherwise let a
second command join the first's port silently; exit 1, as a single broker on a taken port). The members
inherit the lock and the claims, which therefore hold until the last member has stopped.

The command supervises its members. It imports the broker once and forks each member from itself; each
tells it over a pipe once it serves, or why it could not start. A member that exits before it ever served
with status 2 (configuration error) or 1 (cannot start) would fail the same way again: the command stops
the others and etcd, and exits with that status and the member's reason. Any other exit (a crash, SIGKILL,
or any exit of a member that had served) is recovered from: its registration in etcd is removed first, so
that the cluster does not wait out its lease, and it is forked again a moment later, its clients reaching
the others meanwhile; a member that keeps failing is started again after a wait that doubles, up to 30 s.
A member that serves says so every second; one silent for ``workers_members.HUNG_S`` (stopped,
deadlocked) is killed and started again the same way.
SIGHUP is passed on to every member, which re-reads its password, ACL and tokens files and its
certificates as ``timestone broker`` does (``systemctl reload``; a member still starting once it serves).
SIGTERM or SIGINT stops every member as ``timestone broker`` stops (clients told, logs flushed), then etcd;
the members and etcd get SIGTERM from the kernel if the command dies without stopping them.

Member ``n``'s data is ``<storage.directory>/workers/w<n>``, its configuration, made from the one given,
``<storage.directory>/workers/w<n>.yaml`` and its process id ``w<n>.pid`` while it runs (removed only by
the command that wrote it). The first member keeps the configured offsets API and admin ports; the others
take free ones (each logs its own, and the offsets API's ``/v1/cluster`` lists them all). Every log line of
a member names it (``node=w<n>``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from broker_edge.config import load_dataclass
from broker_edge.config.loader import ConfigError, sourced
from broker_edge.process.port_claim import claim_address, probe_unbound
from broker_edge.runtime import stop_signals
from broker_edge.runtime.config_file import ConfigFile
from broker_edge.runtime.data_lock import DataDirectoryLock
from broker_edge.runtime.workers_config import member_documents, write_yaml
from broker_edge.runtime.workers_etcd import LocalEtcd, StartStopped
from broker_edge.runtime.workers_members import Member, RunBroker, config_error_of
from broker_edge.runtime.workers_supervision import SIGNALS, run_members, stop_members
from broker_edge.settings.broker import (
    WORKERS_DIRECTORY,
    BrokerConfig,
    load_broker_config,
    load_broker_document,
)
from broker_edge.settings.cluster import MemberTlsConfig
from broker_edge.settings.named_files import check_directory

__all__ = ["check_workers", "run_workers", "supervise"]

log = logging.getLogger("broker_edge.workers")

PRELOAD = ("broker_edge.runtime.broker", "broker_edge.cluster.node", "uvloop")
"""What the command imports before it forks a member (none of it starts a thread at import)."""


def supervise(
    document: dict[str, Any],
    config: BrokerConfig,
    workers: int,
    run: RunBroker,
    config_path: str | None = None,
) -> int:
    """Run etcd (unless configured) and the members until SIGTERM or SIGINT, or until a member cannot
    start; the exit status. ``SIGNALS`` must be blocked (``run_workers``); ``config_path``: the file given,
    which a member's configuration error names (with its key's line), not the member's own file."""
    for module in PRELOAD:
        __import__(module)
    if stop_signals.requested():  # before they were blocked: stopped before anything started
        return 0
    # Nothing of another command's is read, written or started on before these hold: its data directory
    # (its etcd's data, its members' files) and its addresses stay its own.
    lock = DataDirectoryLock(config.storage.directory)
    try:
        lock.acquire()
    except ConfigError as error:
        raise _naming_running_members(error, Path(config.storage.directory) / WORKERS_DIRECTORY) from None
    claims: list[socket.socket] = []
    etcd: LocalEtcd | None = None
    fatal: tuple[Member, int, str] | None = None
    try:
        for index, listener in enumerate(config.listeners):
            endpoint = f"listeners[{index}] ({listener.name})"
            claim = claim_address(endpoint, listener.host, listener.port)
            if claim is not None:
                claims.append(claim)
            probe_unbound(endpoint, listener.host, listener.port)
        base = Path(config.storage.directory) / WORKERS_DIRECTORY
        base.mkdir(parents=True, exist_ok=True)
        etcd = LocalEtcd(base) if config.cluster is None else None
        etcd_url = etcd.start() if etcd is not None else None
        members = []
        for node, member_document in member_documents(document, config, workers, etcd_url):
            path = base / f"{node}.yaml"
            write_yaml(path, member_document)
            cluster = load_broker_config(path).cluster
            assert cluster is not None, "every member's configuration has a cluster: section"
            members.append(Member(node, path, cluster, run))
        source = ConfigFile(config_path) if config_path else None
        fatal = run_members(members, config, claims, etcd, source)
        stop_members(members)
    finally:
        if etcd is not None:
            etcd.stop()
        for claim in claims:
            claim.close()
        lock.release()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # one pending now must not end the command
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    if fatal is not None:
        member, code, reason = fatal
        if code == 2:
            refusal = config_error_of(reason)
            said = sourced(refusal, config_path) if refusal is not None else reason
            print(f"timestone broker: configuration error: member {member.node}: {said}", file=sys.stderr)
        else:
            log.error("cannot start: member %s: %s", member.node, reason)
        return code
    log.info("stopped")
    return 0


def _naming_running_members(error: ConfigError, base: Path) -> ConfigError:
    """``error`` (the data directory in use) with the members of an earlier command that still run: the
    lock names the command that took it, which may have died (SIGKILL) leaving a member that did not stop
    (hung, stopped) holding it."""
    running = []
    for path in sorted(base.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(path.read_text())
            os.kill(pid, 0)
            running.append(f"{path.stem} (pid {pid})")
    if not running:
        return error
    return ConfigError(
        error.path,
        f"{error.detail}; members of timestone broker --workers still run there: {', '.join(running)} "
        "(stop them: kill -KILL if SIGTERM does not)",
    )


def check_workers(document: dict[str, Any], config: BrokerConfig, workers: int) -> None:
    """``ConfigError`` for what ``workers`` members refuse in ``document`` (loaded as ``config``): a listener
    on port 0, the log off, an uplink hub, a ``storage.directory`` that cannot be made, fewer members than
    its logs are of, a member's configuration that would not load, a member's own certificate missing or
    naming another node (``--check`` too, and the command before it starts anything)."""
    members = member_documents(document, config, workers, "http://127.0.0.1:2379")
    check_directory("storage.directory", config.storage.directory)
    if config.cluster is None:
        _check_no_member_left_out(Path(config.storage.directory) / WORKERS_DIRECTORY, workers)
    for index, (node, member) in enumerate(members):
        try:
            loaded = load_dataclass(BrokerConfig, member)
        except ConfigError as error:
            raise ConfigError(error.path, f"member {node} of --workers: {error.detail}") from None
        if loaded.cluster is not None and loaded.cluster.tls is not None:
            _check_member_certificate(loaded.cluster.tls, node, index)


def _check_no_member_left_out(base: Path, workers: int) -> None:
    """``ConfigError`` when ``base`` holds the data of a member ``w<n>`` that ``workers`` members would not
    start: it keeps the one copy of the logs of the partitions it led, which would stay offline (their
    layout is kept in the command's etcd) and what it acknowledged unread."""
    numbers = [int(path.name[1:]) for path in base.glob("w*") if path.name[1:].isdigit() and path.is_dir()]
    left_out = sorted(n for n in numbers if n >= workers and any((base / f"w{n}").iterdir()))
    if left_out:
        most = left_out[-1] + 1
        raise ConfigError(
            "storage.directory",
            f"{base} holds the data of {', '.join(f'w{n}' for n in left_out)}, members of an earlier "
            f"--workers {most} that --workers {workers} would not start: the partitions they led would stay "
            f"offline, what they acknowledged unread; start with --workers {most} or more (fewer members "
            "need a storage.directory of their own)",
        )


def _check_member_certificate(own: MemberTlsConfig, node: str, index: int) -> None:
    """Member ``index`` (``node``)'s certificate and key, as its configuration names them (``own``), load
    and name it, as its start requires (``ConfigError``)."""
    from broker_edge.cluster.links.member_identity import MemberTls

    try:
        MemberTls(own, node)
    except ConfigError as error:
        raise ConfigError(
            error.path,
            f"member {node} of --workers: {error.detail} (each member has its own certificate, named as "
            f"cluster.tls.certfile and keyfile with -{index} before the suffix: timestone pki issue member "
            f"{node} --ca CA --out {own.certfile.removesuffix('.pem')})",
        ) from None


def run_workers(config_path: str | None, workers: int, run: RunBroker) -> int:
    """``timestone broker --workers N``: the exit status (2 for a configuration error); ``run`` runs each
    member (``main.run_broker``)."""
    from broker_edge.observe.logs import configure_logging

    # From here on these are taken by sigtimedwait, never by a handler: a SIGHUP (systemctl reload) during
    # the start is passed on to the members once they run, instead of ending the command.
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        # read once: it may be a pipe
        document, config = load_broker_document(config_path, own_member=False)
        check_workers(document, config, workers)
    except (ConfigError, OSError) as exc:
        error = sourced(exc, config_path) if isinstance(exc, ConfigError) else exc
        print(f"timestone broker: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(config.logging)
    try:
        return supervise(document, config, workers, run, config_path)
    except ConfigError as exc:
        print(f"timestone broker: configuration error: {sourced(exc, config_path)}", file=sys.stderr)
        return 2
    except StartStopped:
        log.info("stopped during start-up (etcd was starting)")
        return 0
    except (OSError, RuntimeError) as exc:
        log.error("cannot start: %s", exc)
        return 1
