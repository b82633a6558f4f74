"""TLS for the host: the server context (TLS 1.2 minimum) and the quickstart's local CA.

The server context is built here rather than from uvicorn's `ssl_version`/`ssl_ciphers`
options so the policy is explicit and testable: TLS 1.2 or 1.3 only, forward-secret AEAD
suites for TLS 1.2, no compression, no renegotiation, HTTP/1.1 over ALPN.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from retrieval_host.settings import SettingsError

TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"
_log = logging.getLogger("retrieval_host.serving")


def warn_if_exposed(field: str, path: Path) -> None:
    """Log a secret file (the TLS key, a `{"file": ...}` secret) every user may read or
    write (deploy/README: 0400 for the host's user). Group bits are left alone: a Kubernetes
    Secret mounted for the pod's fsGroup reads 0440. A file that cannot be stat'ed is left to
    its reader, which names the field."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o007:
        _log.warning(
            "%s %s is readable or writable by every user (mode %04o): chmod 0400 it",
            field,
            path,
            mode,
        )


def server_context(
    cert_file: Path, key_file: Path, password: str | None = None, *, warn: bool = True
) -> ssl.SSLContext:
    """The host's TLS server context: TLS 1.2 minimum, AEAD suites, ALPN http/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    if hasattr(ssl, "OP_NO_RENEGOTIATION"):
        context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["http/1.1"])
    for name, path in (("certFile", cert_file), ("keyFile", key_file)):
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise SettingsError(f"tls.{name}: cannot read {path}: {exc.strerror}") from None
    if warn:
        warn_if_exposed("tls.keyFile", key_file)

    def no_password() -> str:
        # Called only for an encrypted key: without it OpenSSL prompted on the terminal (a
        # host waiting for a typist forever) or, with none, failed with a bare OSError.
        raise SettingsError(f"tls.keyFile: {key_file} is encrypted: set tls.keyPassword")

    try:
        context.load_cert_chain(
            str(cert_file),
            str(key_file),
            password=password if password is not None else no_password,
        )
    except ssl.SSLError as exc:
        # A wrong password reads as OpenSSL's "PEM lib" (a black-box test): say it may be.
        maybe = "; is tls.keyPassword the key's password?" if password is not None else ""
        raise SettingsError(
            f"tls: {cert_file} and {key_file} are not a PEM certificate chain and its private "
            f"key{' (decrypted with keyPassword)' if password is not None else ''}: "
            f"{exc.reason or exc}{maybe}"
        ) from None
    return context


@dataclass(frozen=True, slots=True)
class LocalCertificates:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _write_private(path: Path, data: bytes) -> None:
    # Created with 0600 from the start: never briefly readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


DEFAULT_HOSTS: Final = ("127.0.0.1", "localhost")
# A server certificate this close to its end is issued again at the next start.
RENEW_BEFORE: Final = dt.timedelta(days=30)


def ensure_local_certificates(
    state_dir: Path,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    *,
    now: dt.datetime | None = None,
) -> LocalCertificates:
    """A local CA (`ca.pem`) and a server certificate it signed for `hosts`, kept in `state_dir`.

    The CA is made once and reused, so clients that trust `ca.pem` keep working across
    restarts; its key stays in the state directory (0600) and signs nothing else. The server
    certificate is reused while it names every one of `hosts` and has more than
    `RENEW_BEFORE` to run; otherwise the same CA issues a new one (a name added later, an
    expiry), and clients need not change anything.
    """
    now = dt.datetime.now(dt.UTC) if now is None else now
    certs = LocalCertificates(
        ca_file=state_dir / "ca.pem",
        cert_file=state_dir / "server.pem",
        key_file=state_dir / "server-key.pem",
    )
    ca_key_file = state_dir / "ca-key.pem"
    if certs.ca_file.exists() and ca_key_file.exists():
        ca_cert = x509.load_pem_x509_certificate(certs.ca_file.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{ca_key_file} is not the quickstart CA's EC key")
        ca_key = loaded
    else:
        ca_key, ca_cert = _new_ca(now)
        _write_private(ca_key_file, _key_pem(ca_key))
        certs.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    if not _serves(certs, ca_cert, hosts, now):
        server_key, server_cert = _server_certificate(ca_key, ca_cert, hosts, now)
        _write_private(certs.key_file, _key_pem(server_key))
        certs.cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return certs


def _serves(
    certs: LocalCertificates, ca_cert: x509.Certificate, hosts: tuple[str, ...], now: dt.datetime
) -> bool:
    """Does the stored server certificate come from this CA, name every host and run long
    enough?"""
    if not (certs.cert_file.exists() and certs.key_file.exists()):
        return False
    cert = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return False
    named = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(_general_names(hosts)) <= set(named)


def _general_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _new_ca(now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "retrieval-host quickstart"),
            x509.NameAttribute(NameOID.COMMON_NAME, "retrieval-host local CA"),
        ]
    )
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


def _server_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: tuple[str, ...],
    now: dt.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        # Under 398 days: the longest validity current clients accept for a server cert.
        .not_valid_after(now + dt.timedelta(days=397))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return server_key, server_cert
