"""Secrets out of everything printed or stored: credentials in URLs, token-like values, argv.

Applied where text enters a record, a report or a message (the run's argv, re-run commands, hub
errors), never in each writer: what a writer gets is already safe to store. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MASK", "redact", "redact_argv", "redact_data"]

#: What a secret becomes.
MASK = "***"

# A name is secret when its last word (after -, _ or .) is one of these: `token`, `hf_token`,
# `access_token`, `api-key`, `X-Amz-Signature`... but never `tokens` (`--mlx-kl-tokens=256`).
_WORDS = r"(?:token|key|apikey|password|passwd|pwd|secret|sig|signature|credential|credentials|auth)"
_NAME = rf"(?:[A-Za-z0-9]+[-_.])*{_WORDS}"

# `scheme://userinfo@`: the userinfo runs to the last '@' before the host's end (a password may hold '@').
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")
# `Authorization: Bearer x`, `'authorization': 'Basic x'` (a headers dict's repr), `authorization=x`.
_AUTHORIZATION = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)((?:bearer|basic|token|digest)\s+)?"
    r"[^\s,;'\"]+"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/-]+=*")
# `name=value` with a secret name: query parameters (`?token=…&sig=…`), `--api-key=…`, `HF_TOKEN=…`.
_PARAM = re.compile(rf"(?i)(?<![A-Za-z0-9])({_NAME})=[^\s&#;,'\"<>]+")
_HF_TOKEN = re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}")
# An argv flag whose next argument is its secret value: `--token X`, `--hf-token X`, `--password X`.
_SECRET_FLAG = re.compile(rf"(?i)--?{_NAME}")
_SECRET_KEY = re.compile(rf"(?i){_NAME}")


def redact(text: str) -> str:
    """`text` with every secret it holds replaced by `***`; text without one comes back unchanged.

    Userinfo in any URL (`https://user:pass@host` → `https://***@host`), values of secret-named
    parameters (`?token=`, `access_token`, `key`, `api_key`, `password`, `secret`, `sig`, `signature`…),
    Hugging Face tokens (`hf_…` → `hf_***`) and `Authorization:`/`Bearer` credentials. Idempotent.
    """
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{MASK}", text)
    text = _BEARER.sub(rf"\1 {MASK}", text)
    text = _PARAM.sub(rf"\1={MASK}", text)
    return _HF_TOKEN.sub(f"hf_{MASK}", text)


def redact_argv(argv: Sequence[object]) -> list[str]:
    """A command line fit to store: each argument redacted, and the value after a secret-named flag
    (`--token X`) masked. One argument out for each in, so positions still pair flags with values."""
    out: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
            hide_next = False
            continue
        out.append(redact(arg))
        hide_next = _SECRET_FLAG.fullmatch(arg) is not None
    return out


def redact_data(value: Any) -> Any:
    """JSON-able data with every string redacted, and the value of a secret-named key masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            k: MASK if isinstance(k, str) and _SECRET_KEY.fullmatch(k) and v not in (None, "") else redact_data(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value
