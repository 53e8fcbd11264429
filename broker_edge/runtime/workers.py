"""``timestone broker --workers N``: one broker made of N member processes on this host.

The members form a cluster (docs/cluster.md): the topic space in partitions led by one member each, a publish
received by any member appended on its partition's leader, sessions, subscriptions and retained messages
across members. Every member binds the configured MQTT listeners with ``SO_REUSEPORT``
(``listeners[].reuse_port``): clients reach one address and the kernel spreads their connections over the
members, so they see one broker using N cores.

Without a ``cluster:`` section the cluster's etcd is this command's own: Debian's ``etcd`` (package
etcd-server) on free loopback ports, its data beside the members' so that a restart finds the cluster as it
left it, started before the members (once it serves) and stopped after them; started again when it exits,
and tried again while it cannot start (a full disk), the members kept. Its members keep one copy of each log
(replication factor 1): a log is on its member's disk, a member's crash loses nothing acknowledged, and the
member, started again, serves its partitions again. With a ``cluster:`` section the members join that
cluster (its etcd, its replication) as ``<node_id>-<n>``.

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
A member that serves says so every second; one silent for ``HUNG_S`` (stopped, deadlocked) is killed and
started again the same way.
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

import asyncio
import contextlib
import copy
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_edge.config.loader import ConfigError, load_yaml_file
from broker_edge.process.parent_death import die_with_parent
from broker_edge.process.port_claim import answer_askers, claim_address, probe_unbound
from broker_edge.runtime import stop_signals
from broker_edge.runtime.data_lock import DataDirectoryLock
from broker_edge.runtime.launcher import free_ports
from broker_edge.settings.broker import WORKERS_DIRECTORY, BrokerConfig, load_broker_config
from broker_edge.settings.cluster import ClusterConfig

__all__ = ["LocalEtcd", "Member", "check_workers", "member_documents", "run_workers"]

log = logging.getLogger("broker_edge.workers")

RESTART_DELAY_S = 0.1
"""The first wait before a member that exited is started again; doubled while it keeps failing."""
RESTART_DELAY_MAX_S = 30.0
STEADY_S = 60.0
"""A member that ran this long before it exited is started again after the first wait."""
STOP_TIMEOUT_S = 30.0
"""How long the members may take to stop after SIGTERM before they are killed."""
HUNG_S = 10.0
"""A member that serves and says nothing for this long (it says it serves every ``main.HEARTBEAT_S``)
hangs: stopped (SIGSTOP), deadlocked, its loop blocked. Its lease ran out long before (the cluster took it
for dead): it is killed and started again, as a member that crashed."""
FORGET_TIMEOUT_S = 10.0
ETCD_START_TIMEOUT_S = 20.0
ETCD_RETRY_S = 1.0
"""The first wait before the command's etcd that could not start again is tried again; doubled while it
keeps failing, up to ``RESTART_DELAY_MAX_S``."""
PRELOAD = ("broker_edge.runtime.broker", "broker_edge.cluster.node", "uvloop")
"""What the command imports before it forks a member (none of it starts a thread at import)."""


def node_id(config: BrokerConfig, index: int) -> str:
    """The node id of member ``index``: ``w<index>``, or ``<node_id>-<index>`` in a configured cluster."""
    cluster = config.cluster
    return f"{cluster.node_id}-{index}" if cluster is not None else f"w{index}"


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
    if host in ("0.0.0.0", "::", ""):
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


class LocalEtcd:
    """Debian's etcd on two free loopback ports, its data in ``directory/etcd`` (mode 0700), its log in
    ``directory/etcd.log``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []
        self.retry_at: float | None = None
        """When to try again to start it (it exited and did not start again); None while it serves."""
        self._delay = ETCD_RETRY_S

    def start(self) -> str:
        """Start it and wait until it answers; its client URL."""
        binary = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        if binary is None:
            raise ConfigError(
                "cluster",
                "--workers without a cluster: section runs its own etcd, and no etcd binary was found "
                "(install Debian's etcd-server, or name an etcd in a cluster: section)",
            )
        data = self.directory / "etcd"
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(data, 0o700)  # etcd refuses a data directory others may read
        client, peer = free_ports(2)
        self.url = f"http://127.0.0.1:{client}"
        self._command = [
            binary,
            "--name",
            "timestone-workers",
            "--data-dir",
            str(data),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"timestone-workers=http://127.0.0.1:{peer}",
            "--logger",
            "zap",
            "--log-level",
            "warn",
        ]
        self._launch()
        log.info("etcd for the members on %s (data in %s)", self.url, data)
        return self.url

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is its process."""
        return self.process is not None and self.process.pid == pid

    def restart(self, status: int) -> None:
        """It exited (``status``, as ``waitpid`` gives it, the process already reaped): start it again on the
        same ports and data, where the members look for it (``try_again``)."""
        how = (
            f"signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"status {os.waitstatus_to_exitcode(status)}"
        )
        log.error("etcd of the members exited (%s): starting it again on %s", how, self.url)
        self.process = None
        self.try_again()

    def try_again(self) -> None:
        """Start it again; one that does not serve (its disk full, its data unreadable) is tried again at
        ``retry_at``, after a wait that doubles up to ``RESTART_DELAY_MAX_S``: the members, fenced meanwhile,
        serve again once it does, where the command stopped them all for a passing shortage."""
        try:
            self._launch()
        except RuntimeError as error:
            log.error(
                "%s: trying again in %.0f s (the members acknowledge nothing meanwhile)", error, self._delay
            )
            self.retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, RESTART_DELAY_MAX_S)
            return
        self.retry_at, self._delay = None, ETCD_RETRY_S
        log.warning("etcd of the members answers again on %s", self.url)

    def _launch(self) -> None:
        """Start it and wait until it serves; ``RuntimeError`` saying why it did not (etcd's own last word
        from its log)."""
        parent = os.getpid()
        etcd_log = self.directory / "etcd.log"
        with open(etcd_log, "ab") as output:
            logged = output.tell()
            self.process = subprocess.Popen(
                self._command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,  # stopped by this command, after the members, never by a Ctrl-C
                preexec_fn=lambda: _etcd_process(parent),
            )
        deadline = time.monotonic() + ETCD_START_TIMEOUT_S
        while not _serves(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                reason = _etcd_last_word(etcd_log, logged)
                raise RuntimeError(f"etcd did not start{f' ({reason})' if reason else ''}: see {etcd_log}")
            time.sleep(0.05)

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _etcd_last_word(path: Path, since: int) -> str:
    """The message of etcd's last fatal or panic line written to its log from ``since`` on, with its error
    (``failed to create WAL: no space left on device``); empty if none."""
    try:
        with open(path, "rb") as etcd_log:
            etcd_log.seek(since)
            lines = etcd_log.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("fatal", "panic"):
            return ": ".join(str(entry[key]) for key in ("msg", "error") if entry.get(key))
    return ""


def _etcd_process(parent: int) -> None:
    """In etcd's process before it runs: SIGTERM when this command dies, and no signal blocked (this
    command blocks those it takes with sigtimedwait; etcd would inherit them blocked, SIGTERM included)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    die_with_parent(signal.SIGTERM, parent)


