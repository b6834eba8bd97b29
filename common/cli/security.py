"""``replog keys new`` and ``replog acl``: CURVE key pairs and the ACL (docs/security.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from common.broker.security import account_doc
from common.cli.output import EXIT_FAILED, EXIT_OK, UsageError, curve_args, emit_json, err, out
from common.client import Admin
from common.core.keys import KeyFileError, fingerprint, load_public, new_key_pair
from common.format.acl import AclError, parse_acl


def cmd_keys(args: argparse.Namespace) -> int:
    """``replog keys new NAME [-d DIR]``: NAME.key (public) and NAME.key_secret (mode 0600)."""
    if args.action != "new":
        raise UsageError("usage: replog keys new NAME [-d DIR]")
    try:
        public_path, secret_path = new_key_pair(args.dir, args.name)
    except (KeyFileError, FileExistsError) as e:
        raise UsageError(str(e)) from None
    public = load_public(public_path).public.decode("ascii")
    doc = {"public": str(public_path), "secret": str(secret_path), "curvePublicKey": public,
           "fingerprint": fingerprint(public)}
    if args.json:
        emit_json(doc)
        return EXIT_OK
    out.print(f"public key file  {public_path}   (give it to peers; a broker's: clients pin it)")
    out.print(f"secret key file  {secret_path}   (mode 0600; keep it here)")
    out.print("an ACL account for it:")
    out.print(f"  - accessKey: {args.name}\n    curvePublicKey: \"{public}\"", markup=False)
    return EXIT_OK


def cmd_acl(args: argparse.Namespace) -> int:
    """``replog acl``: the ACL a broker has in force (admin); ``--check FILE``: parse a file
    here, as a broker would before swapping it in, and show its accounts."""
    if args.check:
        try:
            snapshot = parse_acl(Path(args.check).read_bytes(), args.check)
        except (OSError, AclError) as e:
            err.print(f"replog acl: {e}", soft_wrap=True)
            return EXIT_FAILED
        doc: dict[str, Any] = {"aclFile": args.check, "sha256": snapshot.digest,
                               "accounts": [account_doc(a) for a in snapshot.accounts]}
    else:
        with Admin(args.servers, timeout_ms=args.timeout_ms, **curve_args(args)) as admin:
            doc = admin.acl_info()
    if args.json:
        emit_json(doc)
        return EXIT_OK
    if not doc.get("accounts"):
        out.print("aclEnable is off on that broker: no ACL in force")
        return EXIT_OK
    title = f"ACL {doc.get('aclFile', '')}"
    if "aclVersion" in doc:
        title += f" version {doc['aclVersion']}"
    table = Table(title=title)
    for col in ("accessKey", "key", "gRPC", "admin", "replica", "enabled"):
        table.add_column(col)
    for a in doc["accounts"]:
        table.add_row(a["accessKey"], a["key"], str(a.get("grpc", False)), str(a["admin"]),
                      str(a["replica"]), str(a["enabled"]))
    out.print(table)
    if doc.get("reloadError"):
        err.print(f"the file on disk is refused, this version stays: {doc['reloadError']}",
                  soft_wrap=True)
    return EXIT_OK

