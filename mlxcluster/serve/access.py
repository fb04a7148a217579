"""Who may use the served model: the API key.

mlx_lm.server has none; serve's front asks for one when given (``--api-key``,
``--api-key-file``, ``$MLXCLUSTER_API_KEY``): every request but ``/health``
carries ``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key:
KEY`` (Anthropic's), else 401. A front any other machine can reach
(``--bind`` other than loopback) without a key is refused unless the user
says ``--no-auth``: whoever reaches it could use the model.
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path
from urllib.parse import parse_qsl

from mlxcluster.errors import InputError
from mlxcluster.serve.status import PATHS as PAGE_PATHS  # opened in a browser: ?key=KEY

KEY_ENV = "MLXCLUSTER_API_KEY"

# Asked by load balancers and watchdogs that hold no key; it says nothing of the model.
OPEN_PATHS = ("/health",)


class ApiKey:
    """The key every request but ``OPEN_PATHS`` must carry (None: no key asked),
    compared in constant time; it is kept here only, never written out."""

    def __init__(self, key: str | None = None):
        self._key = key.encode() if key else None

    @property
    def required(self) -> bool:
        return self._key is not None

    def admits(self, path: str, headers) -> bool:
        route, _, query = path.partition("?")
        if self._key is None or route in OPEN_PATHS:
            return True
        given = headers.get("x-api-key") or ""
        if route in PAGE_PATHS:  # a browser sends no header: the page's own URL may carry it
            given = given or next((v for k, v in parse_qsl(query) if k == "key"), "")
        bearer = headers.get("Authorization") or ""
        if bearer[:7].lower() == "bearer ":
            given = given or bearer[7:].strip()
        return hmac.compare_digest(given.encode(), self._key)

    def __repr__(self) -> str:
        return f"ApiKey(required={self.required})"  # never the key


def api_key_from(given: str | None, file: str | None, env: dict[str, str]) -> str | None:
    """The key: ``given`` (--api-key), else ``file``'s first line (--api-key-file),
    else ``$MLXCLUSTER_API_KEY``; None when none is set. Two ways at once, or
    an empty key, is an ``InputError``."""
    if given is not None and file is not None:
        raise InputError("--api-key and --api-key-file both give a key", "give one")
    if file is not None:
        try:
            text = Path(file).expanduser().read_text()
        except OSError as err:
            raise InputError(f"cannot read --api-key-file {file}: {err.strerror}",
                             "give a file holding the key on its first line") from None
        given = text.strip().splitlines()[0] if text.strip() else ""
    if given is None:
        given = env.get(KEY_ENV)
    if given is not None and not given.strip():
        raise InputError("the API key is empty", f"give a key (--api-key-file FILE or ${KEY_ENV})")
    return given.strip() if given else None


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def check_exposure(bind: str, key: str | None, no_auth: bool) -> None:
    """``InputError`` (exit 2) for a front other machines can reach with no key."""
    if key is None and not no_auth and not is_loopback(bind):
        raise InputError(f"--bind {bind} lets other machines reach the model, and no API key is "
                         "set: anyone who reaches it could use it",
                         f"give a key (--api-key-file FILE, or ${KEY_ENV}), or say --no-auth")
