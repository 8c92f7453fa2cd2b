"""Hugging Face hub ids on machines that may not reach the hub: one check in seconds, then offline.

transformers, huggingface_hub, timm and open_clip retry an unreachable hub for minutes before
they give up (measured without this check: 25 s for BERT weights, 47 s for timm and for open_clip,
142 s for the BLIP judge, 212 s for a tokenizer). Every place that resolves a hub id calls
:func:`prepare_hub` first. It sends one short HTTP request to the hub endpoint (``HF_ENDPOINT``,
default ``https://huggingface.co``; proxy variables honoured as the libraries honour them),
once per process:

* any HTTP answer: nothing changes, the libraries download as usual;
* no answer within :func:`check_timeout` seconds (no route, refused, DNS failure): the process
  switches to offline mode, exactly as ``HF_HUB_OFFLINE=1`` would, so a model already in the
  local cache loads at once and one that is not fails at once; :func:`hub_hint` then says why,
  for the end of the caller's one-line error.

With ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) set, nothing is checked.
``FALCON_HUB_TIMEOUT`` (seconds, default 5) bounds the check.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("falcon")

DEFAULT_TIMEOUT_S = 5.0
"""How long the reachability check waits for the hub's answer unless ``FALCON_HUB_TIMEOUT`` says otherwise."""

_unreachable: dict[str, str | None] = {}
"""Endpoint -> why it could not be reached (None: it answered); one check per endpoint and process."""


def hub_endpoint() -> str:
    """The hub endpoint the libraries use (``HF_ENDPOINT`` as read by huggingface_hub, default https://huggingface.co)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_offline() -> bool:
    """Whether this process is in the hub's offline mode (``HF_HUB_OFFLINE=1``, or switched by :func:`prepare_hub`)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def check_timeout() -> float:
    """Seconds the reachability check waits: ``FALCON_HUB_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`."""
    text = os.environ.get("FALCON_HUB_TIMEOUT", "")
    try:
        value = float(text) if text.strip() else DEFAULT_TIMEOUT_S
    except ValueError:
        value = DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def _probe(url: str, timeout: float) -> str | None:
    """None when ``url`` answers an HTTP HEAD request within ``timeout`` seconds (any status), else why not."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:  # the server answered (404, 401, ...): reachable
        return None
    except (OSError, ValueError) as exc:  # URLError (refused, DNS, no route), timeouts, a malformed endpoint
        reason = getattr(exc, "reason", None) or exc
        text = str(reason).strip() or type(reason).__name__
        return f"no answer in {timeout:g} s" if "timed out" in text.lower() else text


def _go_offline() -> None:
    """Offline mode for this process and its children, as ``HF_HUB_OFFLINE=1`` at start-up would give.

    huggingface_hub reads the flag at import; transformers, timm and open_clip ask huggingface_hub
    at call time, so setting the module constant switches all of them.
    """
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True


def prepare_hub() -> bool:
    """Call right before a hub id is resolved; True when downloads may be tried, False when offline (cache only).

    Unless already offline, checks once per process that the endpoint answers (see the module
    docstring) and, when it does not, switches the process to offline mode and logs one warning.
    """
    if hub_offline():
        return False
    endpoint = hub_endpoint()
    if endpoint not in _unreachable:
        _unreachable[endpoint] = reason = _probe(endpoint, check_timeout())
        if reason is not None:
            _go_offline()
            log.warning("Hugging Face hub %s unreachable (%s): offline mode, models load from the local cache only",
                        endpoint, reason)
    return not hub_offline()


def hub_hint(source: str) -> str:
    """Why hub id ``source`` could not be fetched, for the end of an error line; empty when the hub answered
    (then the library's own reason, e.g. an unknown id, is the explanation)."""
    endpoint = hub_endpoint()
    reason = _unreachable.get(endpoint)
    if reason is not None:
        return (f"the Hugging Face hub {endpoint} is unreachable ({reason}) and '{source}' is not in the local cache: "
                "give a local directory, or fill the cache where the hub is reachable "
                "(HF_HUB_OFFLINE=1 skips this check)")
    if hub_offline():
        return (f"HF_HUB_OFFLINE=1 is set and '{source}' is not in the local cache: give a local directory, "
                "or fill the cache where the hub is reachable")
    return ""


__all__ = ["DEFAULT_TIMEOUT_S", "check_timeout", "hub_endpoint", "hub_hint", "hub_offline", "prepare_hub"]
