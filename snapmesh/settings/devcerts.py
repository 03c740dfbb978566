"""Dev certificates made with `cryptography`: a self-signed CA and the certificates it signs.

What `snapmesh certs` and `security.write_certs` write: one certificate per
process, usable as server and client (mutual TLS), its subjectAltName the
process's name and host (and localhost, 127.0.0.1, ::1 for all but the client).
`cryptography` is imported inside each function, so a plaintext process never loads it.
"""

from __future__ import annotations

import datetime
import ipaddress

from snapmesh.settings.config import CLIENT_NAME

CERT_DAYS = 365


def _subject_alt_names(name: str, host: str | None):
    from cryptography import x509

    entries: list[x509.GeneralName] = [x509.DNSName(name)]
    hosts = [host] if host else []
    if name != CLIENT_NAME:
        hosts += ["localhost", "127.0.0.1", "::1"]
    for entry in dict.fromkeys(hosts):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            if entry != name:
                entries.append(x509.DNSName(entry))
    return x509.SubjectAlternativeName(entries)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_ca(common_name: str = "snapmesh dev CA"):
    """(key, certificate) of a new self-signed CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(ca_key, ca_cert, name: str, host: str | None = None) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `name`, signed by the CA; usable as server and client."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_subject_alt_names(name, host), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem(key)
