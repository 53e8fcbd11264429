"""``run_broker``: the process around a ``Broker`` (the ``timestone broker --config FILE`` command).

glibc's heaps bounded (``heap_trim.bound_arenas``) before any thread starts, the event loop the ``runtime``
section names (uvloop by default), logging from the config, SIGINT / SIGTERM for a graceful stop (clients
told, the commitlog flushed), SIGHUP to re-read the password file, the ACL file, the readers' tokens file and
the certificates (the TLS listeners', the offsets API's, the uplink hub's, a cluster member's and its CAs,
etcd's client certificate), not the configuration file itself (a WARNING says so when it changed). Exit
status: 0 after a clean stop, 2 for a configuration error (the message names the key), 1 if the broker
cannot start (e.g. the port is taken, a damaged file in the data directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_edge.config.loader import ConfigError, sourced
from broker_edge.observe.logs import configure_logging
from broker_edge.process.gc_tuning import tune_garbage_collector
from broker_edge.process.heap_trim import bound_arenas
from broker_edge.runtime import stop_signals
from broker_edge.runtime.config_file import ConfigFile, warn_if_changed
from broker_edge.runtime.revoked_peers import close_revoked
from broker_edge.runtime.untrusted_peers import close_untrusted
from broker_edge.security.auth import PasswordFile, PasswordFileError
from broker_edge.security.tls import files_not_valid_now
from broker_edge.settings.broker import BrokerConfig, load_broker_config, load_broker_document
from broker_edge.settings.named_files import check_directory
from broker_edge.storage.errors import StoreDamaged

if TYPE_CHECKING:
    from broker_edge.engine.connection.terms import ListenerRuntime
    from broker_edge.runtime.broker import Broker

__all__ = ["check_config", "reload_files", "run_broker", "serve"]

log = logging.getLogger("broker_edge.main")

#: ``--workers`` at most this many per CPU: a member keeps a core busy, more only share the cores (and a
#: mistyped count would fork hundreds of brokers).
MEMBERS_PER_CPU = 2


async def serve(
    config: BrokerConfig, ready: asyncio.Event | None = None, source: ConfigFile | None = None
) -> None:
    """Run a broker with ``config`` until SIGINT or SIGTERM; one during the start stops it there (what was
    opened is closed again). ``source``: the file ``config`` was read from, which a SIGHUP does not read
    again (it says so when the file has changed)."""
    from broker_edge.runtime.broker import Broker

    loop = asyncio.get_running_loop()
    loop.set_exception_handler(quiet_closed_transports)
    stop = asyncio.Event()
    try:
        broker = Broker(config)
    except PasswordFileError as error:  # read after check_files_of: malformed, or changed meanwhile
        raise ConfigError("auth.password_file", str(error)) from None
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if stop_signals.requested():  # before the loop had the signals
        stop.set()
    try:
        if not await _start_unless_stopped(broker, stop):
            log.info("stopped during start-up")
            return
        # a SIGHUP from here on is acted on once these lines are said: before "broker started" is said, so
        # that one sent after it never counts as during the start
        stop_signals.take_hangups(lambda: loop.call_soon_threadsafe(_on_sighup, broker, source))
        tune_garbage_collector(config.runtime)
        for line in startup_report(broker):
            log.info("%s", line)
        log.info("broker started: %s", ", ".join(f"{name}={port}" for name, port in broker.ports.items()))
        if stop_signals.hangup_requested():  # came during the start: its files may have changed since read
            log.info("SIGHUP during the start: acted on now")
            _on_sighup(broker, source)
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            log.info("stopping")
            await broker.stop()
    finally:
        stop_signals.ignore_hangups()  # a reload now has nothing to read again, and must not end it
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        stop_signals.catch_early_stops()  # noted, not a KeyboardInterrupt, until the process has exited
    log.info("broker stopped")


def quiet_closed_transports(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's handler of errors nothing awaited. Two of uvloop's, about a connection that had gone, are
    said at DEBUG, not as an ERROR with a traceback, since nothing is lost: its TLS layer writing to a
    connection that had just closed under it (a peer that went away mid-handshake or mid-close), and the
    handshake's own future left holding the connection's error (a member's dial to a peer killed
    mid-handshake, the dial cancelled meanwhile: its caller had its own error or its cancellation). Anything
    else goes to asyncio's own handler."""
    error = context.get("exception")
    message = context.get("message")
    if (
        message == "Fatal error on SSL protocol"
        and isinstance(error, RuntimeError)
        and "the handler is closed" in str(error)
    ):
        log.debug("TLS write on a connection already closed: %s", error)
        return
    unretrieved = message == "Future exception was never retrieved"
    if unretrieved and _tls_handshake_reset(error, context.get("future")):
        log.debug("TLS handshake of a dial no longer awaited ended with its connection: %r", error)
        return
    loop.default_exception_handler(context)


