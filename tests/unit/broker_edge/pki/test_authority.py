"""``timestone pki``: the CA on disk, every kind of certificate and what it names, renewals, refusals, and the
command's lines and exit statuses. The certificates are read back by what the broker reads them with
(``member_identity``, ``site_identity``, ``ssl``), not by the code that wrote them."""

from __future__ import annotations

import datetime
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.cluster.links.member_identity import node_of_certificate, node_of_certificate_file
from broker_edge.pki.authority import Authority, PemPair, PkiError, describe
from broker_edge.uplink.site_identity import site_of_certificate
from pipelines.cli import main


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def names(certificate: x509.Certificate) -> list[str]:
    extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [f"{type(name).__name__}:{name.value}" for name in extension]


def uses(certificate: x509.Certificate) -> set[str]:
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    known = {ExtendedKeyUsageOID.SERVER_AUTH: "serves", ExtendedKeyUsageOID.CLIENT_AUTH: "connects"}
    return {known[usage] for usage in usages}


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> tuple[dict, dict]:
    """A TLS handshake in memory; what each side's ``getpeercert()`` then says (``ssl.SSLError`` if the
    certificates do not do)."""
    to_client, to_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    client_side = client.wrap_bio(to_client, to_server, server_hostname=host)
    done = {server_side: False, client_side: False}
    for _ in range(10):
        for side in done:
            if not done[side]:
                try:
                    side.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
    assert all(done.values())
    return server_side.getpeercert() or {}, client_side.getpeercert() or {}


def contexts(authority: Authority, served: PemPair, connecting: PemPair | None = None) -> tuple:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(served.cert), str(served.key))
    client = ssl.create_default_context(cafile=str(authority.ca.cert))
    if connecting is not None:
        server.load_verify_locations(str(authority.ca.cert))
        server.verify_mode = ssl.CERT_REQUIRED
        client.load_cert_chain(str(connecting.cert), str(connecting.key))
    return server, client


def test_a_ca_is_made_once_with_its_key_readable_by_its_owner_only(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "plant-ca", "plant")
    assert mode(tmp_path / "plant-ca") == 0o711  # ca.pem read by path by a service of its own user
    assert mode(authority.ca.key) == 0o600 and mode(authority.ca.cert) == 0o644
    certificate = load(authority.ca.cert)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "plant CA"
    key_before = authority.ca.key.read_bytes()
    (tmp_path / "plant-ca").chmod(0o700)  # the operator's choice, left as it is by a refusal
    with pytest.raises(PkiError, match="already holds a CA"):
        Authority.create(tmp_path / "plant-ca")
    assert authority.ca.key.read_bytes() == key_before and mode(tmp_path / "plant-ca") == 0o700


def test_each_kind_names_what_the_broker_reads_and_may_do_what_it_is_for(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca")
    server = authority.issue("server", "edge-7", dns=["edge-7.plant.example"], ips=["10.0.0.7", "::1"])
    member = authority.issue("member", "b1")
    site = authority.issue("site", "plant-1")
    device = authority.issue("client", "device-1")
    etcd = authority.issue("etcd", "e1", dns=["e1.plant.example"], ips=["10.0.0.5"])

    assert names(load(server.cert)) == [
        "DNSName:edge-7.plant.example",
        "IPAddress:10.0.0.7",
        "IPAddress:::1",
    ]
    assert uses(load(server.cert)) == {"serves"}
    assert node_of_certificate_file(str(member.cert))[0] == "b1"
    assert uses(load(member.cert)) == {"serves", "connects"}
    serving, connecting = contexts(authority, member, member)
    connecting.check_hostname = False  # members are known by their node id, not a host name
    seen_by_server, seen_by_client = handshake(serving, connecting, "b1")
    assert node_of_certificate(seen_by_server) == node_of_certificate(seen_by_client) == "b1"
    hub = authority.issue("server", "hub", dns=["hub"])
    serving, connecting = contexts(authority, hub, site)
    assert site_of_certificate(handshake(serving, connecting, "hub")[0]) == "plant-1"
    assert uses(load(site.cert)) == {"connects"}
    device_subject = load(device.cert).subject
    assert device_subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "device-1"
    assert uses(load(device.cert)) == {"connects"}
    assert uses(load(etcd.cert)) == {"serves", "connects"}
    for pair in (server, member, site, device, etcd):
        assert mode(pair.key) == 0o600
        assert load(pair.cert).issuer == load(authority.ca.cert).subject
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(pair.cert), str(pair.key))  # the key is the certificate's


