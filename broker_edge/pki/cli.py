"""``timestone pki``: a CA and every certificate a production configuration names (docs/security.md).

timestone pki ca DIR [--name NAME]                       a CA in DIR (ca.pem, ca.key)
timestone pki issue KIND NAME --ca DIR [--dns H] [--ip A] [--out PATH]
timestone pki renew CERT --ca DIR                        the next certificate of one that exists
timestone pki show FILE...                               what a certificate names, until when
timestone pki revoke CERT --ca DIR                       revoke it: DIR/crl.pem written again
timestone pki crl --ca DIR                               DIR/crl.pem written again (none revoked yet)
"""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path

from broker_edge.pki.authority import KINDS, Authority, PemPair, PkiError, describe
from broker_edge.pki.revocation import revoke, revoked_of, write_crl

__all__ = ["pki_main"]

EXIT_STATUS = (
    "exit status: 0 done; 1 refused (no CA in the directory, files that exist, a name or address that is "
    "not one, a CA not valid as long as the certificate, a certificate the CA did not sign or that is a CA: "
    "the message says which); 2 a wrong command line"
)


def _out_path(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("a path is needed (PATH.pem and PATH.key, or a directory)")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timestone pki",
        description="Make a CA and issue the certificates of listeners, cluster members, etcd, uplink hubs "
        "and sites, and devices. New keys are written readable by their owner only (0600); a file replaced "
        "keeps its owner, group and mode, never giving others access to a key.",
        epilog=EXIT_STATUS,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    ca = commands.add_parser("ca", help="make a CA in a directory (ca.pem, ca.key)", epilog=EXIT_STATUS)
    ca.add_argument(
        "directory",
        metavar="DIR",
        help="where the CA is kept (made 0711 unless it exists, its key 0600; never overwritten)",
    )
    ca.add_argument("--name", help="the CA's name (its O=; default: the directory's name)")
    ca.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    ca.add_argument("--key", choices=("ec", "rsa"), default="ec", help="EC P-256 (default) or RSA 3072")

    kinds = "\n".join(f"  {name:<7} {kind.summary}" for name, kind in KINDS.items())
    issue = commands.add_parser(
        "issue",
        help="issue a certificate of one kind, signed by a CA",
        description=f"kinds:\n{kinds}",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    issue.add_argument("kind", choices=list(KINDS), metavar="KIND", help=", ".join(KINDS))
    issue.add_argument("name", metavar="NAME", help="node id, site id, CN (user or host name)")
    issue.add_argument("--ca", required=True, metavar="DIR", help="the CA's directory")
    issue.add_argument("--dns", action="append", default=[], metavar="HOST", help="a host name (repeatable)")
    issue.add_argument("--ip", action="append", default=[], metavar="ADDR", help="an address (repeatable)")
    issue.add_argument(
        "--out",
        type=_out_path,
        metavar="PATH",
        help="write PATH.pem and PATH.key; a directory: KIND-NAME.pem and .key in it (default: in DIR)",
    )
    issue.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    issue.add_argument("--key", choices=("ec", "rsa"), default="ec", help="EC P-256 (default) or RSA 3072")
    issue.add_argument("--force", action="store_true", help="replace files that exist (a new key)")

    renew = commands.add_parser(
        "renew",
        help="issue the next certificate of one that exists: same names and uses, a new key",
        description="Replaces CERT and its key whole; send the broker SIGHUP to serve the new one (clients "
        "that trust the CA accept both).",
        epilog=EXIT_STATUS,
    )
    renew.add_argument("cert", metavar="CERT", help="the certificate (PEM) to renew")
    renew.add_argument("--ca", required=True, metavar="DIR", help="the CA that issued it")
    renew.add_argument("--key-file", metavar="KEY", help="its key (default: CERT with .key for .pem)")
    renew.add_argument("--days", type=int, default=365, help="validity in days (default 365)")

    show = commands.add_parser(
        "show", help="what certificates name, for whom, until when", epilog=EXIT_STATUS
    )
    show.add_argument("files", nargs="+", metavar="FILE", help="PEM files")

    revoke = commands.add_parser(
        "revoke",
        help="revoke a certificate the CA issued: DIR/crl.pem, which listeners check, written again",
        description="Adds CERT to DIR/revoked.json and writes DIR/crl.pem again, signed by the CA and valid "
        "as long as it; listeners whose tls.crlfile names it refuse CERT once they read it (SIGHUP).",
        epilog=EXIT_STATUS,
    )
    revoke.add_argument("cert", metavar="CERT", help="the certificate (PEM) to revoke")
    revoke.add_argument("--ca", required=True, metavar="DIR", help="the CA that issued it")

    crl = commands.add_parser(
        "crl",
        help="write DIR/crl.pem again from the certificates revoked (the first one: none revoked)",
        epilog=EXIT_STATUS,
    )
    crl.add_argument("--ca", required=True, metavar="DIR", help="the CA's directory")
    return parser


def _wrote(pair: PemPair) -> None:
    print(f"wrote {pair.cert} and {pair.key} ({stat.S_IMODE(pair.key.stat().st_mode):04o})")
    for line in describe(pair.cert):
        print(f"  {line}" if line else "")


def pki_main(argv: list[str]) -> int:
    """Entry point of ``timestone pki``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "ca":
            authority = Authority.create(args.directory, args.name, args.days, args.key)
            _wrote(authority.ca)
        elif args.command == "issue":
            pair = Authority(args.ca).issue(
                args.kind,
                args.name,
                dns=args.dns,
                ips=args.ip,
                days=args.days,
                key_type=args.key,
                out=args.out,
                replace=args.force,
            )
            _wrote(pair)
        elif args.command == "renew":
            _wrote(Authority(args.ca).renew(args.cert, args.key_file, args.days))
        elif args.command == "revoke":
            certificate, crl, added = revoke(Authority(args.ca), args.cert)
            subject = certificate.subject.rfc4514_string()
            said = "revoked" if added else "was revoked already"
            print(f"{args.cert} ({subject}, serial {certificate.serial_number:x}) {said}; wrote {crl}")
            print("  send SIGHUP to the brokers whose listeners' tls.crlfile names it")
        elif args.command == "crl":
            authority = Authority(args.ca)
            crl = write_crl(authority)
            print(f"wrote {crl} ({len(revoked_of(authority))} certificates revoked)")
        else:
            for index, path in enumerate(args.files):
                lines = describe(path)  # a file it cannot show is said alone, with no heading
                print(("\n" if index else "") + f"{Path(path)}:")
                for line in lines:
                    print(f"  {line}" if line else "")
    except PkiError as error:
        print(f"timestone pki {args.command}: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of what it says went away: the command's status 141, not 1
        raise
    except OSError as error:
        print(f"timestone pki {args.command}: {error}", file=sys.stderr)
        return 1
    return 0
