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

Pinning and the record. Wherever a hub id is accepted, ``NAME@REVISION`` pins it to a commit (or a tag or
branch): :meth:`HubRef.parse` is the one parser, :func:`is_local` says first whether a value is a local path
instead (a path that exists wins, '@' and all). Each loader notes what it loaded (:func:`note_hub`,
:func:`note_local`, :func:`note_url`): for a hub id the repository, the revision asked for and the commit it
resolved to, read from the local cache (:func:`resolved_sha`, offline too). The run directory takes the notes
into the manifest at the end of each stage (:func:`take_sources`). A hub id not pinned to a commit logs one
warning per id and run, with the ``NAME@<sha>`` to paste.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from falcon_cli.errors import FalconError

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
            log.warning(
                "Hugging Face hub %s unreachable (%s): offline mode, models load from the local cache only",
                endpoint,
                reason,
            )
    return not hub_offline()


def hub_hint(source: str) -> str:
    """Why hub id ``source`` could not be fetched, for the end of an error line; empty when the hub answered
    (then the library's own reason, e.g. an unknown id, is the explanation)."""
    endpoint = hub_endpoint()
    reason = _unreachable.get(endpoint)
    if reason is not None:
        return (
            f"the Hugging Face hub {endpoint} is unreachable ({reason}) and '{source}' is not in the local cache: "
            "give a local directory, or fill the cache where the hub is reachable "
            "(HF_HUB_OFFLINE=1 skips this check)"
        )
    if hub_offline():
        return (
            f"HF_HUB_OFFLINE=1 is set and '{source}' is not in the local cache: give a local directory, "
            "or fill the cache where the hub is reachable"
        )
    return ""


# ---------------------------------------------------------------------------------------------
# Revisions: NAME@REVISION, parsed in one place.

PREFIXES = ("timm:", "hf-hub:")
"""Prefixes a hub id may carry (timm's model names, open_clip's hub repositories); :meth:`HubRef.parse` keeps them."""
PATH_STARTS = ("/", "./", "../", "~")
"""How a local path starts; a hub id never does."""
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
"""A full git commit sha: the only revision that cannot move."""
REVISION = re.compile(r"(?!.*\.\.)(?!.*//)[A-Za-z0-9_][A-Za-z0-9._/-]{0,254}(?<![./])")
"""What a revision may look like: a commit sha, a tag or a branch (git's ref names, as the hub takes them)."""