def test_a_server_certificate_passes_a_clients_host_name_check_for_each_name_it_was_given(
    tmp_path: Path,
) -> None:
    authority = Authority.create(tmp_path / "ca")
    served = authority.issue("server", "broker", dns=["mqtt.plant.example"], ips=["10.0.0.7"])
    for host in ("mqtt.plant.example", "10.0.0.7"):
        server, client = contexts(authority, served)
        assert client.check_hostname
        assert handshake(server, client, host)[1]["subject"] == (
            (("organizationName", "ca"),),
            (("commonName", "broker"),),
        )
    server, client = contexts(authority, served)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(server, client, "other.plant.example")


@pytest.mark.parametrize(
    ("kind", "name", "options", "said"),
    [
        ("server", "broker", {}, "a server certificate names where it is reached: give --dns and/or --ip"),
        ("etcd", "e1", {}, "a etcd certificate names where it is reached"),
        ("server", "broker", {"ips": ["10.0.0.300"]}, "--ip '10.0.0.300': not an IPv4 or IPv6 address"),
        ("member", "b/1", {}, "'b/1': a name is one word without '/'"),
        ("member", "-b1", {}, "'-b1' is not a node id"),
        ("site", "plant 1", {}, "'plant 1': a name is one word"),
        ("gateway", "g1", {}, "unknown kind 'gateway': one of server, member, site, client, etcd"),
        ("client", "device-1", {"days": 0}, "--days must be within [1, 36500], got 0"),
    ],
)
def test_what_cannot_be_issued_is_refused_naming_why(
    tmp_path: Path, kind: str, name: str, options: dict, said: str
) -> None:
    authority = Authority.create(tmp_path / "ca")
    with pytest.raises(PkiError) as refused:
        authority.issue(kind, name, **options)
    assert said in str(refused.value)
    assert sorted(path.name for path in (tmp_path / "ca").iterdir()) == ["ca.key", "ca.pem"]


