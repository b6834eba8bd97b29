"""CURVE key files (common/core/keys.py): made 0600 with no umask window, never overwritten,
read back by zmq.auth, and refused when too open, mismatched or not a key."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth

from common.core import keys
from common.core.keys import KeyFileError

pytestmark = pytest.mark.unit


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o077])
def test_new_key_pair_modes_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        public, secret = keys.new_key_pair(tmp_path / "k", "alice")
    finally:
        os.umask(old)
    assert mode(secret) == 0o600
    assert mode(public) == 0o644
    assert mode(tmp_path / "k") == 0o700  # a new directory
    assert public.name == "alice.key" and secret.name == "alice.key_secret"


def test_zmq_auth_reads_our_files_and_the_pair_matches(tmp_path: Path) -> None:
    public_path, secret_path = keys.new_key_pair(tmp_path, "bob")
    pub, sec = zmq.auth.load_certificate(secret_path)
    assert sec is not None and zmq.curve_public(sec) == pub
    assert zmq.auth.load_certificate(public_path) == (pub, None)
    pair = keys.load_secret(secret_path)
    assert (pair.public, pair.secret) == (pub, sec)
    assert keys.load_public(public_path).public == pub
    assert pub in zmq.auth.load_certificates(str(tmp_path))  # a key directory, as czmq's


def test_never_overwrites(tmp_path: Path) -> None:
    _, secret = keys.new_key_pair(tmp_path, "c")
    before = secret.read_bytes()
    with pytest.raises(FileExistsError, match="c.key"):
        keys.new_key_pair(tmp_path, "c")
    assert secret.read_bytes() == before


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a/b", "x" * 129])
def test_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(KeyFileError, match="key name"):
        keys.new_key_pair(tmp_path, name)


def test_a_secret_readable_by_others_is_refused(tmp_path: Path) -> None:
    _, secret = keys.new_key_pair(tmp_path, "d")
    os.chmod(secret, 0o644)
    with pytest.raises(KeyFileError, match="0644 are too open.*chmod 600"):
        keys.load_secret(secret)
    assert keys.load_secret(secret, check_mode=False).secret is not None


def test_public_file_as_secret_and_mismatched_pair_are_refused(tmp_path: Path) -> None:
    public, secret = keys.new_key_pair(tmp_path, "e")
    with pytest.raises(KeyFileError, match="no secret-key"):
        keys.load_secret(public, check_mode=False)
    other_pub, _ = zmq.curve_keypair()
    text = secret.read_text()
    good_pub = keys.load_public(public).public.decode()
    secret.write_text(text.replace(good_pub, other_pub.decode()))
    with pytest.raises(KeyFileError, match="not the public key of its secret-key"):
        keys.load_secret(secret)


@pytest.mark.parametrize("content", [b"", b"curve\n    public-key = \"short\"\n",
                                     b"curve\n    public-key = \"" + b"~" * 40 + b"\"\n",
                                     b"\x00\xff" * 100])
def test_garbage_key_files(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "g.key"
    path.write_bytes(content)
    with pytest.raises(KeyFileError, match=str(path)):
        keys.load_public(path)


def test_missing_and_huge_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="No such file"):
        keys.load_public(tmp_path / "none.key")
    big = tmp_path / "big.key"
    big.write_bytes(b"#" * (keys.MAX_KEY_FILE_BYTES + 1))
    with pytest.raises(KeyFileError, match="far smaller"):
        keys.load_public(big)


def test_client_keys_needs_both_and_maps_addresses(tmp_path: Path) -> None:
    assert keys.client_keys(None, None) is None
    _, me = keys.new_key_pair(tmp_path, "me")
    srv_a, _ = keys.new_key_pair(tmp_path, "a")
    srv_b, _ = keys.new_key_pair(tmp_path, "b")
    with pytest.raises(KeyFileError, match="server_key"):
        keys.client_keys(me, None)
    with pytest.raises(KeyFileError, match="key \\(this client"):
        keys.client_keys(None, srv_a)
    one = keys.client_keys(me, srv_a)
    assert one is not None and one.server_key_for("h:1") == keys.load_public(srv_a).public
    many = keys.client_keys(me, {"h:1": srv_a, "h:2": srv_b})
    assert many is not None and many.server_key_for("h:2") == keys.load_public(srv_b).public
    with pytest.raises(KeyFileError, match="no server key for h:3"):
        many.server_key_for("h:3")


def test_parse_server_keys() -> None:
    assert keys.parse_server_keys("/k/broker.key") == "/k/broker.key"
    assert keys.parse_server_keys("h:1=/a.key,h:2=/b.key") == {"h:1": "/a.key", "h:2": "/b.key"}
    for bad in ("h=/a.key", "h:1=", "h:x=/a.key"):
        with pytest.raises(KeyFileError, match="--server-key"):
            keys.parse_server_keys(bad)


def test_check_public_key() -> None:
    pub, _ = zmq.curve_keypair()
    assert keys.check_public_key(pub.decode(), "k") == pub
    with pytest.raises(KeyFileError, match="k: a CURVE key is 40"):
        keys.check_public_key("abc", "k")
    with pytest.raises(KeyFileError, match="Z85 alphabet"):
        keys.check_public_key("~" * 40, "k")
    assert len(keys.fingerprint(pub)) == 12