def _tls_handshake_reset(error: object, future: object) -> bool:
    """``error`` is a connection's end raised by uvloop's TLS protocol, held by a plain future (a handshake's
    waiter, not a task of ours)."""
    if not isinstance(error, ConnectionError) or isinstance(future, asyncio.Task):
        return False
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.endswith("uvloop/sslproto.pyx")


async def _start_unless_stopped(broker: Broker, stop: asyncio.Event) -> bool:
    """Start ``broker`` unless ``stop`` is set first (True: started). A stop during the start cancels it,
    and ``Broker.start`` closes what it had opened (listeners, the store and its lock, the cluster node)."""
    if stop.is_set():
        return False
    starting = asyncio.ensure_future(broker.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        stopping.cancel()
        starting.result()  # a start that failed raises here
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


def startup_report(broker: Broker) -> list[str]:
    """The endpoints besides the MQTT listeners (each logged as it binds) and the security files in force:
    what an operator of several brokers on one host checks first."""
    config = broker.config
    lines = []
    if broker.offsets_port is not None:
        api = config.offsets_api
        scheme = "https" if api.tls is not None else "http"
        readers = "readers' tokens required" if api.authenticates else "no token (loopback only)"
        lines.append(f"offsets API on {scheme}://{api.host}:{broker.offsets_port} ({readers})")
    if broker.admin_port is not None:
        lines.append(f"admin HTTP (/metrics, /health) on http://{config.admin_http.host}:{broker.admin_port}")
    node = broker.cluster_node
    if node is not None and config.cluster is not None:
        lines.append(f"members' endpoint on port {node.members_port} (node {config.cluster.node_id})")
    if broker.uplink_hub is not None and config.uplink_hub is not None:
        hub = config.uplink_hub
        address = f"wss://{hub.host}:{broker.uplink_hub.port}{hub.path}"
        lines.append(f"uplink hub for sites on {address} (sites' CA {hub.tls.cafile})")
    if config.uplink is not None:
        lines.append(f"uplink of site {config.uplink.site_id} to {', '.join(config.uplink.hubs)}")
    passwords = config.auth.password_file
    users = f"{passwords} ({len(broker.passwords)} users)" if passwords and broker.passwords else "none"
    acl = broker.acl
    decision = "allow" if acl is not None and acl.default_allow else "deny"
    rules = f"{len(acl.rules)} rules, default {decision}" if acl is not None else "none (all allowed)"
    acl_file = f", file {config.acl.file}" if config.acl.file else ""
    lines.append(f"security: password file {users}; ACL {rules}{acl_file}")
    for listener in config.listeners:
        if listener.tls is not None:
            tls = listener.tls
            clients = "client certificates required" if tls.require_client_cert else "no client certificate"
            lines.append(f"TLS on {listener.name}: {tls.certfile}, key {tls.keyfile} ({clients})")
    if config.storage.enabled:
        lines.append(f"data directory {Path(config.storage.directory).resolve()} (locked by this broker)")
    return lines


def _on_sighup(broker: Broker, source: ConfigFile | None) -> None:
    """SIGHUP: :func:`reload_files`, and :func:`warn_if_changed`."""
    reload_files(broker)
    warn_if_changed(source)


def _has_files_to_reload(broker: Broker) -> bool:
    return (
        broker.passwords is not None
        or (broker.acl is not None and bool(broker.config.acl.file))
        or (broker.reader_tokens is not None and bool(broker.reader_tokens.file))
        or any(listener.tls_contexts is not None for listener in broker.listeners)
        or broker.offsets_tls is not None
        or broker.uplink_hub is not None
        or broker.site_link is not None
        or broker.cluster_node is not None
    )


def reload_files(broker: Broker) -> None:
    """SIGHUP: re-read the password file, the ACL file, the readers' tokens and the certificates; a file
    that does not load keeps the old one in force (logged at ERROR, naming it). With none of them, it says
    so, and that the configuration file's settings apply at the next start."""
    if not _has_files_to_reload(broker):
        log.info(
            "SIGHUP: nothing to read again (no password, ACL or tokens file, no certificate); the "
            "configuration file's settings apply at the next start"
        )
        return
    if broker.passwords is not None:
        try:
            broker.passwords.reload()
        except Exception as exc:  # keep the users in force; say why
            log.error("password file not reloaded, the previous users stay in force: %s", exc)
    acl_config = broker.config.acl
    if broker.acl is not None and acl_config.file:
        try:
            count = broker.acl.reload(acl_config)
        except Exception as exc:  # keep the rules in force; say why (the message names file and line)
            log.error("ACL file %s not reloaded, the previous rules stay in force: %s", acl_config.file, exc)
        else:
            log.info("ACL file %s reloaded: %d rules", acl_config.file, count)
    tokens = broker.reader_tokens
    if tokens is not None and tokens.file:
        try:
            count = tokens.reload()
        except Exception as exc:  # keep the tokens in force
            log.error("readers' tokens not reloaded, the previous ones stay in force: %s", exc)
        else:
            log.info("readers' tokens reloaded from %s: %d in force", tokens.file, count)
    for listener in broker.listeners:
        if listener.tls_contexts is None:
            continue
        if _reloaded(
            listener.tls_contexts.reload,
            f"listener {listener.name}: certificate not reloaded, the previous one stays in force",
            f"listener {listener.name}: certificate and CAs reloaded",
        ):
            _close_revoked(broker, listener)
            _close_untrusted(broker, listener)
    if broker.offsets_tls is not None:
        _reloaded(
            broker.offsets_tls.reload,
            "offsets API certificate not reloaded, the previous one stays in force",
            "offsets API certificate and CAs reloaded",
        )
    if broker.uplink_hub is not None and _reloaded(
        broker.uplink_hub.tls.reload,
        "uplink hub certificate not reloaded, the previous one stays in force",
        "uplink hub certificate and sites' CAs reloaded",
    ):
        broker.uplink_hub.reloaded()
    if broker.site_link is not None:
        _reloaded(
            broker.site_link.hub_certificate.reload,
            "uplink.tls.cafile not reloaded, the previous CAs stay in force",
            "uplink: the hub's CAs (uplink.tls.cafile) reloaded",
        )
    if broker.cluster_node is not None:
        broker.cluster_node.reload_credentials()


def _reloaded(reload: Callable[[], object], failed: str, done: str) -> bool:
    """Run ``reload`` (of certificate files): INFO ``done``, or ERROR ``failed`` with why, what was in force
    staying so; whether it reloaded."""
    try:
        reload()
    except Exception as exc:
        log.error("%s: %s", failed, exc)
        return False
    log.info("%s", done)
    return True


def _close_revoked(broker: Broker, listener: ListenerRuntime) -> None:
    """Close ``listener``'s connections whose client certificate its CRLs, just read, revoke."""
    trust = listener.tls_contexts.trust if listener.tls_contexts is not None else None
    if trust is None or trust.crlfile is None:
        return
    close_revoked(list(broker.connections), listener.name, trust)


def _close_untrusted(broker: Broker, listener: ListenerRuntime) -> None:
    """Close ``listener``'s connections whose client certificate its CAs, just read, no longer trust."""
    trust = listener.tls_contexts.trust if listener.tls_contexts is not None else None
    if trust is None:
        return
    close_untrusted(list(broker.connections), listener.name, trust)


Report = Callable[[str | None], None]
"""Told ``None`` once the broker serves, and again every ``HEARTBEAT_S`` while it does, or the one-line
reason it could not start (``--workers``' members tell their command so, which kills one that hangs)."""

HEARTBEAT_S = 1.0


def run_broker(config_path: str | None, node: str | None = None, report: Report | None = None) -> int:
    """Load the config (defaults without a file), run the broker until a signal, return the exit status;
    ``node``: the member of ``--workers`` it is, named on every log line; ``report``: told when it serves, or
    why it could not start (exit status 2 or 1)."""
    tell = report if report is not None else _ignore
    try:
        config = load_broker_config(config_path)
        check_data_directory(config)
    except (ConfigError, OSError) as exc:
        return _refused(exc, config_path, tell, member=report is not None)
    if config.cluster is not None:
        require_cluster_client()
    configure_logging(config.logging, node=node)
    try:
        check_certificate_names(config)  # before the data directory is made or locked
    except (ConfigError, OSError) as exc:
        return _refused(exc, config_path, tell, member=report is not None)
    bound_arenas()  # before the store, the hasher or an executor starts a thread
    asyncio_run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    if config.runtime.event_loop == "uvloop":
        import uvloop

        asyncio_run = uvloop.run
    try:
        asyncio_run(_serve_telling(config, tell, ConfigFile(config_path) if config_path else None))
    except ConfigError as exc:
        return _refused(exc, config_path, tell, member=report is not None)
    except (OSError, StoreDamaged) as exc:
        log.error("cannot start: %s", exc)
        tell(str(exc))
        return 1
    return 0


def _ignore(_: str | None) -> None:
    pass


def _refused(
    error: ConfigError | OSError, config_path: str | None, tell: Report = _ignore, member: bool = False
) -> int:
    """Say a configuration error on standard error, with the file and line of its key: exit status 2. A
    ``member`` of ``--workers`` tells its command the key alone, which says it once, naming the file given."""
    if member and isinstance(error, ConfigError) and not error.source:
        from broker_edge.runtime.workers_members import config_refusal

        tell(config_refusal(error))
        return 2
    if isinstance(error, ConfigError):
        error = sourced(error, config_path)
    print(f"timestone broker: configuration error: {error}", file=sys.stderr)
    tell(str(error))
    return 2


def read_security_files(config: BrokerConfig, own_member: bool = True) -> None:
    """Read the password file, the ACL file, the readers' tokens file and the certificates naming this site
    or member as a start reads them, so what the start would refuse in them is a ``ConfigError`` naming the
    key (and the file's line). ``own_member`` False: the members of ``--workers`` each have their own
    certificate (``workers.check_workers``), the one configured is none of theirs."""
    from broker_edge.security.acl import AccessControl

    if config.auth.password_file:
        try:
            PasswordFile.load(config.auth.password_file)
        except PasswordFileError as error:
            raise ConfigError("auth.password_file", str(error)) from None
    if config.acl.file:
        AccessControl.from_config(config.acl)
    if config.offsets_api.enabled:
        config.offsets_api.reader_tokens()
    for key, tls in config.server_tls():  # a start serves it (said at ERROR); a reload keeps the one in force
        problem = files_not_valid_now(tls)
        if problem:
            raise ConfigError(f"{key}.{problem[0]}", problem[1])
    check_certificate_names(config, own_member)


def check_certificate_names(config: BrokerConfig, own_member: bool = True) -> None:
    """The certificates that say who this broker is name it, as a start requires (``ConfigError`` naming the
    key): a site's (``uplink.tls.certfile``) its ``uplink.site_id``, as the hub reads it; a cluster member's
    (``cluster.tls``, unless not ``own_member``) its ``node_id``, its files loaded as the member loads
    them."""
    uplink = config.uplink
    if uplink is not None:
        from broker_edge.uplink.site_identity import check_site_certificate

        check_site_certificate(uplink.tls.certfile, uplink.site_id)
    cluster = config.cluster
    if own_member and cluster is not None and cluster.tls is not None:
        from broker_edge.cluster.links.member_identity import MemberTls

        MemberTls(cluster.tls, cluster.node_id)


def check_data_directory(config: BrokerConfig) -> None:
    """``storage.directory`` can be used or made by this process (a start's, a check's): ``ConfigError``."""
    if config.storage.enabled:
        check_directory("storage.directory", config.storage.directory)


CLUSTER_CLIENT = ("aetcd", "grpc")
"""The etcd client a cluster member needs: the ``cluster`` extra (``pip install 'timestone[cluster]'``)."""


def require_cluster_client() -> None:
    """What a ``cluster:`` section, or ``--workers`` (whose members form a cluster), needs: the etcd client,
    imported before anything is bound or opened, so that a start and ``--check`` without the extra end the
    same way, with the extra to install (``ModuleNotFoundError``, which ``timestone`` says as exit status 3),
    not a broker that serves and then exits as it joins."""
    import importlib

    for module in CLUSTER_CLIENT:
        importlib.import_module(module)


def check_config(config_path: str | None, workers: int = 1) -> int:
    """``timestone broker --check [--workers N]``: load the config and read every file it names, as a start
    does before anything is opened (and refuse what N members refuse, or settings needing more file
    descriptors than the process may open); say the result and return the exit status (0, or 2 for a
    configuration error). Nothing is bound, opened or written."""
    where = config_path if config_path is not None else "the embedded defaults"
    try:
        # read once: it may be a pipe
        document, config = load_broker_document(config_path, own_member=workers == 1)
        read_security_files(config, own_member=workers == 1)
        check_data_directory(config)
        if config.cluster is not None or workers > 1:
            require_cluster_client()
        if workers > 1:
            from broker_edge.runtime.workers import check_workers

            check_workers(document, config, workers)
        else:
            from broker_edge.runtime.broker import budget_descriptors

            budget_descriptors(config)  # settings whose descriptors the process cannot hold, as a start
    except (ConfigError, OSError) as exc:
        return _refused(exc, config_path)
    listeners = ", ".join(
        f"{listener.name} ({listener.type} {listener.host}:{listener.port})" for listener in config.listeners
    )
    print(
        f"timestone broker: {where}: configuration OK (every file it names read): listeners {listeners}; "
        f"data directory {config.storage.directory}"
        + (f"; {workers} members (--workers)" if workers > 1 else "")
    )
    return 0


async def _serve_telling(config: BrokerConfig, tell: Report, source: ConfigFile | None = None) -> None:
    """``serve``, and ``tell(None)`` once the broker serves, then every ``HEARTBEAT_S`` from its loop."""
    ready = asyncio.Event()

    async def told() -> None:
        await ready.wait()
        while True:
            tell(None)
            await asyncio.sleep(HEARTBEAT_S)

    telling = asyncio.ensure_future(told())
    try:
        await serve(config, ready, source)
    finally:
        telling.cancel()


def main(argv: list[str] | None = None) -> int:
    """``timestone broker [--config FILE] [--workers N]`` (also ``python -m broker_edge.runtime.main``):
    without a file the defaults serve 127.0.0.1:1883; with ``--workers`` N member processes serve it
    together (``runtime.workers``)."""
    import argparse

    stop_signals.catch_early_stops()  # `timestone broker` did it before this module was imported

    parser = argparse.ArgumentParser(
        prog="timestone broker",
        description="Run a Timestone edge broker.",
        epilog="exit status: 0 stopped (SIGINT or SIGTERM, at any moment of its start too); 1 cannot start "
        "(a port taken, a file system that fails, a damaged data file); 2 a configuration error (the message "
        "names the key). SIGHUP re-reads the password, ACL and tokens files and the certificates, not the "
        "configuration file: its changes apply at the next start (SIGHUP says so when it changed). "
        "With --workers: SIGHUP is passed on to every member; a member that cannot start ends the command "
        "with its status (1 or 2) and reason; a port another process listens on or another --workers serves "
        "is refused (1), and so is a data directory in use (2); a member that crashes after it served is "
        "started again.",
    )
    parser.add_argument("--config", "-c", help="broker YAML config (default: embedded defaults)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="member processes serving the same listeners as one broker, a cluster on this host (default 1: "
        "one broker process); see docs/broker.md",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="read the configuration and every file it names (passwords, ACL, tokens, certificates), say "
        "whether a broker (with --workers N: N members) would start with them and exit (0 it would, 2 a "
        "configuration error naming the key); nothing is bound, opened or written",
    )
    args = parser.parse_args(argv)
    most = MEMBERS_PER_CPU * len(os.sched_getaffinity(0))  # its cpuset's (taskset, a container), not the host
    if not 1 <= args.workers <= most:
        parser.error(
            f"--workers: from 1 to {most} ({MEMBERS_PER_CPU} per CPU this command may run on: a member keeps "
            f"a core busy, more only share them), got {args.workers}"
        )
    if args.check:
        return check_config(args.config, args.workers)
    if args.workers > 1:
        from broker_edge.runtime.workers import run_workers

        require_cluster_client()  # its members form a cluster: before etcd or a member starts
        return run_workers(args.config, args.workers, run_broker)
    return run_broker(args.config)


if __name__ == "__main__":
    sys.exit(main())
