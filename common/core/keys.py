"""CURVE key files (``docs/security.md``): zmq.auth's certificate format, made and read safely.

A key pair is two files, as ``zmq.auth.create_certificates`` writes them and
``zmq.auth.load_certificate`` reads them::

    NAME.key          public: ``public-key = "<40 Z85 characters>"``     (mode 0644)
    NAME.key_secret   public and secret key                              (mode 0600)

``new_key_pair`` creates the secret file with mode 0600 in the ``open`` call itself
(``O_CREAT | O_EXCL``, then ``fchmod`` against a restrictive umask), so no other user can read
it in between (``create_certificates`` writes it with the default umask, readable by all, and
overwrites what is there). ``load_secret`` refuses a secret file that group or others may read,
as ssh refuses a private key, and one whose public key is not the secret key's.

``ClientKeys`` is what a connecting socket (a client's DEALER, a slave's HA DEALER) needs: its
own key pair and the server's public key it pins, per server address when each broker has its
own key pair.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.utils import z85

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
Z85_KEY_LENGTH = 40  # a 32-byte Curve25519 key in Z85
MAX_KEY_FILE_BYTES = 64 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_Z85_CHARS = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)
_BANNER = """#   ****  Generated on {now} by replog keys new  ****
#   ZeroMQ CURVE {kind} Certificate (zmq.auth's format)
{warning}
"""
_SECRET_WARNING = "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions (0600)."
_PUBLIC_WARNING = "#   Give this file to the peers that must recognise this key (ACL, server key)."


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file and the reason."""


def check_public_key(text: str | bytes, where: str) -> bytes:
    """A Z85 public key (40 characters of the Z85 alphabet) -> its bytes; KeyFileError naming
    ``where`` otherwise."""
    raw = text.encode("ascii", "replace") if isinstance(text, str) else bytes(text)
    if len(raw) != Z85_KEY_LENGTH:
        raise KeyFileError(f"{where}: a CURVE key is {Z85_KEY_LENGTH} Z85 characters, "
                           f"got {len(raw)}")
    if not _Z85_CHARS.issuperset(raw):
        raise KeyFileError(f"{where}: not a Z85 key (characters outside the Z85 alphabet)")
    try:
        z85.decode(raw)
    except (ValueError, KeyError, OverflowError) as e:  # a group of 5 that overflows 32 bits
        raise KeyFileError(f"{where}: not a Z85 key ({e})") from None
    return raw


def fingerprint(public_key: bytes | str) -> str:
    """A short, stable name for a public key in logs: sha256 of its Z85 text, 12 hex digits."""
    raw = public_key.encode("ascii", "replace") if isinstance(public_key, str) else public_key
    return hashlib.sha256(raw).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A Z85 key pair (``secret`` is None for a public key file)."""

    public: bytes
    secret: bytes | None
    path: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)


def _read_certificate(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise KeyFileError(f"key file {p}: {e.strerror or e}") from None
    if size > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"key file {p}: {size} bytes, a key file is far smaller")
    try:
        public, secret = zmq.auth.load_certificate(p)
    except (OSError, ValueError) as e:
        raise KeyFileError(f"key file {p}: {e}") from None
    return public, secret


def load_public(path: str | os.PathLike[str]) -> KeyPair:
    """The public key of a ``.key`` (or ``.key_secret``) file."""
    public, _ = _read_certificate(path)
    return KeyPair(check_public_key(public, f"key file {path}: public-key"), None, str(path))


def load_secret(path: str | os.PathLike[str], check_mode: bool = True) -> KeyPair:
    """The key pair of a ``.key_secret`` file: refused when group or others may read it
    (``check_mode``), when it holds no secret key, or when its public key is not the secret's."""
    if check_mode:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except OSError as e:
            raise KeyFileError(f"key file {path}: {e.strerror or e}") from None
        if mode & 0o077:
            raise KeyFileError(f"key file {path}: permissions {mode:04o} are too open for a "
                               f"secret key (others may read it); chmod 600 {path}")
    public, secret = _read_certificate(path)
    if secret is None:
        raise KeyFileError(f"key file {path}: no secret-key (is it the public .key file? "
                           f"the secret one ends in {SECRET_SUFFIX})")
    public = check_public_key(public, f"key file {path}: public-key")
    secret = check_public_key(secret, f"key file {path}: secret-key")
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"key file {path}: its public-key is not the public key of its "
                           "secret-key")
    return KeyPair(public, secret, str(path))


