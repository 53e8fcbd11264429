"""The ``timestone pki`` commands a doc gives outside its run-as-written examples, run as written (with
``/etc/timestone`` under the test's directory), and the certificate files the doc's configuration examples
name being the ones those commands wrote: a reader who follows the doc gets a configuration that loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)
TLS_FILE = re.compile(r"/etc/timestone/[\w./-]+\.(?:pem|key)")


def blocks(doc: Path, language: str) -> list[str]:
    return [text for lang, text in BLOCK.findall(doc.read_text()) if lang == language]


def pki_blocks(doc: Path) -> list[str]:
    """The ``sh`` blocks of ``doc`` made of ``timestone pki`` commands only."""
    return [
        text
        for text in blocks(doc, "sh")
        if all(line.startswith("timestone pki ") for line in text.splitlines() if line.strip())
    ]


def run_as_written(text: str, etc: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    script = "set -euo pipefail\n" + text.replace("/etc/timestone", str(etc))
    environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=environment, timeout=60, check=False
    )


@pytest.mark.parametrize("name", ["uplink.md", "cluster.md"])
def test_a_docs_certificate_commands_run_as_written(tmp_path: Path, name: str) -> None:
    found = pki_blocks(ROOT / "docs" / name)
    assert found, f"docs/{name} gives no timestone pki commands"
    for text in found:
        done = run_as_written(text, tmp_path / "etc")
        assert done.returncode == 0, f"docs/{name}:\n{text}\n{done.stderr}"


def test_the_uplink_docs_tls_files_are_the_ones_its_commands_write(tmp_path: Path) -> None:
    """docs/uplink.md's site and hub configuration named /etc/timestone/site.pem, hub-ca.pem, ...: files its
    own commands (tls/site.pem, pki/hub-ca/ca.pem) never wrote."""
    doc = ROOT / "docs" / "uplink.md"
    for text in pki_blocks(doc):
        assert run_as_written(text, tmp_path / "etc").returncode == 0
    named = {path for text in blocks(doc, "yaml") for path in TLS_FILE.findall(text)}
    assert named
    missing = sorted(p for p in named if not (tmp_path / "etc" / p.removeprefix("/etc/timestone/")).is_file())
    assert missing == []


def test_the_cluster_docs_member_tls_files_are_the_ones_its_commands_write(tmp_path: Path) -> None:
    """docs/cluster.md's configuration named /etc/timestone/member.pem and cluster-ca.pem, while its
    'Making member certificates' wrote tls/b1-member.pem and pki/cluster-ca/ca.pem."""
    doc = ROOT / "docs" / "cluster.md"
    for text in pki_blocks(doc):
        assert run_as_written(text, tmp_path / "etc").returncode == 0
    member_tls = yaml.safe_load(blocks(doc, "yaml")[0])["cluster"]["tls"]
    assert sorted(member_tls) == ["cafile", "certfile", "keyfile"]
    for path in member_tls.values():
        assert (tmp_path / "etc" / path.removeprefix("/etc/timestone/")).is_file(), path


KUBECTL = """#!/bin/sh
# kubectl create secret as the doc runs it: every --from-file must name a file there is
for arg in "$@"; do
    case "$arg" in --from-file=*) path="${arg#--from-file=}"; path="${path#*=}"
        [ -f "$path" ] || { echo "kubectl: error: $path: no such file" >&2; exit 1; } ;;
    esac
done
"""


def test_the_kubernetes_secrets_block_runs_as_written(tmp_path: Path) -> None:
    """docs/operations.md's Secrets block made the etcd client's Secret from k8s/etcd.password, which no
    command wrote (the text after it named it): kubectl failed there, as written."""
    etc = tmp_path / "etc"
    for ca in ("etcd-ca", "hub-ca", "sites-ca", "cluster-ca"):  # "made as above"
        assert run_as_written(f"timestone pki ca /etc/timestone/pki/{ca}", etc).returncode == 0
    (etc / "passwd").write_text("")
    (etc / "tokens.yaml").write_text("tokens: []\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "kubectl").write_text(KUBECTL)
    (stubs / "kubectl").chmod(0o755)
    section = (ROOT / "docs" / "operations.md").read_text().split("The Secrets the manifests name", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    script = f"cd {tmp_path}\nexport PATH={stubs}:$PATH\n{block}"
    done = run_as_written(script, etc)
    assert done.returncode == 0, done.stderr