def is_local(text: str) -> bool:
    """Whether ``text`` names a local file or directory rather than a hub id: it exists (a local path wins, '@' and
    all), starts like a path (``/``, ``./``, ``../``, ``~``), or has more than one ``/`` before any ``@`` (a hub id has
    at most one: ``org/name``)."""
    name = text.split("@", 1)[0]
    return (
        Path(text).expanduser().exists()
        or text.startswith(PATH_STARTS)
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


@dataclass(frozen=True)
class HubRef:
    """A hub id with an optional revision: ``org/name@rev`` is repository ``org/name`` at revision ``rev``.

    ``repo`` is the hub repository for transformers ids and open_clip's ``hf-hub:`` names; for a timm name
    (``timm:deit_base_patch16_224.fb_in1k``) or an open_clip pretrained tag (``laion2b_s34b_b79k``) it is that
    name, which the library maps to a hub repository (the revision applies to that repository)."""

    repo: str
    revision: str | None = None
    prefix: str = ""

    @classmethod
    def parse(cls, text: str, what: str = "hub id") -> "HubRef":
        """Split ``[prefix]NAME[@REVISION]``; a malformed revision is a one-line :class:`FalconError` naming ``what``.
        Decide with :func:`is_local` first whether ``text`` is a local path (those are never parsed)."""
        prefix = next((p for p in PREFIXES if text.startswith(p)), "")
        name, at, revision = text[len(prefix) :].partition("@")
        if not at:
            return cls(name, None, prefix)
        if not name:
            raise FalconError(
                f"{what}={text!r}: nothing before '@'; write NAME@REVISION (e.g. bert-base-uncased@<commit sha>)"
            )
        if not REVISION.fullmatch(revision):
            raise FalconError(
                f"{what}={text!r}: {revision!r} after '@' is not a revision; write NAME@REVISION with a commit "
                "sha (40 hex digits, as the hub's file history shows), a tag or a branch (letters, digits, "
                "'.', '_', '-', '/')"
            )
        return cls(name, revision, prefix)

    @property
    def pinned(self) -> bool:
        """Whether the revision is a full commit sha (a tag or a branch can move)."""
        return self.revision is not None and COMMIT_SHA.fullmatch(self.revision) is not None

    def __str__(self) -> str:
        return f"{self.prefix}{self.repo}" + (f"@{self.revision}" if self.revision else "")


def hub_file(ref: HubRef, filename: str) -> str:
    """The local path of ``filename`` of hub repository ``ref.repo`` at ``ref.revision`` (downloaded unless cached)."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id=ref.repo, filename=filename, revision=ref.revision)


def hub_snapshot(ref: HubRef, allow_patterns: list[str]) -> Path:
    """The local snapshot directory of hub repository ``ref.repo`` at ``ref.revision`` holding the files that match
    ``allow_patterns`` (downloaded unless cached); its name is the commit it resolved to."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=ref.repo, revision=ref.revision, allow_patterns=allow_patterns))


def resolved_sha(repo: str, revision: str | None = None) -> str | None:
    """The commit ``revision`` (None: ``main``) of hub repository ``repo`` resolved to, read from the local cache
    (``<HF_HUB_CACHE>/models--org--name/refs/<revision>``, which every download writes; offline too). A full commit
    sha is its own answer; None when the cache does not say."""
    if revision is not None and COMMIT_SHA.fullmatch(revision):
        return revision
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--")) / "refs" / (revision or "main")
    try:
        sha = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return sha if COMMIT_SHA.fullmatch(sha) else None


# ---------------------------------------------------------------------------------------------
# What this process loaded, for the run's manifest.

_sources: list[dict] = []
"""What loaders noted since the last :func:`take_sources`."""
_warned: set[str] = set()
"""Hub ids already warned about as unpinned (one warning per id and run: :func:`forget_sources` clears it)."""


def note_hub(ref: HubRef, what: str, repo: str | None = None) -> dict:
    """Note that hub id ``ref`` was loaded for ``what`` (the config key); ``repo``: the hub repository it came from
    when that is not ``ref.repo`` (a timm name's, an open_clip tag's). Returns the note: ``key``, ``source``,
    ``repo``, ``revision`` (None: none asked for) and ``sha`` (the commit resolved; None: unknown). Logs one warning
    per id and run when it is not pinned to a commit."""
    repo = repo or ref.repo
    sha = resolved_sha(repo, ref.revision)
    entry = {"key": what, "source": str(ref), "repo": repo, "revision": ref.revision, "sha": sha}
    _sources.append(entry)
    if not ref.pinned and str(ref) not in _warned:
        _warned.add(str(ref))
        asked = f"at the movable revision {ref.revision!r}" if ref.revision else "without a revision"
        fix = (
            f"pin it as {ref.prefix}{ref.repo}@{sha}"
            if sha
            else "the local cache does not say which commit it resolved to; "
            f"pin it as {ref.prefix}{ref.repo}@<commit sha>"
        )
        log.warning("%s '%s' loaded %s from %s: %s (docs/pretraining.md, pinning hub ids)", what, ref, asked, repo, fix)
    return entry


def note_local(path: str | os.PathLike, what: str) -> dict:
    """Note that local file or directory ``path`` was loaded for ``what``; the run directory adds its fingerprint."""
    entry = {"key": what, "path": os.path.abspath(Path(path).expanduser())}
    _sources.append(entry)
    return entry


def note_url(source: str, url: str, what: str) -> dict:
    """Note that ``source`` (a timm name, an open_clip tag) was downloaded from ``url``, not the hub (no revision
    there)."""
    entry = {"key": what, "source": source, "url": url}
    _sources.append(entry)
    return entry


def forget_sources() -> None:
    """Start a new record: the notes so far are dropped and every unpinned id will be warned about again."""
    _sources.clear()
    _warned.clear()


def take_sources() -> list[dict]:
    """What was noted since the last call, in order, without repeats; the notes are cleared."""
    taken, seen = [], set()
    for entry in _sources:
        key = tuple(sorted(entry.items()))
        if key not in seen:
            seen.add(key)
            taken.append(dict(entry))
    _sources.clear()
    return taken


__all__ = [
    "COMMIT_SHA",
    "DEFAULT_TIMEOUT_S",
    "HubRef",
    "check_timeout",
    "forget_sources",
    "hub_endpoint",
    "hub_file",
    "hub_hint",
    "hub_offline",
    "hub_snapshot",
    "is_local",
    "note_hub",
    "note_local",
    "note_url",
    "prepare_hub",
    "resolved_sha",
    "take_sources",
]
