"""Runs the commands a doc gives, as written, so that the doc and its test cannot drift apart.

A doc marks the code blocks a test runs with the name of what they make, in the block's info string, which
Markdown does not show: ```` ```sh run=cluster ````. ``commands(doc, name)`` reads them in order; a block
marked ``serve`` (```` ```sh run=cluster serve ````) holds commands that run until stopped (a broker, an
etcd): all of them are started in the background, then each is waited for until it says it is ready (the
members of an etcd cluster are ready together).

``run_as_written`` runs them in one bash (``set -euo pipefail``, so the first failing command fails the
test) inside namespaces of the test's own, which give the doc the machines it assumes without touching this
one: a network namespace with a bridge (10.0.0.0/24, this side 10.0.0.254) on which each of the doc's hosts
(``hosts``: name -> address, written to ``/etc/hosts``) is a network namespace of its own, where a block
marked ``host=NAME`` runs; and a mount namespace, shared by all, where ``/etc``, ``/var/lib``, ``/opt`` and
``/usr/local`` are overlays whose changes land in a directory of the test (so ``/etc/timestone`` and
``/var/lib/timestone`` are the doc's own paths). The working directory is this checkout (the doc's
``conf/examples/...``) and ``timestone`` is its command unless the doc installs one. ``environment`` adds
variables (what the test gives the doc's commands that its namespaces cannot reach, e.g. pip's wheels).
Needs root.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Done", "commands", "run_as_written"]

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
READY = ("broker started:", "ready to serve client requests", "serving client traffic securely")
"""What a served command says once it serves: a broker, an etcd."""


@dataclass(frozen=True)
class Block:
    text: str
    serve: bool
    host: str | None
    """The doc's host it runs on (``host=NAME``); None: the machine the doc is followed from."""


@dataclass(frozen=True)
class Done:
    returncode: int
    output: str
    logs: dict[str, str]
    """Each served command's output, by its command line."""


def commands(doc: Path, name: str) -> list[Block]:
    """The blocks of ``doc`` marked ``run=<name>``, in order."""
    found = []
    for match in FENCE.finditer(doc.read_text()):
        words = match.group(2).split()
        if f"run={name}" in words:
            hosts = [word.split("=", 1)[1] for word in words if word.startswith("host=")]
            found.append(Block(match.group(3), "serve" in words, hosts[0] if hosts else None))
    return found


_PRELUDE = r"""
set -euo pipefail
set -a  # every variable a doc sets is seen by the commands it runs on its hosts
ip link set lo up
ip link add lan type bridge
ip addr add 10.0.0.254/24 dev lan
ip link set lan up
declare -A host_pid
add_host() {{  # a network namespace of its own, on the bridge: a host of the doc
    unshare --net sleep infinity > /dev/null 2>&1 &
    host_pid[$1]=$!
    until [ "$(readlink /proc/$!/ns/net)" != "$(readlink /proc/self/ns/net)" ]; do sleep 0.01; done
    ip link add "v$!" type veth peer name eth0 netns "$!"
    ip link set "v$!" master lan up
    nsenter --net=/proc/$!/ns/net sh -c \
        "ip link set lo up && ip addr add $2/24 dev eth0 && ip link set eth0 up"
}}
{addresses}
for dir in /etc /var/lib /opt /usr/local; do
    mkdir -p "$ROOTS/upper$dir" "$ROOTS/work$dir"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$ROOTS/upper$dir,workdir=$ROOTS/work$dir" "$dir"
done
printf '%s\n' {host_lines} >> /etc/hosts
export PATH="$PATH:{bin}"  # a `timestone` the doc installs comes first
cd {checkout}
served=()
starting=()
on_host() {{  # run a command on a host of the doc: in its network namespace
    nsenter --net=/proc/${{host_pid[$1]}}/ns/net bash -euo pipefail -c "$2"
}}
serve() {{  # serve HOST COMMAND
    local log="$LOGS/served-${{#served[@]}}.log"
    printf '%s\n' "$2" > "$log.command"
    on_host "$1" "$2" > "$log" 2>&1 &
    served+=($!)
    starting+=("$!:$log")
}}
ready() {{
    local entry pid log
    for entry in "${{starting[@]}}"; do
        pid=${{entry%%:*}}; log=${{entry#*:}}
        for _ in $(seq 900); do
            if grep -q -e {ready} "$log"; then continue 2; fi
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "stopped: $(cat "$log.command")" >&2; cat "$log" >&2; return 1
            fi
            sleep 0.1
        done
        echo "not ready within 90 s: $(cat "$log.command")" >&2; cat "$log" >&2; return 1
    done
    starting=()
}}
stop_served() {{
    for pid in "${{served[@]}}"; do pkill -TERM -P "$pid" 2>/dev/null || true; done
    for pid in "${{served[@]}}"; do wait "$pid" 2>/dev/null || true; done
    for pid in "${{host_pid[@]}}"; do kill "$pid" 2>/dev/null || true; done
}}
trap stop_served EXIT
"""


def _script(
    blocks: list[Block], hosts: dict[str, str], roots: Path, logs: Path, environment: dict[str, str]
) -> str:
    prelude = _PRELUDE.format(
        addresses="\n".join(f"add_host {name} {address}" for name, address in hosts.items()),
        host_lines=" ".join(shlex.quote(f"{address} {name}") for name, address in hosts.items()) or "''",
        bin=shlex.quote(str(Path(sys.executable).parent)),
        checkout=shlex.quote(str(ROOT)),
        ready=" -e ".join(shlex.quote(line) for line in READY),
    )
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in environment.items())
    parts = [f"ROOTS={shlex.quote(str(roots))}\nLOGS={shlex.quote(str(logs))}\n", prelude, exports]
    for block in blocks:
        if block.serve:
            assert block.host is not None, "a served block names its host"
            lines = [line for line in _logical_lines(block.text) if line.strip() and not line.startswith("#")]
            parts += [f"serve {block.host} {shlex.quote(line)}\n" for line in lines]
        elif block.host is not None:
            parts.append(f"ready\non_host {block.host} {shlex.quote(block.text)}\n")
        else:
            parts.append(f"ready\n{block.text}")
    return "".join(parts)


def _logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def run_as_written(
    blocks: list[Block],
    hosts: dict[str, str],
    directory: Path,
    timeout_s: float = 300,
    environment: dict[str, str] | None = None,
) -> Done:
    """Run ``blocks`` as the doc gives them (see the module docstring); ``directory`` keeps the overlays'
    changes and the served commands' logs."""
    roots, logs = directory / "roots", directory / "logs"
    roots.mkdir(parents=True)
    logs.mkdir()
    script = directory / "commands.sh"
    script.write_text(_script(blocks, hosts, roots, logs, environment or {}))
    process = subprocess.Popen(
        ["unshare", "--net", "--mount", "--propagation", "private", "bash", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # everything the doc started goes with it
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n(stopped after {timeout_s} s)"
    served = {
        path.with_suffix(".log.command").read_text().strip(): path.read_text()
        for path in sorted(logs.glob("served-*.log"))
        if path.with_suffix(".log.command").exists()
    }
    return Done(process.returncode, output, served)
