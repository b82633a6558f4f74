"""The quickstart's local CA and server certificate: made once, reissued by the same CA when a
name is added or the certificate nears its end, so clients that trust `ca.pem` keep working."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from retrieval_host.serving.tls import RENEW_BEFORE, ensure_local_certificates, server_context
from retrieval_host.settings import SettingsError


def _names(cert_file: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in san}


def test_certificates_are_reused_while_they_name_every_host(tmp_path: Path) -> None:
    first = ensure_local_certificates(tmp_path)
    assert _names(first.cert_file) == {"127.0.0.1", "localhost"}
    ca, server = first.ca_file.read_bytes(), first.cert_file.read_bytes()
    again = ensure_local_certificates(tmp_path, ("localhost",))
    assert (again.ca_file.read_bytes(), again.cert_file.read_bytes()) == (ca, server)


def test_a_new_name_gets_a_new_server_certificate_from_the_same_ca(tmp_path: Path) -> None:
    first = ensure_local_certificates(tmp_path)
    ca = first.ca_file.read_bytes()
    key = first.key_file.read_bytes()
    hosts = ("127.0.0.1", "localhost", "rh.example.test", "10.1.2.3")
    certs = ensure_local_certificates(tmp_path, hosts)
    assert certs.ca_file.read_bytes() == ca  # clients keep trusting the same CA
    assert certs.key_file.read_bytes() != key
    assert _names(certs.cert_file) == {"127.0.0.1", "localhost", "rh.example.test", "10.1.2.3"}
    server = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in san.get_values_for_type(x509.IPAddress)


def test_a_certificate_near_its_end_is_issued_again(tmp_path: Path) -> None:
    first = ensure_local_certificates(tmp_path)
    server = x509.load_pem_x509_certificate(first.cert_file.read_bytes())
    still = server.not_valid_after_utc - RENEW_BEFORE - dt.timedelta(days=1)
    assert ensure_local_certificates(tmp_path, now=still).cert_file.read_bytes() == (
        first.cert_file.read_bytes()
    )
    late = server.not_valid_after_utc - RENEW_BEFORE + dt.timedelta(days=1)
    renewed = ensure_local_certificates(tmp_path, now=late)
    cert = x509.load_pem_x509_certificate(renewed.cert_file.read_bytes())
    assert cert.not_valid_after_utc > server.not_valid_after_utc


def test_a_server_certificate_of_another_ca_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ensure_local_certificates(tmp_path / "a")
    certs = ensure_local_certificates(tmp_path / "b")
    certs.cert_file.write_bytes((tmp_path / "a" / "server.pem").read_bytes())
    fixed = ensure_local_certificates(tmp_path / "b")
    server = x509.load_pem_x509_certificate(fixed.cert_file.read_bytes())
    server.verify_directly_issued_by(x509.load_pem_x509_certificate(fixed.ca_file.read_bytes()))


def test_an_encrypted_key_without_its_password_is_one_settings_error(tmp_path: Path) -> None:
    """OpenSSL prompted for the pass phrase on the terminal (a host waiting forever) or,
    with no terminal, failed with a bare OSError and a traceback."""
    certs = ensure_local_certificates(tmp_path)
    key = serialization.load_pem_private_key(certs.key_file.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    with pytest.raises(SettingsError, match=r"is encrypted: set tls\.keyPassword"):
        server_context(certs.cert_file, encrypted)
    with pytest.raises(SettingsError, match="decrypted with keyPassword") as wrong:
        server_context(certs.cert_file, encrypted, "wrong")
    assert "is tls.keyPassword the key's password?" in str(wrong.value)
    assert isinstance(server_context(certs.cert_file, encrypted, "s3cret"), ssl.SSLContext)
    assert isinstance(server_context(certs.cert_file, certs.key_file), ssl.SSLContext)


def test_a_key_every_user_may_read_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A black-box test: a 0666 key behind a 0777 link started without a word, though the
    # host refuses such modes on every file that grants access.
    certs = ensure_local_certificates(tmp_path)
    with caplog.at_level(logging.WARNING, logger="retrieval_host.serving"):
        server_context(certs.cert_file, certs.key_file)
        assert not caplog.records  # the quickstart's own key is private
        certs.key_file.chmod(0o644)
        server_context(certs.cert_file, certs.key_file)
    assert [r.getMessage() for r in caplog.records] == [
        f"tls.keyFile {certs.key_file} is readable or writable by every user (mode 0644): "
        "chmod 0400 it"
    ]
