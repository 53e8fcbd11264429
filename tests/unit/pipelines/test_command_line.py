"""The ``timestone`` command's own surface: its version, the commands its help lists, per-pipeline help."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from importlib.metadata import version

import pytest

from pipelines.cli import main
from pipelines.fleet.cli import broker_address
from pipelines.sparkplug_host.cli import build_parser, host_of


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"timestone {version('timestone')}\n"


def test_help_lists_every_command_and_the_ota_verbs(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("broker", "passwd", "cluster", "pipeline", "devices", "ota", "demo"):
        assert f"\n  {command} " in out
    assert "timestone ota create | cancel | end | status [--watch]" in out and "--version" in out


def test_the_help_lists_a_commands_subcommands_as_its_own_help_does_in_one_column(capsys):
    """A line of ``timestone --help`` that names its command's subcommands (``timestone ota create | ...``)
    names every one its own help has, in that order; each line's description starts in the same column."""
    assert main(["--help"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    columns = {len(row) - len(row.split(None, 1)[1]) for row in rows}
    assert len(columns) == 1, rows
    listed = {}
    for row in rows:
        name = row.split()[0]
        found = re.search(rf"timestone {name} ((?:[\w-]+ \| )+[\w-]+)", row)
        if found:
            listed[name] = found.group(1).split(" | ")
    assert {"ota", "pki", "devices"} <= set(listed)  # devices: it said 'simulate a fleet', not register
    for name, verbs in listed.items():
        choices = re.search(r"\{([\w,-]+)\}", help_of(capsys, [name]).split("\n\n")[0])
        assert choices and verbs == choices.group(1).split(","), (name, verbs)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("telemetry", ["bronze_telemetry", "silver_telemetry", "the `telemetry` section of this file"]),
        ("actions", ["change feed", "action_summary", "conf/actions.yaml"]),
    ],
)
def test_each_pipeline_has_its_own_help(capsys, name, words):
    with pytest.raises(SystemExit) as done:
        main(["pipeline", name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: timestone pipeline {name} ")
    for word in [*words, "--available-now", "--log-format {text,json}", "exit status: 0 caught up"]:
        assert word in out, word


def test_pipeline_help_lists_the_pipelines(capsys):
    with pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    out = capsys.readouterr().out
    assert "telemetry" in out and "actions" in out and "the OTA / command fanout" in out


def help_of(capsys: pytest.CaptureFixture[str], words: list[str]) -> str:
    """What ``timestone <words> --help`` prints (it exits 0)."""
    status: int | str | None
    try:
        status = main([*words, "--help"])
    except SystemExit as done:
        status = done.code
    assert status == 0, words
    return capsys.readouterr().out


def every_command_line(capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    """Every command and subcommand, found in the helps themselves (``{a,b}`` outside the options of a usage
    line), so a new one is checked without being listed here."""
    from pipelines.cli import COMMANDS
    from pipelines.runner import PIPELINES  # listed as PIPELINE in its usage line

    found: list[list[str]] = []
    todo = [[name] for name in COMMANDS] + [["pipeline", name] for name in PIPELINES]
    while todo:
        words = todo.pop()
        found.append(words)
        usage = help_of(capsys, words).split("\n\n")[0]
        while re.search(r"\[[^\[\]]*\]", usage):  # options and their choices, innermost brackets first
            usage = re.sub(r"\[[^\[\]]*\]", "", usage)
        for choices in re.findall(r"\{([\w,-]+)\}", usage):
            todo += [[*words, choice] for choice in choices.split(",")]
    return found


def test_every_command_says_its_exit_statuses_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    lines = every_command_line(capsys)
    assert ["ota", "create"] in lines and ["cluster", "status"] in lines and ["pipeline", "actions"] in lines
    silent = [" ".join(words) for words in lines if "exit status:" not in help_of(capsys, words).lower()]
    assert silent == []
    assert main(["--help"]) == 0
    assert "exit status: 0" in capsys.readouterr().out


def test_no_help_shows_the_markup_of_a_docstring(capsys: pytest.CaptureFixture[str]) -> None:
    """``timestone demo --help`` began '``timestone demo``: the whole platform ...', its module docstring's
    reStructuredText quotes shown as they are."""
    marked = [" ".join(words) for words in every_command_line(capsys) if "``" in help_of(capsys, words)]
    assert marked == []


def test_every_option_of_every_command_says_what_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """`devices simulate --help` listed --download-delay, --failure-rate, --reject-rate and --seed, and
    `ota create --help` --kind and --created-by, with nothing said of them (nor their defaults)."""
    bare = []
    for words in every_command_line(capsys):
        text = help_of(capsys, words)
        lines = (
            text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0].splitlines()
            if "\noptions:\n" in text
            else []
        )
        for number, line in enumerate(lines):
            following = lines[number + 1] if number + 1 < len(lines) else ""
            said = re.search(r"\S\s{2,}\S", line.strip()) or re.match(r"\s{3,}\S", following)
            if line.startswith("  -") and not said:
                bare.append(f"{' '.join(words)} {line.split()[0]}")
    assert bare == []


def test_the_demos_help_says_every_cause_of_status_1(capsys):
    """It said '1 a step did not finish within --timeout', where the demo also ends 1 when a rollout ends
    otherwise than it plans (``timestone demo --failure-rate 0.6``: the canary's abort rule stops it)."""
    out = " ".join(help_of(capsys, ["demo"]).split())
    assert (
        "1 a step did not finish within --timeout (it says which), or a rollout did not end as planned" in out
    )


def test_the_sparkplug_hosts_help_names_its_default_broker_and_every_cause_of_status_1(capsys):
    """Its help said '--broker HOST:PORT' without the default, and status 1 for a broker that 'cannot be
    reached', where a broker refusing the CONNECT or the TLS handshake ends it with 1 too (docs)."""
    out = " ".join(help_of(capsys, ["sparkplug-host"]).split())
    assert "HOST:PORT (default 127.0.0.1:1883)" in out
    assert "1 the broker cannot be reached or refused it (CONNACK reason, TLS alert)" in out


def test_the_sparkplug_host_and_the_simulators_payload_formats_are_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["sparkplug-host", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("usage: timestone sparkplug-host ")
        and "--host-id" in out
        and "--rebirth-interval" in out
    )
    with pytest.raises(SystemExit) as done:
        main(["devices", "simulate", "--help"])
    out = capsys.readouterr().out
    assert "--payload {json,cbor,protobuf,sparkplug_b}" in out and "--devices-per-node" in out
    with pytest.raises(SystemExit) as done:
        main(["devices", "simulate", "--payload", "sparkplug_b", "--procs", "2"])
    assert done.value.code == 2
    assert "--payload sparkplug_b runs in one process (--procs 1)" in capsys.readouterr().err


HOST = ["sparkplug-host", "--broker", "127.0.0.1:9"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sparkplug-host", "--broker", "127.0.0.1:99999"], "a port is 1 to 65535, got 99999"),
        (["sparkplug-host", "--broker", "127.0.0.1:0"], "a port is 1 to 65535, got 0"),
        (["devices", "simulate", "--broker", "127.0.0.1:70000"], "a port is 1 to 65535, got 70000"),
        ([*HOST, "--host-id", "a/b"], "a host id has no '/', '+' or '#', got 'a/b'"),
        ([*HOST, "--host-id", "#"], "a host id has no '/', '+' or '#', got '#'"),
        ([*HOST, "--host-id", ""], "a host id is not empty"),
        ([*HOST, "--host-id", "é" * 32_761], "a host id is at most 65520 bytes of UTF-8, got 65522"),
        ([*HOST, "--host-id", os.fsdecode(b"a\xffb")], "a host id is UTF-8 text, got 'a\\udcffb'"),
        (
            [*HOST, "--password-file", "/nonexistent/pw"],
            "cannot read /nonexistent/pw: No such file or directory",
        ),
        ([*HOST, "--rebirth-interval", "nan"], "expected seconds, 0 or more, got 'nan'"),
        ([*HOST, "--rebirth-interval", "-1"], "expected seconds, 0 or more, got '-1'"),
        ([*HOST, "--reconnect-delay", "0"], "expected seconds, more than 0, got '0'"),
        ([*HOST, "--reconnect-delay", "inf"], "expected seconds, 0 or more, got 'inf'"),
    ],
)
def test_a_wrong_broker_port_host_id_or_interval_is_a_wrong_command_line(capsys, argv, message):
    """Exit status 2 naming the value, where a port past 65535 ended ``sparkplug-host`` in a traceback, a
    host id with ``/`` published its STATE on a topic edge nodes do not read, one longer than its client id
    (``sparkplug-host-<id>``) may be in MQTT, or with bytes that are not UTF-8, ended it in a traceback, and
    a NaN interval asked for a rebirth at every message."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_the_reconnect_delay_is_the_hosts_pause_between_two_attempts_to_connect_again():
    """``--reconnect-delay`` sets it (default 1 s), where the pause was fixed at a second."""
    assert host_of(build_parser().parse_args([*HOST[1:], "--reconnect-delay", "0.25"])).retry_s == 0.25
    assert host_of(build_parser().parse_args(HOST[1:])).retry_s == 1.0


def test_a_bracketed_ipv6_broker_address_is_its_address_and_port():
    assert broker_address("[::1]:1883") == ("::1", 1883)
    assert broker_address("broker.local:8883") == ("broker.local", 8883)


SIMULATE = ["devices", "simulate", "--broker", "127.0.0.1:9"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--buckets", "0"], "argument --buckets: expected 1 or more, got 0"),
        (["--buckets", "-3"], "argument --buckets: expected 1 or more, got -3"),
        (["--connects-per-second", "nan"], "argument --connects-per-second: expected more than 0, got 'nan'"),
        (["--connects-per-second", "0"], "argument --connects-per-second: expected more than 0, got '0'"),
        (["--telemetry-interval", "0"], "argument --telemetry-interval: expected more than 0, got '0'"),
        (["--telemetry-interval", "nan"], "argument --telemetry-interval: expected more than 0, got 'nan'"),
        (["--duration", "nan"], "argument --duration: expected 0 or more, got 'nan'"),
        (["--duration", "-1"], "argument --duration: expected 0 or more, got '-1'"),
        (["--offline-rate", "-1"], "argument --offline-rate: expected 0 or more, got '-1'"),
        (["--download-delay", "5", "-1"], "argument --download-delay: expected 0 or more, got '-1'"),
        (["--download-delay", "5", "1"], "--download-delay: MIN 5.0 is more than MAX 1.0"),
    ],
)
def test_a_simulated_fleets_numbers_out_of_range_are_a_wrong_command_line(capsys, options, message):
    """Exit status 2 naming the option, where --buckets 0 and --connects-per-second nan ended in a traceback
    and a telemetry interval of 0 or NaN, a NaN duration or a negative rate ran a fleet that sent nothing."""
    with pytest.raises(SystemExit) as done:
        main([*SIMULATE, "--count", "1", *options])
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_more_devices_than_a_process_can_connect_are_a_wrong_command_line_not_a_build_that_fills_memory(
    capsys,
):
    """--count 10000000000000 built its fleet (24 GB in 6 s, deaf to Ctrl-C) before any device connected:
    each device is a connection, so a process's open-files limit bounds its share."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the soft limit the command raises to
    count = 10_000_000_000_000
    with pytest.raises(SystemExit) as done:
        main([*SIMULATE, "--count", str(count), "--procs", "2"])
    assert done.value.code == 2
    assert (
        f"--count {count}: {count // 2} devices in each of --procs 2 processes, where a process may have "
        f"{limit} files open (ulimit -n), a connection each: run more --procs"
    ) in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_demo_timeout_no_step_can_wait_is_a_wrong_command_line(capsys, tmp_path, value):
    """``timestone demo --timeout nan`` (or -1, 0): refused before the broker and Spark start, where the demo
    started them and ended 'timed out waiting for devices', exit status 1, half a minute later."""
    with pytest.raises(SystemExit) as done:
        main(["demo", "--timeout", value, "--workdir", str(tmp_path / "demo")])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"timestone demo: error: argument --timeout: expected more than 0, got {value!r}"
    )


