"""Models named by Hugging Face id or URL, resolved to a local GGUF path.

    ORG/REPO:QUANT          the repo's GGUF of that quant type (llama.cpp's -hf form; Q4_K_M if left out)
    ORG/REPO/PATH.gguf      a file of the repo (subfolders allowed)
    https://...             a plain URL; one on the Hub ({endpoint}/ORG/REPO/resolve/REV/PATH) is a Hub file

Hub files go through huggingface_hub, imported only when one is fetched (the browser host has
none): its cache, shared with transformers and the other tools that use it, so a file one of
them fetched is not fetched again; its HF_ENDPOINT, HF_HOME, HF_TOKEN and HF_HUB_OFFLINE; its
progress bar, and its resumption of a download cut mid-way. Written here is what
huggingface_hub 2.4.0 does not do: choosing a file by its quant type from the repo's listing;
finding every part of a split model (PREFIX-00001-of-0000N.gguf); and checking a fresh download
against the sha256 the Hub lists for an LFS file (huggingface_hub checks only its size),
deleting it if it differs. Without a network (HF_HUB_OFFLINE=1, or the Hub unreachable) the
listing is the cached snapshot's.

The page (web/) picks a Hub file by the same rules (`hub_name`, `choose`), from the listing it
fetches itself through the Hub's HTTP API.

Plain URLs are kept in cera's own cache (catalogue.cache_dir()/urls), not the Hub's: the Hub
cache is laid out by repo and commit, which a URL has neither of (scan_cache_dir reports
other folders there as corrupt). The download goes to a `.partial` file that a later run
resumes with an HTTP Range; a completed file is used as is, without asking the server again.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from cera.errors import BadFile, ModelNotFound
from cera.gguf_file import SPLIT_NAME

DEFAULT_QUANT = "Q4_K_M"
_NAME = r"[A-Za-z0-9][\w.-]*"   # an org or repo name
_REPO_QUANT = re.compile(rf"(?P<repo>{_NAME}/{_NAME})(?::(?P<quant>[\w.-]+))?")
_REPO_FILE = re.compile(rf"(?P<repo>{_NAME}/{_NAME})/(?P<file>[^:]+\.gguf)", re.IGNORECASE)
_HUB_URL = re.compile(rf"(?P<repo>{_NAME}/{_NAME})/(?:resolve|blob)/(?P<revision>[^/]+)/(?P<file>[^?#]+)")
# a quant type in a file name, for telling which ones a repo has
_QUANT = re.compile(r"(?<![A-Za-z0-9])((?:I|T)?Q\d+(?:_[A-Z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
                    re.IGNORECASE)


@dataclass(frozen=True)
class HubName:
    """A GGUF on the Hub: by quant type (file None) or by file."""
    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str | None = None   # None: main

    def __str__(self) -> str:
        return f"{self.repo}/{self.file}" if self.file else f"{self.repo}:{self.quant or DEFAULT_QUANT}"


def hub_name(model: str) -> HubName | None:
    """`model` as a Hub id (ORG/REPO[:QUANT] or ORG/REPO/PATH.gguf), or None. ORG/NAME.gguf is
    a local path's form, not a repo's."""
    if m := _REPO_FILE.fullmatch(model):
        return HubName(m["repo"], file=m["file"])
    if (m := _REPO_QUANT.fullmatch(model)) and not m["repo"].lower().endswith(".gguf"):
        return HubName(m["repo"], quant=m["quant"])
    return None


def is_url(model: str) -> bool:
    return model.lower().startswith(("https://", "http://"))


def is_remote(model: str) -> bool:
    """Whether `model` is a URL or a Hugging Face id."""
    return is_url(model) or hub_name(model) is not None


def fetch(model: str, url_cache: Path) -> Path:
    """The local path of the GGUF `model` names (is_remote), downloaded on first use; for a
    split model, its first part's, the other parts next to it."""
    if not is_url(model):
        return _fetch_hub(hub_name(model))
    endpoint = _huggingface_hub().constants.ENDPOINT.rstrip("/") + "/"
    if model.startswith(endpoint) and (m := _HUB_URL.fullmatch(model[len(endpoint):])):
        return _fetch_hub(HubName(m["repo"], file=unquote(m["file"]), revision=unquote(m["revision"])))
    return fetch_url(model, url_cache)


