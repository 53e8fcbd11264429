"""The systemd units of conf/systemd/: checked by systemd's own ``systemd-analyze verify`` (as installed by
docs/operations.md: the command at /opt/timestone/bin/timestone, here this checkout's, in a mount namespace of
the test's own), sandboxed well enough for ``systemd-analyze security`` to rate them OK, and the system user
made by ``systemd-sysusers`` from conf/systemd/timestone.sysusers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.supervisor import NOT_RESTARTABLE

ROOT = Path(__file__).resolve().parents[3]
UNITS = ROOT / "conf" / "systemd"
ANALYZE = shutil.which("systemd-analyze")
INSTANCES = {"timestone-broker@edge.service": "timestone-broker@.service"} | {
    f"timestone-pipeline@{job}.service": "timestone-pipeline@.service" for job in ("telemetry", "actions")
}

pytestmark = [
    pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian's systemd package)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the mount namespace that installs the command needs root"),
]


def installed_and_verified(directory: Path, unit: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of ``unit`` (in ``directory``), with /opt/timestone/bin/timestone this
    checkout's command, as a virtual environment at /opt/timestone would have it."""
    command = Path(sys.executable).parent / "timestone"
    script = (
        "mount -t tmpfs tmpfs /opt && mkdir -p /opt/timestone/bin && "
        f"ln -s {command} /opt/timestone/bin/timestone && cd {directory} && "
        f"{ANALYZE} verify {unit}"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )


def settings(unit: Path) -> dict[str, str]:
    """Each key's value; a key given more than once (``ExecReload``), its values one per line."""
    values: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if re.match(r"^[A-Z]\w*=", line):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return {key: "\n".join(given) for key, given in values.items()}


@pytest.mark.parametrize("instance", sorted(INSTANCES))
def test_each_unit_verifies_without_a_word_from_systemd(tmp_path: Path, instance: str) -> None:
    shutil.copy(UNITS / INSTANCES[instance], tmp_path / instance)
    checked = installed_and_verified(tmp_path, instance)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_verify_speaks_up_for_a_unit_that_is_wrong(tmp_path: Path) -> None:
    """verify exits 0 on an unknown key: the test above holds it to saying nothing at all."""
    text = (UNITS / "timestone-broker@.service").read_text().replace("LimitNOFILE=", "LimitNOFILES=")
    (tmp_path / "timestone-broker@edge.service").write_text(text)
    checked = installed_and_verified(tmp_path, "timestone-broker@edge.service")
    assert "Unknown key 'LimitNOFILES'" in checked.stdout + checked.stderr


@pytest.mark.parametrize("template", ["timestone-broker@.service", "timestone-pipeline@.service"])
def test_a_unit_runs_as_the_system_user_with_its_directories_limits_reload_and_no_restart_on_bad_config(
    template: str,
) -> None:
    unit = settings(UNITS / template)
    assert unit["User"] == unit["Group"] == "timestone"
    assert unit["ExecStart"].startswith("/opt/timestone/bin/timestone ")
    if template == "timestone-broker@.service":  # the files checked before the broker is told to read them
        check = "/opt/timestone/bin/timestone broker --check --config /etc/timestone/%i.yaml"
        assert unit["ExecReload"] == f"{check}\n/bin/kill -HUP $MAINPID"
    else:
        assert unit["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert "2" in unit["RestartPreventExitStatus"].split()  # a configuration error: a restart cannot fix it
    assert unit["Restart"] == "on-failure" and int(unit["LimitNOFILE"]) >= 65536
    assert unit["StateDirectory"] and unit["ConfigurationDirectory"] == "timestone"
    for sandbox in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert unit[sandbox] in ("yes", "strict"), sandbox


def test_the_pipeline_unit_does_not_restart_a_job_that_stopped_on_what_no_restart_fixes() -> None:
    """A job that gave up on a failure no restart fixes (a refused token, data loss, hand-edited
    checkpoint offsets) exited 1, and ``Restart=on-failure`` started it again every 10 s for ever. Its own
    exit status is listed; 1 (restarts of one failure used up, which a fresh JVM may fix) is not."""
    unit = settings(UNITS / "timestone-pipeline@.service")
    prevented = unit["RestartPreventExitStatus"].split()
    assert str(NOT_RESTARTABLE) in prevented and "1" not in prevented, prevented
    assert unit["Restart"] == "on-failure"


@pytest.mark.parametrize(
    ("template", "at_most"), [("timestone-broker@.service", 2.5), ("timestone-pipeline@.service", 3.5)]
)
def test_systemd_rates_the_sandbox_ok(tmp_path: Path, template: str, at_most: float) -> None:
    instance = tmp_path / template.replace("@.", "@x.")
    shutil.copy(UNITS / template, instance)
    rated = subprocess.run(
        [str(ANALYZE), "security", "--offline=true", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", rated.stdout + rated.stderr)
    assert level is not None, rated.stdout + rated.stderr
    assert float(level.group(1)) <= at_most and level.group(2) == "OK"


def test_sysusers_makes_the_system_user_the_units_run_as(tmp_path: Path) -> None:
    sysusers = shutil.which("systemd-sysusers")
    if sysusers is None:
        pytest.skip("systemd-sysusers is not installed (Debian's systemd package)")
    (tmp_path / "etc").mkdir()
    done = subprocess.run(
        [sysusers, f"--root={tmp_path}", str(UNITS / "timestone.sysusers")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (entry,) = [
        line
        for line in (tmp_path / "etc" / "passwd").read_text().splitlines()
        if line.startswith("timestone:")
    ]
    _, _, uid, _, _, home, shell = entry.split(":")
    assert int(uid) < 1000 and home == "/var/lib/timestone" and shell == "/usr/sbin/nologin"