def _to_a_reader_gone(*words: str) -> subprocess.CompletedProcess[bytes]:
    """``timestone <words>`` writing to a pipe whose reader closed its end before the command wrote."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        command = [sys.executable, "-m", "pipelines.cli", *words]
        return subprocess.run(command, stdout=writer, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(writer)


def test_a_reader_that_went_away_ends_the_command_quietly_with_status_141(tmp_path):
    """``timestone ... | head``: the reader closed its end before the command wrote, where the command ended
    in a BrokenPipeError traceback (and Python's 'Exception ignored' at its exit)."""
    done = _to_a_reader_gone("--help")
    assert (done.returncode, done.stderr.decode()) == (141, "")


def test_commands_that_catch_their_own_os_errors_end_with_status_141_when_their_reader_went_away(tmp_path):
    """``timestone pki`` said ``[Errno 32] Broken pipe`` with status 1 (refused, nothing written) after it had
    written the certificate, and ``timestone ota status`` said that reading its tables failed: each caught
    the broken pipe with the file system's errors."""
    ca = tmp_path / "ca"
    assert _to_a_reader_gone("pki", "ca", str(ca)).returncode == 141
    done = _to_a_reader_gone("pki", "issue", "client", "p1", "--ca", str(ca), "--out", str(tmp_path / "p1"))
    assert (done.returncode, done.stderr.decode()) == (141, "")
    assert (tmp_path / "p1.pem").is_file() and (tmp_path / "p1.key").is_file()
    for words in (("pki", "show", str(tmp_path / "p1.pem")), ("pki", "crl", "--ca", str(ca))):
        done = _to_a_reader_gone(*words)
        assert (done.returncode, done.stderr.decode()) == (141, ""), words


def test_the_readmes_command_table_names_every_command_and_subcommand(capsys):
    """README's table of the command line left out ``timestone uplink status``, ``devices register`` and
    ``pki revoke`` / ``crl``: a reader of it did not know they exist."""
    import contextlib
    from pathlib import Path

    from pipelines.cli import COMMANDS

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    table = readme.split("## The command line", 1)[1].split("\n\n", 2)[1]
    missing = []
    for command in COMMANDS:
        rows = [row for row in table.splitlines() if f"`timestone {command}" in row]
        with contextlib.suppress(SystemExit):
            main([command, "--help"])
        usage = capsys.readouterr().out
        verbs = re.search(r"^  \{([\w,-]+)\}", usage, re.M)  # argparse's line of the subcommands
        if not rows:
            missing.append(command)
        for verb in verbs.group(1).split(",") if verbs and command != "pipeline" else []:
            if not any(re.search(rf"[ `/]{verb}\b", row) for row in rows):
                missing.append(f"{command} {verb}")
    assert missing == []


def test_the_readmes_pki_row_gives_each_verb_its_required_options(capsys):
    """README's row said `renew CERT`, which argparse refuses ('the following arguments are required:
    --ca'): each verb shown names every option its usage line requires."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `timestone pki ca DIR`"))
    shown = re.findall(r"`(?:timestone pki )?(\w+)( [^`]*)?`", row.split(" | ")[0])
    missing = []
    for verb, rest in shown:
        usage = help_of(capsys, ["pki", verb]).split("\n\n")[0]
        while re.search(r"\[[^\[\]]*\]", usage):  # the optional parts, innermost brackets first
            usage = re.sub(r"\[[^\[\]]*\]", "", usage)
        missing += [f"{verb} {option}" for option in re.findall(r" (--[\w-]+)", usage) if option not in rest]
    assert len(shown) == 6 and missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["ota", "-c", "CONFIG", "status", "fw-1"],
        ["ota", "status", "fw-1", "-c", "CONFIG"],
        ["devices", "register", "--group", "g", "dev-1", "-c", "CONFIG"],
        ["cluster", "status", "-c", "CONFIG"],
    ],
)
def test_every_config_option_is_also_dash_c(tmp_path, capsys, argv):
    """``timestone broker``, ``pipeline`` and ``tables maintain`` take ``-c FILE``; ``ota``, ``devices
    register`` and ``cluster status`` answered 'unrecognized arguments: -c'."""
    config = tmp_path / "x.yaml"
    config.write_text("nonsense_key: 1\n")
    assert main([part.replace("CONFIG", str(config)) for part in argv]) == 2
    err = capsys.readouterr().err
    assert "nonsense_key: unknown key" in err and f"(in {config}, line 1)" in err, err


def test_a_broken_pipe_is_no_failure_of_the_file_system():
    """``timestone ota status | head``: the commands that say a table store's file system failure in one line
    (a full disk, a read-only directory) let a reader gone away end them with status 141 instead."""
    from pipelines.output_paths import file_system_failure

    assert file_system_failure(BrokenPipeError(32, "Broken pipe")) is None
    assert file_system_failure(OSError(28, "No space left on device")) == "No space left on device"