def _certificate(kind: str, public: bytes, secret: bytes | None) -> str:
    warning = _SECRET_WARNING if secret is not None else _PUBLIC_WARNING
    text = _BANNER.format(now=datetime.datetime.now().isoformat(timespec="seconds"),
                          kind=kind, warning=warning)
    text += "metadata\ncurve\n"
    text += f'    public-key = "{public.decode("ascii")}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode("ascii")}"\n'
    return text


def new_key_pair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Make ``NAME.key`` and ``NAME.key_secret`` in ``directory`` (created, mode 0700, if
    missing); returns (public path, secret path). Never overwrites: FileExistsError naming the
    file that is there (a secret key replaced by accident cannot be recovered)."""
    if not _NAME.match(name):
        raise KeyFileError(f"key name {name!r}: use letters, digits, '.', '_' and '-' "
                           "(at most 128, not starting with a dot)")
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_path = folder / (name + PUBLIC_SUFFIX)
    secret_path = folder / (name + SECRET_SUFFIX)
    for path in (public_path, secret_path):
        if path.exists():
            raise FileExistsError(f"{path} exists: not overwritten (remove it first)")
    public, secret = zmq.curve_keypair()
    _write_new(secret_path, _certificate("**Secret**", public, secret), 0o600)
    try:
        _write_new(public_path, _certificate("Public", public, None), 0o644)
    except BaseException:
        secret_path.unlink(missing_ok=True)
        raise
    return public_path, secret_path


def _write_new(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits away; never adds any
        data = text.encode("ascii")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- what a connecting socket needs ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ClientKeys:
    """A connecting socket's CURVE settings: its own key pair and the server key it pins
    (``server_key``), or one per server address (``server_keys``: ``host:port`` -> key)."""

    public: bytes
    secret: bytes
    server_key: bytes | None = None
    server_keys: Mapping[str, bytes] = dataclasses.field(default_factory=dict)

    def server_key_for(self, address: str) -> bytes:
        key = self.server_keys.get(address, self.server_key)
        if key is None:
            raise KeyFileError(f"no server key for {address}: give the broker's public key "
                               f"(known for {', '.join(sorted(self.server_keys)) or 'none'})")
        return key

    def apply(self, sock: zmq.Socket[Any], address: str) -> None:
        """Make ``sock`` a CURVE client of the server at ``address`` (before connect)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_key_for(address)


def client_keys(key: str | os.PathLike[str] | None,
                server_key: str | os.PathLike[str] | Mapping[str, Any] | None,
                check_mode: bool = True) -> ClientKeys | None:
    """``key`` (a ``.key_secret`` path) and ``server_key`` (a ``.key`` path, or a mapping of
    ``host:port`` to such paths) -> ClientKeys; None when neither is given (a plain client).
    One without the other is refused: CURVE needs both."""
    if key is None and server_key is None:
        return None
    if key is None or server_key is None:
        missing = "key (this client's .key_secret)" if key is None else \
            "server_key (the broker's public .key)"
        raise KeyFileError(f"CURVE needs both key and server_key: {missing} is missing")
    own = load_secret(key, check_mode)
    assert own.secret is not None
    if isinstance(server_key, Mapping):
        keys = {str(a): load_public(p).public for a, p in server_key.items()}
        return ClientKeys(own.public, own.secret, None, keys)
    return ClientKeys(own.public, own.secret, load_public(server_key).public)


def parse_server_keys(text: str) -> str | dict[str, str]:
    """The CLI's ``--server-key``: ``PATH`` or ``host:port=PATH[,host:port=PATH...]`` (a key
    per broker when each has its own key pair)."""
    if "=" not in text:
        return text
    out: dict[str, str] = {}
    for item in text.split(","):
        address, sep, path = item.strip().partition("=")
        host, colon, port = address.rpartition(":")
        if not sep or not path or not colon or not host or not port.isdigit():
            raise KeyFileError(f"--server-key {text!r}: expected PATH or "
                               "host:port=PATH[,host:port=PATH...]")
        out[address] = path
    return out