RunBroker = Callable[[str, str, Callable[[str | None], None]], int]
"""``timestone broker --config PATH`` as member NODE (``main.run_broker``), telling REPORT ``None`` once it
serves or why it could not start: its exit status."""

SERVING = b"serving\n"
"""What a member writes on its pipe once it serves, and again every ``main.HEARTBEAT_S`` while it does;
``failed <reason>`` lines say why it could not start."""


class Member:
    """One member: ``timestone broker --config <its file>`` in a process forked from this command."""

    def __init__(self, node: str, config_path: Path, cluster: ClusterConfig, run: RunBroker) -> None:
        self.node = node
        self.run = run
        self.config_path = config_path
        self.cluster = cluster
        self.pid: int | None = None
        self.started_at = 0.0
        self.start_at: float | None = 0.0
        """When to start it (now or later: it exited and waits); None while it runs or stopping."""
        self.delay = RESTART_DELAY_S
        self.served = False
        """Whether it ever served (in any of its processes): from then on an exit is a crash to recover
        from by starting it again, whatever its status."""
        self.reports: int | None = None
        """The read end of the pipe its running process reports on (``SERVING``, or why it failed)."""
        self.serving = False
        """Whether its running process said it serves (its SIGHUP handler in place)."""
        self.reload_due = False
        """A SIGHUP came while its process was starting (ignoring it): passed on once it serves."""
        self.heard_at: float | None = None
        """When its running process last said it serves (None: not yet, or killed as hung)."""

    @property
    def pid_file(self) -> Path:
        return self.config_path.with_suffix(".pid")

    def start(self, inherited: list[int]) -> None:
        """Fork its process; ``inherited``: descriptors of this command's the member must close (the other
        members' pipes)."""
        parent = os.getpid()
        reports, report = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reports)
            for fd in inherited:
                with contextlib.suppress(OSError):
                    os.close(fd)
            _member_process(self.run, str(self.config_path), self.node, parent, report)  # never returns
        os.close(report)
        os.set_blocking(reports, False)
        self.reports, self.serving, self.reload_due, self.heard_at = reports, False, False, None
        self.pid, self.started_at, self.start_at = pid, time.monotonic(), None
        try:  # information only: a full disk must not end the command
            self.pid_file.write_text(f"{pid}\n")
        except OSError as error:
            log.warning("member %s is pid %d: %s not written (%s)", self.node, pid, self.pid_file, error)

    def reload(self) -> None:
        """SIGHUP to its process (one that serves): it reads its files and certificates again."""
        self.reload_due = False
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGHUP)

    def read_reports(self) -> str | None:
        """Read what its process reported since the last call (noting that it serves); the last reason it
        gave for not starting, if any."""
        reason = None
        if self.reports is None:
            return None
        chunks = []
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.reports, 65536):
                chunks.append(chunk)
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            if line == SERVING.decode().strip():
                self.served = self.serving = True
                self.heard_at = time.monotonic()
            elif line.startswith("failed "):
                reason = line.removeprefix("failed ")
        return reason

    def kill_if_hung(self) -> None:
        """SIGKILL to its process if it served and has said nothing for ``HUNG_S``: it is then started
        again as after a crash (``exited``), where it held its share of the shared listeners' new
        connections, unanswered, and its partitions without a leader for as long as it hung."""
        heard_at, pid = self.heard_at, self.pid
        if heard_at is None or pid is None or time.monotonic() - heard_at < HUNG_S:
            return
        log.error(
            "member %s (pid %d) said nothing for %.0f s (hung: stopped, deadlocked, its loop blocked): "
            "killed, to be started again",
            self.node,
            pid,
            time.monotonic() - heard_at,
        )
        self.heard_at = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def ended(self) -> str | None:
        """Its process is gone: its pid file removed (if still its own), its pipe read and closed; the reason
        it gave for not starting, if any."""
        reason = self.read_reports()
        if self.reports is not None:
            os.close(self.reports)
            self.reports = None
        if self.pid is not None:
            remove_pid_file(self.pid_file, self.pid)
        self.pid = None
        return reason

    def failed_to_start(self, status: int) -> tuple[int, str] | None:
        """Its process ended by itself (``status`` as ``os.waitpid`` gives it): (exit status, reason) when
        it could not start (configuration error 2, cannot start 1) and never served; starting it again
        would fail the same way. None: a crash, to recover from by ``exited``."""
        node = self.node
        reason = self.ended()
        code = os.waitstatus_to_exitcode(status)
        if self.served or code not in (1, 2):
            return None
        return code, reason or f"member {node} exited (status {code}) before it served"

    def exited(self, status: int) -> None:
        """Its process ended (``status``) and ``failed_to_start`` said it was a crash: forget it in etcd and
        start it again after its wait."""
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {-code}" if code < 0 else f"status {code}"
        if time.monotonic() - self.started_at >= STEADY_S:
            self.delay = RESTART_DELAY_S
        log.warning("member %s exited (%s): starting it again in %.1f s", self.node, how, self.delay)
        _run_in_child(lambda: asyncio.run(_forget_member(self.cluster, self.node)), FORGET_TIMEOUT_S)
        self.start_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, RESTART_DELAY_MAX_S)


