"""Certificates and roles: a small test CA, mutual TLS on the API and on P4Runtime, verifier vs operator.

A client's role is the Organizational Unit of its certificate's subject: `verifier` may change the
desired state, `operator` may only read. `dpu-limiter certs init DIR` makes a CA, a server
certificate for the control plane and the DPUs, and one client certificate per role; real
deployments issue them from their own CA with the same OU convention.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("verifier", "operator")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one identity plus the CA that verifies its peers."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) bytes, with a clear error naming a missing file."""
        out = []
        for name, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise ValueError(f"TLS {name} {path}: {exc.strerror}") from None
        return out[0], out[1], out[2]


def _name(cn: str, ou: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    return x509.Name(attrs)


def _write(stem: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    # STEM.key and STEM.pem, appended (not with_suffix: "dpu-a.rack1" must not become "dpu-a.pem").
    key_path, cert_path = stem.parent / f"{stem.name}.key", stem.parent / f"{stem.name}.pem"
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_ca(directory: Path, days: int = 365) -> None:
    """A self-signed CA: DIR/ca.pem and DIR/ca.key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("dpu-limiter test CA"))
        .issuer_name(_name("dpu-limiter test CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write(directory / "ca", key, cert)


def issue(
    directory: Path,
    name: str,
    role: str | None,
    hosts: list[str] | None = None,
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> TlsFiles:
    """Issue DIR/NAME.pem + .key signed by DIR/ca: a server certificate (hosts) or a client one (role)."""
    if role is not None and role not in ROLES:
        raise ValueError(f"role: must be one of {ROLES} (got {role!r})")
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name, role))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
    )
    if hosts:
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    _write(directory / name, key, builder.sign(ca_key, hashes.SHA256()))
    return TlsFiles(directory / "ca.pem", directory / f"{name}.pem", directory / f"{name}.key")


def init(directory: Path, hosts: list[str]) -> dict[str, TlsFiles]:
    """A CA, a server certificate for `hosts`, and a client certificate per role."""
    make_ca(directory)
    out = {"server": issue(directory, "server", None, hosts)}
    for role in ROLES:
        out[role] = issue(directory, role, role)
    return out


def role_of(pem: bytes) -> str | None:
    """The role of a client certificate: its subject's one OU, when that is a role; None for none,
    an unknown one, or more than one OU (OU=[verifier, operator] is ambiguous: refused, not read
    as its first)."""
    cert = x509.load_pem_x509_certificate(pem)
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    value = ous[0].value if len(ous) == 1 else None
    return value if isinstance(value, str) and value in ROLES else None
