"""TLS contexts for listeners (server side) and for tests and tools (client side).

Both refuse protocols older than TLS 1.2. A file problem is a ConfigError whose key names the
listener setting at fault (``tls_cert``, ``tls_key``, ``tls_ca``); router.config adds the
listener index and the config file.
"""

from __future__ import annotations

import ssl

from qrouter.config import ConfigError


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    for name, path in (("tls_cert", cert), ("tls_key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {_describe(exc)}", key=name) from None
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        reason = _describe(exc)
        if "KEY_VALUES_MISMATCH" in reason.upper() or "mismatch" in reason.lower():
            raise ConfigError(f"{key} is not the key of {cert}", key="tls_key") from None
        raise ConfigError(
            f"cannot load certificate {cert} with key {key}: {reason}", key="tls_cert"
        ) from None


def _load_ca(ctx: ssl.SSLContext, ca: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load CA file {ca}: {_describe(exc)}", key="tls_ca") from None


def server_context(
    cert: str, key: str, ca: str | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    """A server context for a listener; client certificates are checked against `ca`.

    With `ca` and not `require_client_cert`, a client certificate is asked for and verified
    when offered, but a client without one is let in.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key)
    if ca is not None:
        _load_ca(ctx, ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    elif require_client_cert:
        raise ConfigError("needs tls_ca to verify client certificates", key="require_client_cert")
    return ctx


def client_context(
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    *,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context: trusts `ca` (else the system CAs), presents `cert`/`key` if given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(ctx, ca)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if (cert is None) != (key is None):
        raise ConfigError("give both a certificate and its key", key="tls_cert")
    if cert is not None and key is not None:
        _load_chain(ctx, cert, key)
    ctx.check_hostname = check_hostname
    if not check_hostname:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