def _huggingface_hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants   # a submodule, not loaded with the package
    except ImportError:
        raise ModelNotFound("models named by URL or Hugging Face id need the huggingface_hub package: "
                            "pip install 'cera[native]'") from None
    return huggingface_hub


# --- the Hub ------------------------------------------------------------------------------
def choose(name: HubName, files, endpoint: str) -> list[str]:
    """The files of the model `name` names in its repo, listed as `files` (paths): the file it
    names, or the first GGUF whose path carries its quant type (a split one's first part); for
    a split model every part. The page picks by these rules too (web/cera_web/session.py), from the
    listing it fetched from `endpoint`."""
    parts = _parts(name.file or _pick(name, files, endpoint))
    if missing := [p for p in parts if p not in files]:
        raise ModelNotFound(f"{name.repo} has no {', '.join(missing)}{_where(name, endpoint)}")
    return parts


def _fetch_hub(name: HubName) -> Path:
    files = _listing(name)
    parts = choose(name, files, _huggingface_hub().constants.ENDPOINT)
    return [_download(name, part, files[part]) for part in parts][0]


def _listing(name: HubName) -> dict[str, str | None]:
    """The repo's files: path -> the sha256 the Hub lists for an LFS file (else None). Offline,
    or with the Hub unreachable, the cached snapshot's files (sha256 None: checked when fetched)."""
    hf = _huggingface_hub()
    import httpx2   # huggingface_hub's HTTP client: its network errors
    from huggingface_hub.errors import (HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    try:
        return {f.path: f.lfs.sha256 if f.lfs else None
                for f in hf.HfApi().list_repo_tree(name.repo, recursive=True, revision=name.revision)
                if isinstance(f, hf.RepoFile)}
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise _not_found(name, err) from None
    except (OfflineModeIsEnabled, HfHubHTTPError, httpx2.TransportError) as err:
        unreachable = err
    revision = name.revision or "main"
    try:
        repos = hf.scan_cache_dir().repos
    except hf.CacheNotFound:
        repos = ()
    for repo in repos:
        if repo.repo_id == name.repo and repo.repo_type == "model":
            for rev in repo.revisions:
                if revision in rev.refs or rev.commit_hash == revision:
                    return {f.file_path.relative_to(rev.snapshot_path).as_posix(): None for f in rev.files}
    why = "" if isinstance(unreachable, OfflineModeIsEnabled) else f" ({type(unreachable).__name__}: {unreachable})"
    raise ModelNotFound(f"{name}: not in the Hugging Face cache ({hf.constants.HF_HUB_CACHE}), and the Hub "
                        f"{_reach(hf)}{why}")


def _pick(name: HubName, files, endpoint: str) -> str:
    """The first GGUF (the first part of a split one) whose path carries the quant type."""
    firsts = sorted(p for p in files if p.lower().endswith(".gguf") and "mmproj" not in p.lower()
                    and (not (m := SPLIT_NAME.fullmatch(posixpath.basename(p))) or int(m["no"]) == 1))
    quant = name.quant or DEFAULT_QUANT
    carries = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])", re.IGNORECASE)
    if chosen := [p for p in firsts if carries.search(p)]:
        return chosen[0]
    if not firsts:
        raise ModelNotFound(f"{name.repo} has no GGUF files{_where(name, endpoint)}")
    quants = sorted({q[-1].upper() for p in firsts if (q := _QUANT.findall(posixpath.basename(p)))})
    have = f"its quant types: {', '.join(quants)}" if quants else f"its GGUF files: {', '.join(firsts)}"
    raise ModelNotFound(f"{name.repo} has no {quant} GGUF{_where(name, endpoint)}; {have} (name one as "
                        f"{name.repo}:QUANT, or a file as {name.repo}/FILE.gguf)")


