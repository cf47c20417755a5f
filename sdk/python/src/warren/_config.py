"""Where a client finds Warren and its API key.

=========  ===========================================  =========================
setting    from                                         default
=========  ===========================================  =========================
address    ``url=`` argument, then ``WARREN_URL``       ``http://127.0.0.1:7700``
API key    ``api_key=``, then ``WARREN_API_KEY``, then  none
           the file ``$WARREN_DATA_DIR/admin.key``
data dir   ``WARREN_DATA_DIR``                          ``/var/lib/warren``
=========  ===========================================  =========================

``warren up`` writes its admin key to ``<data-dir>/admin.key``, so on the machine that runs it,
as a user who may read that file, no configuration is needed at all.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple
from urllib.parse import urlsplit

from .errors import ArgumentTypeError, InvalidArgument

DEFAULT_URL = "http://127.0.0.1:7700"
DEFAULT_DATA_DIR = "/var/lib/warren"
KEY_FILE = "admin.key"


def _env(name: str) -> Optional[str]:
    v = os.environ.get(name)
    return v.strip() if v and v.strip() else None


def resolve_url(url: Optional[str]) -> str:
    """The base address without a trailing ``/``; ``host:port`` alone means ``http://host:port``."""
    if url is None:
        url = _env("WARREN_URL") or DEFAULT_URL
        source = "WARREN_URL"
    else:
        source = "url"
    if not isinstance(url, str):
        raise ArgumentTypeError(f"url must be a str, not {type(url).__name__}")
    raw = url.strip()
    if "://" not in raw:
        raw = "http://" + raw
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise InvalidArgument(
            f"{source} {url!r} is not an address ({e}): it should look like http://127.0.0.1:7700"
        ) from None
    if parts.scheme not in ("http", "https"):
        raise InvalidArgument(
            f"{source} {url!r} is not an http:// address: it should look like http://127.0.0.1:7700"
        )
    if not parts.hostname:
        raise InvalidArgument(
            f"{source} {url!r} names no host: it should look like http://127.0.0.1:7700"
        )
    if parts.query or parts.fragment:
        raise InvalidArgument(
            f"{source} {url!r} has a query or fragment: give only scheme, host, port and path"
        )
    return raw.rstrip("/")


def resolve_key(api_key: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """The key to send, and when there is none, why (told to the user on a 401)."""
    if api_key is not None:
        if not isinstance(api_key, str):
            raise ArgumentTypeError(f"api_key must be a str, not {type(api_key).__name__}")
        if not api_key.strip():
            return None, "api_key was given empty"
        return api_key.strip(), None
    key = _env("WARREN_API_KEY")
    if key:
        return key, None
    data_dir = _env("WARREN_DATA_DIR") or DEFAULT_DATA_DIR
    path = os.path.join(data_dir, KEY_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None, f"WARREN_API_KEY is not set and {path} does not exist"
    except PermissionError:
        return None, f"WARREN_API_KEY is not set and {path} is not readable by this user"
    except OSError as e:
        return None, f"WARREN_API_KEY is not set and {path} could not be read ({e})"
    if not text:
        return None, f"WARREN_API_KEY is not set and {path} is empty"
    return text, None
