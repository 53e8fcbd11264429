"""A broker's CPU per QoS 2 message ingested: one publisher, the whole handshake, nothing subscribed.

    .venv/bin/python -m bench.qos2_ingest_bench [--messages 20000] [--window 50] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=OTHER_CHECKOUT:THIS_CHECKOUT python -m bench.qos2_ingest_bench   # another
    .venv/bin/python -m bench.qos2_ingest_bench --start [--devices 20000] [--messages 50000]

A broker child process (`BrokerProcess`: its defaults, the commitlog durable before each PUBREC; no publish
rate limit) on a fresh data directory; one MQTT 5 client sends ``--window`` QoS 2 PUBLISHes of 100 bytes at
once, reads their PUBRECs, sends their PUBRELs, reads their PUBCOMPs, and again until ``--messages`` are
done. The figure is the broker process's CPU time (user and system, from ``/proc``) per message, what one
core of it pays whatever the client costs; the rate is printed beside it. The broker runs the code Python
finds first: with another checkout first on ``PYTHONPATH`` (and as the working directory) that one's.

``--start``: what the start after a crash pays for the QoS 2 publishes appended since the last snapshot of
the sessions, in process (``bench.qos2_start``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from broker_edge.protocol.codec import encode
from broker_edge.protocol.packets import MQTT_5, Connect, Publish, PubRel
from broker_edge.runtime.launcher import BrokerProcess

PAYLOAD = b"x" * 100
CONNACK, PUBREC, PUBCOMP = 2, 5, 7


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PacketCounter:
    """Reads a socket and counts the packets of one type, keeping what a read cut in the middle."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def wait_for(self, packet_type: int, count: int) -> None:
        """Read until ``count`` packets of ``packet_type`` came (others are skipped)."""
        while count:
            position = 0
            while True:
                end = self._end_of_packet(position)
                if end is None:
                    break
                count -= self.buffer[position] >> 4 == packet_type
                position = end
            self.buffer = self.buffer[position:]
            if count:
                received = self.sock.recv(1 << 16)
                if not received:
                    raise ConnectionError("the broker closed the connection")
                self.buffer += received

    def _end_of_packet(self, position: int) -> int | None:
        """Where the packet at ``position`` ends; None when the buffer does not hold all of it."""
        length, shift, at = 0, 0, position + 1
        while at < len(self.buffer):
            byte = self.buffer[at]
            length |= (byte & 0x7F) << shift
            shift += 7
            at += 1
            if not byte & 0x80:
                end = at + length
                return end if end <= len(self.buffer) else None
        return None


def measure(messages: int, window: int) -> tuple[float, float]:
    """(broker CPU µs per message, messages per second) of one run."""
    directory = Path(tempfile.mkdtemp(prefix="qos2-ingest-"))
    broker = BrokerProcess(
        directory, sys_topics={"enabled": False}, limits={"messages_per_second_per_client": 0}
    )
    broker.start()
    try:
        assert broker.process is not None
        sock = socket.create_connection(("127.0.0.1", broker.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        counter = PacketCounter(sock)
        sock.sendall(encode(Connect(protocol_version=MQTT_5, client_id="qos2-ingest"), MQTT_5))
        counter.wait_for(CONNACK, 1)
        ids = range(1, window + 1)
        publishes = b"".join(encode(Publish("ingest/qos2", PAYLOAD, 2, packet_id=i), MQTT_5) for i in ids)
        releases = b"".join(encode(PubRel(i), MQTT_5) for i in ids)
        began_cpu, began = process_cpu_s(broker.process.pid), time.monotonic()
        for _ in range(messages // window):
            sock.sendall(publishes)
            counter.wait_for(PUBREC, window)
            sock.sendall(releases)
            counter.wait_for(PUBCOMP, window)
        done = messages // window * window
        cpu_us = (process_cpu_s(broker.process.pid) - began_cpu) / done * 1e6
        rate = done / (time.monotonic() - began)
        sock.close()
        return cpu_us, rate
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=50, help="PUBLISHes in flight (≤ Receive Maximum)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--start", action="store_true", help="the start after a crash (bench.qos2_start)")
    parser.add_argument("--devices", type=int, default=20_000, help="--start: devices, a topic each")
    parser.add_argument("--partitions", type=int, default=1, help="--start: storage.partitions")
    parser.add_argument("--rounds", type=int, default=3, help="--start: starts measured (the best counts)")
    args = parser.parse_args()
    if args.start:
        from bench.qos2_start import report

        print(report(args.devices, args.messages, args.partitions, args.rounds, args.window, args.json))
        return
    cpu_us, rate = measure(args.messages, args.window)
    if args.json:
        print(json.dumps({"broker_cpu_us_per_message": round(cpu_us, 2), "messages_per_s": round(rate)}))
    else:
        print(f"{cpu_us:.1f} µs of broker CPU per QoS 2 message, {rate:,.0f} messages/s")


if __name__ == "__main__":
    main()