def remove_pid_file(path: Path, pid: int) -> None:
    """Remove ``path`` if it still holds ``pid``: a file another command wrote is never removed."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(pid):
            path.unlink()


def _member_process(run: RunBroker, config_path: str, node: str, parent: int, report: int) -> None:
    """The forked member: its own session (the command decides when it stops; SIGTERM if the command dies),
    SIGINT and SIGTERM noted until its loop takes them (``stop_signals``, as ``timestone broker`` has them
    from its start), SIGHUP ignored until then (its files are being read anyway), then ``timestone broker``,
    which tells ``report`` (a pipe to the command) when it serves, or why it could not start."""
    code = 1

    def tell(reason: str | None) -> None:
        line = SERVING if reason is None else f"failed {' '.join(reason.split())}\n".encode()
        with contextlib.suppress(OSError):
            os.write(report, line)

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.set_blocking(report, False)  # a command busy for a moment never blocks the member's loop
        os.setsid()
        die_with_parent(signal.SIGTERM, parent)
        code = run(config_path, node, tell)
    except BaseException as error:
        traceback.print_exc()
        tell(f"{type(error).__name__}: {error}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_in_child(work: Any, timeout_s: float) -> None:
    """Run ``work()`` in a forked child and wait for it at most ``timeout_s``: this process stays free of
    threads (an etcd client's), so that it can keep forking members safely."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


async def _forget_member(config: ClusterConfig, node: str) -> None:
    """Remove a dead member's registration, so that the cluster acts now rather than when its lease ends
    (its process is gone: it renews nothing; it registers anew once started again, after this)."""
    from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd

    etcd = Etcd(config.etcd, 5.0, config.etcd_tls, config.etcd_auth)
    try:
        await etcd.delete(ClusterKeys(config.key_prefix).member(node))
    finally:
        await etcd.close()


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Requests to the command's own etcd on loopback: never through an ``http_proxy`` of the environment."""


def _serves(url: str) -> bool:
    """Whether etcd at ``url`` serves its clients: its ``/health`` answers. Its port accepts connections
    a moment before (its server not ready, its member not yet leader), when a member's first calls fail."""
    try:
        with _DIRECT.open(f"{url}/health", timeout=1.0) as answer:
            return bool(json.load(answer).get("health") == "true")
    except (OSError, ValueError, AttributeError):
        return False


def _write_yaml(path: Path, document: dict[str, Any]) -> None:
    import yaml

    temporary = path.with_suffix(".yaml.tmp")
    temporary.write_text(
        "# Made by timestone broker --workers from its configuration: changes here are overwritten.\n"
        + yaml.safe_dump(document, sort_keys=False)
    )
    os.replace(temporary, path)


_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def supervise(document: dict[str, Any], config: BrokerConfig, workers: int, run: RunBroker) -> int:
    """Run etcd (unless configured) and the members until SIGTERM or SIGINT, or until a member cannot
    start; the exit status. ``_SIGNALS`` must be blocked (``run_workers``)."""
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
            _write_yaml(path, member_document)
            cluster = load_broker_config(path).cluster
            assert cluster is not None, "every member's configuration has a cluster: section"
            members.append(Member(node, path, cluster, run))
        fatal = _run_members(members, config, claims, etcd)
        _stop_members(members)
    finally:
        if etcd is not None:
            etcd.stop()
        for claim in claims:
            claim.close()
        lock.release()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # one pending now must not end the command
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    if fatal is not None:
        member, code, reason = fatal
        if code == 2:
            print(f"timestone broker: configuration error: member {member.node}: {reason}", file=sys.stderr)
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


def _run_members(
    members: list[Member], config: BrokerConfig, claims: list[socket.socket], etcd: LocalEtcd | None = None
) -> tuple[Member, int, str] | None:
    """Start the members and keep them running until SIGTERM or SIGINT (None), passing SIGHUP on to them;
    or until one could not start before it ever served: (it, its exit status, its reason). ``claims``: the
    addresses' claims, whose askers are answered; ``etcd``: the command's own, started again when it exits
    (tried again later while it does not start)."""
    by_pid: dict[int, Member] = {}
    all_serving = False
    while True:
        now = time.monotonic()
        if etcd is not None and etcd.retry_at is not None and etcd.retry_at <= now:
            etcd.try_again()
            now = time.monotonic()
        for member in members:
            if member.start_at is not None and member.start_at <= now:
                member.start([m.reports for m in members if m.reports is not None])
                assert member.pid is not None
                by_pid[member.pid] = member
        waits = [m.start_at - now for m in members if m.start_at is not None]
        if etcd is not None and etcd.retry_at is not None:
            waits.append(etcd.retry_at - now)
        received = signal.sigtimedwait(_SIGNALS, max(min(waits, default=1.0), 0.01))
        signo = received.si_signo if received is not None else None
        if signo in (signal.SIGTERM, signal.SIGINT):
            log.info("stopping %d members", len(members))
            return None
        if signo == signal.SIGHUP:
            _pass_on_sighup(members)
        while by_pid:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            if etcd is not None and etcd.owns(pid):
                etcd.restart(status)
                continue
            dead = by_pid.pop(pid, None)
            if dead is None:
                continue
            failure = dead.failed_to_start(status)
            if failure is not None:
                code, reason = failure
                log.error("member %s could not start (exit status %d): stopping the others", dead.node, code)
                return dead, code, reason
            dead.exited(status)
        for member in members:
            member.read_reports()
            member.kill_if_hung()
        _pass_on_due_sighups(members)
        for claim in claims:
            answer_askers(claim)
        if not all_serving and all(m.served and m.pid is not None for m in members):
            all_serving = True
            addresses = ", ".join(f"{listener.host}:{listener.port}" for listener in config.listeners)
            log.info("%d members serving %s: %s", len(members), addresses, ", ".join(m.node for m in members))


def _pass_on_sighup(members: list[Member]) -> None:
    """SIGHUP to every member that serves: each re-reads its password, ACL and tokens files and its
    certificates, as ``timestone broker`` does. One still starting ignores SIGHUP until its loop takes it:
    it is told once it serves (it may have read a file before the change)."""
    told, later = [], []
    for member in members:
        if member.pid is None:
            continue
        member.read_reports()
        if not member.serving:
            member.reload_due = True
            later.append(member.node)
            continue
        member.reload()
        told.append(member.node)
    waiting = f"; {', '.join(later)} once serving" if later else ""
    now = ", ".join(told) or "(none)"
    log.info("SIGHUP passed on to members %s: files and certificates read again%s", now, waiting)


def _pass_on_due_sighups(members: list[Member]) -> None:
    """SIGHUP to the members that were starting when one came and serve now."""
    for member in members:
        if member.reload_due and member.serving and member.pid is not None:
            member.reload()
            log.info("SIGHUP passed on to member %s, which serves now", member.node)


def _stop_members(members: list[Member]) -> None:
    """SIGTERM to every member, SIGKILL to those still running after ``STOP_TIMEOUT_S``."""
    running: dict[int, Member] = {m.pid: m for m in members if m.pid is not None}
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while running and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            member = running.pop(pid, None)
            if member is not None:
                member.ended()
            continue
        signal.sigtimedwait(_SIGNALS, 0.1)
    for pid, member in running.items():
        log.warning("member %s did not stop within %.0f s: killed", member.node, STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        member.ended()


def check_workers(config_path: str | None, config: BrokerConfig, workers: int) -> dict[str, Any]:
    """The YAML document of ``config_path`` (loaded as ``config``), once ``ConfigError`` said nothing that
    ``workers`` members refuse (a listener on port 0, the log off, an uplink hub; ``--check`` too)."""
    document = load_yaml_file(config_path) if config_path is not None else {}
    member_documents(document, config, workers, "http://127.0.0.1:2379")
    return document


def run_workers(config_path: str | None, workers: int, run: RunBroker) -> int:
    """``timestone broker --workers N``: the exit status (2 for a configuration error); ``run`` runs each
    member (``main.run_broker``)."""
    from broker_edge.observe.logs import configure_logging

    # From here on these are taken by sigtimedwait, never by a handler: a SIGHUP (systemctl reload) during
    # the start is passed on to the members once they run, instead of ending the command.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        config = load_broker_config(config_path)
        document = check_workers(config_path, config, workers)
    except (ConfigError, OSError) as exc:
        print(f"timestone broker: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.logging)
    try:
        return supervise(document, config, workers, run)
    except ConfigError as exc:
        print(f"timestone broker: configuration error: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        log.error("cannot start: %s", exc)
        return 1
