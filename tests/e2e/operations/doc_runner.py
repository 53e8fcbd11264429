"""Runs the commands a doc gives, as written, so that the doc and its test cannot drift apart.

A doc marks the code blocks a test runs with the name of what they make, in the block's info string, which
Markdown does not show: ```` ```sh run=cluster ````. ``commands(doc, name)`` reads them in order; a block
marked ``serve`` (```` ```sh run=cluster serve ````) holds commands that run until stopped (a broker, an
etcd), each started in the background and waited for until it says it is ready.

``run_as_written`` runs them in one bash (``set -euo pipefail``, so the first failing command fails the
test) inside namespaces of the test's own, which give the doc the machine it assumes without touching this
one: a network namespace whose loopback holds the doc's host addresses (``hosts``: name -> address, written
to ``/etc/hosts``), and a mount namespace where ``/etc``, ``/var/lib`` and ``/opt`` are overlays whose changes
land in a directory of the test (so ``/etc/timestone`` and ``/var/lib/timestone`` are the doc's own paths). The
working directory is this checkout (the doc's ``conf/examples/...``) and ``timestone`` is its command. Needs
root (namespaces, mounts).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Done", "commands", "run_as_written"]

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
READY = ("broker started:", "ready to serve client requests")
"""What a served command says once it serves: a broker, an etcd."""


@dataclass(frozen=True)
class Block:
    text: str
    serve: bool


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
            found.append(Block(match.group(3), "serve" in words))
    return found


_PRELUDE = r"""
set -euo pipefail
ip link set lo up
{addresses}
for dir in /etc /var/lib /opt; do
    mkdir -p "$ROOTS/upper$dir" "$ROOTS/work$dir"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$ROOTS/upper$dir,workdir=$ROOTS/work$dir" "$dir"
done
printf '%s\n' {host_lines} >> /etc/hosts
export PATH="{bin}:$PATH"
cd {checkout}
served=()
serve() {{
    local log="$LOGS/served-${{#served[@]}}.log"
    printf '%s\n' "$1" > "$log.command"
    bash -c "$1" > "$log" 2>&1 &
    served+=($!)
    for _ in $(seq 600); do
        if grep -q -e {ready} "$log"; then return 0; fi
        if ! kill -0 "$!" 2>/dev/null; then echo "stopped: $1" >&2; cat "$log" >&2; return 1; fi
        sleep 0.1
    done
    echo "not ready within 60 s: $1" >&2; cat "$log" >&2; return 1
}}
stop_served() {{
    for pid in "${{served[@]}}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${{served[@]}}"; do wait "$pid" 2>/dev/null || true; done
}}
trap stop_served EXIT
"""


def _script(blocks: list[Block], hosts: dict[str, str], roots: Path, logs: Path) -> str:
    prelude = _PRELUDE.format(
        addresses="\n".join(f"ip addr add {address}/32 dev lo" for address in sorted(set(hosts.values()))),
        host_lines=" ".join(shlex.quote(f"{address} {name}") for name, address in hosts.items()) or "''",
        bin=shlex.quote(str(Path(sys.executable).parent)),
        checkout=shlex.quote(str(ROOT)),
        ready=" -e ".join(shlex.quote(line) for line in READY),
    )
    parts = [f"ROOTS={shlex.quote(str(roots))}\nLOGS={shlex.quote(str(logs))}\n", prelude]
    for block in blocks:
        if block.serve:
            lines = [line for line in _logical_lines(block.text) if line.strip() and not line.startswith("#")]
            parts += [f"serve {shlex.quote(line)}\n" for line in lines]
        else:
            parts.append(block.text)
    return "".join(parts)


def _logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def run_as_written(
    blocks: list[Block], hosts: dict[str, str], directory: Path, timeout_s: float = 300
) -> Done:
    """Run ``blocks`` as the doc gives them (see the module docstring); ``directory`` keeps the overlays'
    changes and the served commands' logs."""
    roots, logs = directory / "roots", directory / "logs"
    roots.mkdir(parents=True)
    logs.mkdir()
    script = directory / "commands.sh"
    script.write_text(_script(blocks, hosts, roots, logs))
    done = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "bash", str(script)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    served = {
        path.with_suffix(".log.command").read_text().strip(): path.read_text()
        for path in sorted(logs.glob("served-*.log"))
        if path.with_suffix(".log.command").exists()
    }
    return Done(done.returncode, done.stdout + done.stderr, served)
