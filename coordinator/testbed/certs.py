"""A throw-away certificate authority for a local ZooKeeper over TLS, made with the ``openssl`` command.

``make_pki(directory, clients=("agent",))`` writes:

* ``ca.pem`` / ``ca.key``: a self-signed CA;
* ``server.pem``: the server's key and certificate in one PEM file (what ZooKeeper's PEM keystore
  reads), valid for ``server_names`` (default ``127.0.0.1`` and ``localhost``);
* ``{name}.crt`` / ``{name}.key`` per client: certificates whose subject is ``/CN={name}/O=coordinator``
  (ZooKeeper's x509 identity, the subject in RFC 2253 order: ``x509:O=coordinator,CN={name}``).

Keys are 2048-bit RSA, valid for ten days: enough for a test run or a demo, never for production.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]

_DAYS = "10"
ORGANISATION = "coordinator"


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_pem(self) -> Path:
        return self.directory / "server.pem"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @staticmethod
    def x509_identity(name: str) -> str:
        """The ACL identity ZooKeeper's x509 provider gives a client holding ``name``'s certificate."""
        return f"x509:O={ORGANISATION},CN={name}"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed to make test certificates: apt-get install openssl")
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()[-500:]}")


def _signed(directory: Path, name: str, subject: str, extensions: str) -> None:
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
             "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", _DAYS, "-sha256", "-extfile", ext.name, "-out", f"{name}.crt", cwd=directory)
    (directory / f"{name}.csr").unlink()
    ext.unlink()


def make_pki(directory: Path, clients: Sequence[str] = ("agent",),
             server_names: Sequence[str] = ("IP:127.0.0.1", "DNS:localhost")) -> Pki:
    """Write a CA, a server key pair for ``server_names`` (subjectAltName entries) and one key pair per
    client name."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", _DAYS, "-subj", f"/CN=coordinator test CA/O={ORGANISATION}", cwd=directory)
    _signed(directory, "server", f"/CN=coordinator test server/O={ORGANISATION}",
            f"subjectAltName={','.join(server_names)}\nextendedKeyUsage=serverAuth\n")
    (directory / "server.pem").write_text((directory / "server.key").read_text()
                                          + (directory / "server.crt").read_text())
    for name in clients:
        _signed(directory, name, f"/CN={name}/O={ORGANISATION}", "extendedKeyUsage=clientAuth\n")
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Pki(directory)