def _parts(file: str) -> list[str]:
    """The files of the model `file` is in: itself, or every part of a split model."""
    folder, base = posixpath.split(file)
    if not (m := SPLIT_NAME.fullmatch(base)):
        return [file]
    count = int(m["count"])
    return [posixpath.join(folder, f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _download(name: HubName, file: str, sha256: str | None) -> Path:
    """hf_hub_download, with a fresh download checked against the sha256 the Hub lists."""
    hf = _huggingface_hub()
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    cached = hf.try_to_load_from_cache(name.repo, file, revision=name.revision)
    try:
        path = hf.hf_hub_download(name.repo, file, revision=name.revision)
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError) as err:
        raise _not_found(HubName(name.repo, file=file, revision=name.revision), err) from None
    if sha256 and path != cached:
        digest = _sha256(path)
        if digest != sha256:
            blob = os.path.realpath(path)
            os.unlink(path)
            if os.path.exists(blob):
                os.unlink(blob)
            raise BadFile(f"{name.repo}/{file}: the download's sha256 is {digest}, not the {sha256} the Hub "
                          "lists for it (corrupted on the way): deleted; try again")
    return Path(path)


def _not_found(name: HubName, err: Exception) -> ModelNotFound:
    hf = _huggingface_hub()
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    where = _where(name, hf.constants.ENDPOINT)
    if isinstance(err, GatedRepoError):
        return ModelNotFound(f"{name.repo} is gated{where}: accept its terms on the Hub and set HF_TOKEN")
    if isinstance(err, RepositoryNotFoundError):
        return ModelNotFound(f"no model repo {name.repo}{where} (a private one needs HF_TOKEN)")
    if isinstance(err, LocalEntryNotFoundError):
        return ModelNotFound(f"{name}: not in the Hugging Face cache ({hf.constants.HF_HUB_CACHE}), and the Hub "
                             f"{_reach(hf)}")
    return ModelNotFound(f"{name}: not found{where}: {err}")


def _where(name: HubName, endpoint: str) -> str:
    return f" at {endpoint}" + (f" (revision {name.revision})" if name.revision else "")


def _reach(hf) -> str:
    if hf.constants.is_offline_mode():
        return f"at {hf.constants.ENDPOINT} was not asked (offline: HF_HUB_OFFLINE is set)"
    return f"at {hf.constants.ENDPOINT} could not be reached"


def _sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# --- plain URLs ---------------------------------------------------------------------------
def url_path(url: str, url_cache: Path) -> Path:
    """Where the file at `url` is kept: a folder per URL, the file under its own name."""
    name = unquote(urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]) or "model.gguf"
    return url_cache / hashlib.sha256(url.encode()).hexdigest()[:16] / name


def fetch_url(url: str, url_cache: Path) -> Path:
    """The file at `url`, downloaded into url_cache on first use (resuming a `.partial` file)."""
    path = url_path(url, url_cache)
    if path.is_file():
        return path
    _huggingface_hub()
    import httpx2   # huggingface_hub's HTTP client: its network errors
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    from huggingface_hub.file_download import http_get
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "ab") as out:   # appends: a partial file from an earlier run is resumed
            http_get(url, out, resume_size=out.tell(), displayed_filename=path.name)
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.TransportError) as err:
        why = f"HTTP {err.response.status_code}" if isinstance(err, HfHubHTTPError) else f"{type(err).__name__}: {err}"
        if kept := partial.stat().st_size:
            why += f"; the {kept} bytes so far are kept for the next try"
        else:
            partial.unlink()
            partial.parent.rmdir()
        raise ModelNotFound(f"could not download {url}: {why}") from None
    (path.parent / "url").write_text(url)   # what `python -m cera models` lists it as
    partial.rename(path)
    return path


# --- what is cached -----------------------------------------------------------------------
@dataclass(frozen=True)
class Cached:
    model: str   # the name that loads it
    path: Path
    bytes: int


def cached_urls(url_cache: Path) -> list[Cached]:
    """The files downloaded whole by URL (fetch_url), each with its URL."""
    return [Cached(marker.read_text(), f, f.stat().st_size) for marker in sorted(url_cache.glob("*/url"))
            for f in marker.parent.iterdir() if f != marker and not f.name.endswith(".partial")]


def cached_hub() -> list[Cached]:
    """Every GGUF in the Hugging Face cache, as ORG/REPO/PATH.gguf (mmproj files left out)."""
    try:
        import huggingface_hub as hf
    except ImportError:
        return []
    try:
        repos = hf.scan_cache_dir().repos
    except hf.CacheNotFound:
        return []
    out = []
    for repo in sorted(repos, key=lambda r: r.repo_id):
        for rev in sorted(repo.revisions, key=lambda r: r.commit_hash):
            for f in sorted(rev.files, key=lambda f: f.file_path):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if repo.repo_type == "model" and rel.lower().endswith(".gguf") and "mmproj" not in rel.lower():
                    out.append(Cached(f"{repo.repo_id}/{rel}", f.file_path, f.size_on_disk))
    return out
