"""Self-signed certificates for the TLS tests (Debian's ``openssl`` binary).

A certificate made here is its own CA: a client that trusts the certificate file verifies
the server (``sslmode=verify-full``, Flight's root certificates, the JVM reader).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def self_signed(directory: Path, *, common_name: str = "localhost",
                alt_names: str | None = "IP:127.0.0.1") -> tuple[str, str]:  # fmt: skip
    """A fresh RSA certificate and key in ``directory``: (certificate path, key path), the
    key readable by its owner only. ``alt_names`` is the subjectAltName (None: none)."""
    cert, key = str(directory / f"{common_name}.crt"), str(directory / f"{common_name}.key")
    command = ["/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
               "2", "-subj", f"/CN={common_name}", "-keyout", key, "-out", cert]  # fmt: skip
    if alt_names is not None:
        command[-4:-4] = ["-addext", f"subjectAltName={alt_names}"]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    os.chmod(key, 0o600)
    return cert, key
