"""The supervision loop of ``timestone broker --workers N``: the members started, started again and stopped,
SIGHUP passed on to them, the command's etcd started again, the addresses' claims answered."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time

from broker_edge.process.port_claim import answer_askers
from broker_edge.runtime.config_file import ConfigFile, warn_if_changed
from broker_edge.runtime.workers_etcd import LocalEtcd, stop_pending
from broker_edge.runtime.workers_members import Member
from broker_edge.settings.broker import BrokerConfig

__all__ = ["SIGNALS", "follow_etcd", "pass_on_due_sighups", "pass_on_sighup", "run_members", "stop_members"]

log = logging.getLogger("broker_edge.workers")

STOP_TIMEOUT_S = 30.0
"""How long the members may take to stop after SIGTERM before they are killed."""

SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_members(
    members: list[Member],
    config: BrokerConfig,
    claims: list[socket.socket],
    etcd: LocalEtcd | None = None,
    source: ConfigFile | None = None,
) -> tuple[Member, int, str] | None:
    """Start the members and keep them running until SIGTERM or SIGINT (None), passing SIGHUP on to them;
    or until one could not start before it ever served: (it, its exit status, its reason). ``claims``: the
    addresses' claims, whose askers are answered; ``etcd``: the command's own, started again when it exits
    (tried again later while it does not start); ``source``: the file given, which a SIGHUP does not read
    again (said when it changed, as by ``timestone broker``)."""
    if stop_pending():  # came while etcd started: no member is forked only to be stopped
        log.info("stopped during start-up")
        return None
    by_pid: dict[int, Member] = {}
    all_serving = False
    while True:
        now = time.monotonic()
        if etcd is not None and etcd.retry_at is not None and etcd.retry_at <= now:
            etcd.try_again()
            now = time.monotonic()
        if etcd is not None and etcd.moved:
            etcd.moved = False
            follow_etcd(members, etcd.url)
        for member in members:
            if member.start_at is not None and member.start_at <= now:
                member.start([m.reports for m in members if m.reports is not None])
                assert member.pid is not None
                by_pid[member.pid] = member
        waits = [m.start_at - now for m in members if m.start_at is not None]
        if etcd is not None and etcd.retry_at is not None:
            waits.append(etcd.retry_at - now)
        if etcd is not None:
            waits.append(etcd.watch())
        received = signal.sigtimedwait(SIGNALS, max(min(waits, default=1.0), 0.01))
        signo = received.si_signo if received is not None else None
        if signo in (signal.SIGTERM, signal.SIGINT):
            log.info("stopping %d members", len(members))
            return None
        if signo == signal.SIGHUP:
            pass_on_sighup(members)
            warn_if_changed(source)
        if etcd is not None and etcd.moved:  # started again on other ports after it exited (below)
            etcd.moved = False
            follow_etcd(members, etcd.url)
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
        pass_on_due_sighups(members)
        for claim in claims:
            answer_askers(claim)
        if not all_serving and all(m.served and m.pid is not None for m in members):
            all_serving = True
            addresses = ", ".join(f"{listener.host}:{listener.port}" for listener in config.listeners)
            log.info("%d members serving %s: %s", len(members), addresses, ", ".join(m.node for m in members))


def follow_etcd(members: list[Member], url: str) -> None:
    """The command's etcd moved to ``url`` (a port of its own was taken): each member's configuration names
    it now, and each running member is stopped (SIGTERM), to be started again with it as after a crash; its
    etcd client would look for the old address for ever."""
    for member in members:
        member.follow_etcd(url)
        if member.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, signal.SIGTERM)
                os.kill(member.pid, signal.SIGCONT)


def pass_on_sighup(members: list[Member]) -> None:
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


def pass_on_due_sighups(members: list[Member]) -> None:
    """SIGHUP to the members that were starting when one came and serve now."""
    for member in members:
        if member.reload_due and member.serving and member.pid is not None:
            member.reload()
            log.info("SIGHUP passed on to member %s, which serves now", member.node)


def stop_members(members: list[Member]) -> None:
    """SIGTERM to every member (then SIGCONT: a stopped one takes it now), SIGKILL to those still running
    after ``STOP_TIMEOUT_S``."""
    running: dict[int, Member] = {m.pid: m for m in members if m.pid is not None}
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while running and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            member = running.pop(pid, None)
            if member is not None:
                member.ended()
            continue
        signal.sigtimedwait(SIGNALS, 0.1)
    for pid, member in running.items():
        log.warning("member %s did not stop within %.0f s: killed", member.node, STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        member.ended()