def test_an_issued_certificate_is_not_overwritten_unless_asked(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca")
    first = authority.issue("member", "b1", out=tmp_path / "tls" / "member")
    assert (first.cert, first.key) == (tmp_path / "tls" / "member.pem", tmp_path / "tls" / "member.key")
    with pytest.raises(PkiError, match="exists: renew it"):
        authority.issue("member", "b1", out=tmp_path / "tls" / "member")
    again = authority.issue("member", "b1", out=tmp_path / "tls" / "member.pem", replace=True)
    assert again == first and load(again.cert).serial_number != 0


def test_renew_issues_the_next_certificate_with_the_same_names_and_a_new_key(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca")
    pair = authority.issue("server", "broker", dns=["mqtt.plant.example"], ips=["10.0.0.7"], days=30)
    before = load(pair.cert)
    key_before = pair.key.read_bytes()
    renewed = authority.renew(pair.cert, days=400)
    after = load(renewed.cert)
    assert renewed == pair
    assert after.subject == before.subject and names(after) == names(before) and uses(after) == uses(before)
    assert after.serial_number != before.serial_number and pair.key.read_bytes() != key_before
    assert after.not_valid_after_utc > before.not_valid_after_utc
    assert mode(pair.key) == 0o600
    other = Authority.create(tmp_path / "other")
    with pytest.raises(PkiError, match="was not issued by the CA in"):
        other.renew(pair.cert)


def test_the_command_issues_shows_and_refuses_with_exit_statuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = str(tmp_path / "sites-ca")
    assert main(["pki", "ca", ca, "--name", "plant sites"]) == 0
    assert main(["pki", "issue", "site", "plant-1", "--ca", ca, "--out", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'site.pem'} and {tmp_path / 'site.key'} (0600)" in out
    assert "names:    URI:timestone://site/plant-1" in out and "site:     plant-1 (uplink.site_id)" in out
    assert main(["pki", "show", str(tmp_path / "site.pem")]) == 0
    assert "subject:  CN=plant-1,O=plant sites" in capsys.readouterr().out
    assert main(["pki", "issue", "site", "plant-1", "--ca", ca, "--out", str(tmp_path / "site")]) == 1
    assert "exists: renew it (timestone pki renew) or pass --force" in capsys.readouterr().err
    assert main(["pki", "issue", "member", "b1", "--ca", str(tmp_path / "nowhere")]) == 1
    assert f"no CA in {tmp_path / 'nowhere'} (ca.pem and ca.key)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["pki", "issue", "member", "b1"])
    assert usage.value.code == 2


def test_show_reads_a_crl_and_says_what_a_file_that_is_no_certificate_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``pki show DIR/crl.pem`` (is the stolen key's certificate in the CRL yet?) and ``pki show KEY`` said
    ``no PEM certificate (Unable to load PEM file. See https://cryptography.io/... MalformedFraming)``."""
    ca = tmp_path / "ca"
    assert main(["pki", "ca", str(ca), "--name", "plant"]) == 0
    assert main(["pki", "issue", "client", "dev-1", "--ca", str(ca), "--out", str(tmp_path / "dev-1")]) == 0
    assert main(["pki", "revoke", str(tmp_path / "dev-1.pem"), "--ca", str(ca)]) == 0
    capsys.readouterr()
    assert main(["pki", "show", str(ca / "crl.pem")]) == 0
    serial = f"{load(tmp_path / 'dev-1.pem').serial_number:x}"
    shown = capsys.readouterr().out.splitlines()
    assert shown[1:3] == ["  CRL of:   CN=plant CA,O=plant", f"  revoked:  1 certificate: serial {serial}"]
    assert shown[3].startswith("  updated:  ") and shown[4].startswith("  valid:    until ")
    (tmp_path / "notes.txt").write_text("not PEM\n")
    for name, what in [
        ("dev-1.key", "a private key, not a certificate"),
        ("notes.txt", "no PEM certificate"),
    ]:
        assert main(["pki", "show", str(tmp_path / name)]) == 1
        assert capsys.readouterr().err == f"timestone pki show: {tmp_path / name}: {what}\n"


def test_show_says_a_certificate_has_expired_is_not_valid_yet_or_has_hours_left(tmp_path: Path) -> None:
    """``timestone pki show`` is what an operator asks whether a certificate still holds: an expired one
    said "(-2 days left)" a day after it expired, one expiring within the day "(0 days left)"."""
    authority = Authority.create(tmp_path / "ca", "plant")
    cert = authority.issue("client", "meter-1", days=30).cert
    issued = load(cert)
    after = issued.not_valid_after_utc

    def valid_line(now: datetime.datetime) -> str:
        (line,) = [line for line in describe(cert, now) if line.startswith("valid:")]
        return line

    stamp = f"{after:%Y-%m-%d %H:%M} UTC"
    assert (
        valid_line(after - datetime.timedelta(days=10, hours=1)) == f"valid:    until {stamp} (10 days left)"
    )
    assert (
        valid_line(after - datetime.timedelta(hours=5, minutes=10))
        == f"valid:    until {stamp} (5 hours left)"
    )
    assert (
        valid_line(after + datetime.timedelta(days=1, hours=2))
        == f"valid:    until {stamp} (expired 1 day ago)"
    )
    assert (
        valid_line(after + datetime.timedelta(minutes=20))
        == f"valid:    until {stamp} (expired less than an hour ago)"
    )
    before = issued.not_valid_before_utc
    assert valid_line(before - datetime.timedelta(hours=3)) == (
        f"valid:    from {before:%Y-%m-%d %H:%M} UTC until {stamp} (not valid yet: the clock is behind, or it"
        " was issued for later)"
    )
