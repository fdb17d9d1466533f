"""Models by name: `org/name`, `name`, `org/name@revision` wherever a model directory is accepted.

A string that names an existing directory is always that directory. One that starts with `.`, `/` or
`~`, or has more than one `/`, is a path and is never sent to the Hub (a missing one is "no such
directory"). Anything else is a Hugging Face Hub repository, resolved by `huggingface_hub` into its
shared cache (HF_HOME / HF_HUB_CACHE; HF_HUB_OFFLINE=1 answers from the cache without a request; the
token comes from HF_TOKEN or the token file, and bertforge never prints or records it).

Only what bertforge reads is downloaded: config.json, safetensors weights (sharded ones with their
index), the tokenizer's files, sentence-transformers' module files and a fine-tuned model's task.json.
A repository with only pickle weights (pytorch_model.bin) is refused unless pickle loading is allowed,
and a config whose `auto_map` asks for the repository's own code is refused: bertforge runs only its
own model families.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# what a model directory needs, by file pattern (huggingface_hub's allow_patterns)
MODEL_FILES = (
    "config.json", "*.safetensors", "model.safetensors.index.json",
    "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "spiece.model", "sentencepiece.bpe.model", "spm.model", "vocab.json", "merges.txt",
    "modules.json", "sentence_bert_config.json", "*_Pooling/config.json", "task.json",
)
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin")


class HubModelError(FileNotFoundError):
    """A model name that does not resolve: no such repository, revision or cached copy, only pickle
    weights, or custom code. One line that says what to do."""


class HubNetworkError(HubModelError):
    """The Hub could not be reached or refused the request (no connection, a failed name lookup, a
    timeout, an HTTP error status): one line naming what failed and what to do (`network_problem`)."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model argument points: a local directory, or a Hub repository's snapshot in the cache."""

    path: Path
    repo_id: str | None = None  # None: a local directory
    revision: str | None = None  # as asked (a branch, tag or commit), None for the default branch
    commit: str | None = None  # the commit the snapshot is of

    def provenance(self) -> dict[str, str | None]:
        """What run records keep to repeat the run: the repository and its resolved commit."""
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit} if self.repo_id else {}


def is_hub_name(spec: str) -> bool:
    """Whether `spec` (no existing directory) is read as a Hub repository rather than a path."""
    name = spec.split("@", 1)[0]
    return bool(name) and not spec.startswith((".", "/", "~")) and name.count("/") <= 1 and "\\" not in spec


def split_revision(spec: str, revision: str | None = None) -> tuple[str, str | None]:
    """("org/name", "v1") from "org/name@v1"; a revision given twice must agree."""
    name, at, inline = spec.partition("@")
    if at and revision is not None and inline != revision:
        raise HubModelError(f"{spec}: the revision is given twice ({inline!r} and --revision {revision!r})")
    return name, (inline if at else revision)


def with_revision(spec: str, revision: str | None) -> str:
    """`spec` with a `--revision` folded in as NAME@REVISION; refused (HubModelError) for a local directory
    or a path, and when the name carries another revision."""
    if revision is None:
        return spec
    if Path(spec).expanduser().is_dir() or not is_hub_name(spec):
        raise HubModelError(f"--revision {revision}: {spec} is a local directory, not a Hub model name")
    name, revision = split_revision(spec, revision)
    return f"{name}@{revision}"


def resolve_model(spec: str | os.PathLike[str], *, revision: str | None = None,
                  allow_pickle: bool = False) -> ResolvedModel:
    """The local directory `spec` names, downloading it from the Hub first when it is a repository name
    (see the module docstring for the rules)."""
    text = os.fspath(spec)
    local = Path(text).expanduser()
    if local.is_dir():
        return ResolvedModel(local)
    if not is_hub_name(text):
        raise HubModelError(f"{text}: no such directory")
    repo_id, revision = split_revision(text, revision)
    path, commit = _download(repo_id, revision, allow_pickle)
    _refuse_custom_code(repo_id, path)
    return ResolvedModel(path, repo_id, revision, commit)


def model_path(spec: str | os.PathLike[str], **options: object) -> Path:
    """`resolve_model(spec).path`: the directory to read."""
    return resolve_model(spec, **options).path  # type: ignore[arg-type]


def resolve_local_or_hub(spec: str | os.PathLike[str], *, allow_pickle: bool = False) -> ResolvedModel:
    """`spec` as a path, unless it is no directory and reads as a Hub name: then that model's snapshot
    (with its repository and commit, which run records keep). A missing path is returned as it is, so
    that the loader's own message names it."""
    path = Path(spec).expanduser()
    if path.is_dir() or not is_hub_name(os.fspath(spec)):
        return ResolvedModel(path)
    return resolve_model(spec, allow_pickle=allow_pickle)


def local_or_hub(spec: str | os.PathLike[str], *, allow_pickle: bool = False) -> Path:
    """The directory to read for `spec` (`resolve_local_or_hub(spec).path`): what every loader calls."""
    return resolve_local_or_hub(spec, allow_pickle=allow_pickle).path


# What an HTTP error status from the Hub asks the user to do (5xx: see `network_problem`).
HTTP_ADVICE = {
    401: "the Hub did not accept the token (none, expired or mistyped): set HF_TOKEN or run `hf auth login`",
    403: "the token is not allowed to do this (a read-only token, or no write access to that namespace): "
         "use a token with write access",
    404: "not found on the Hub: check the name (a private repository needs a token that can see it)",
    429: "the Hub is limiting the rate of requests: wait a minute and retry",
}
# Words of a failed host-name lookup, as the resolver reports it on Linux, macOS and Windows.
_DNS_WORDS = ("name or service not known", "nodename nor servname", "temporary failure in name resolution",
              "getaddrinfo failed", "no address associated")


def network_problem(exc: BaseException) -> str | None:
    """What a failed request to the Hub means, in one line that says what to do; None when `exc` (or
    what it was raised from) is no network failure. The endpoint named is huggingface_hub's
    (HF_ENDPOINT, else https://huggingface.co)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    for error in _chain(exc):
        if isinstance(error, HfHubHTTPError) and getattr(error, "response", None) is not None:
            status = error.response.status_code
            if status >= 500:
                return f"the Hub answered HTTP {status}, an error on its side: retry later"
            return f"the Hub answered HTTP {status}: " + HTTP_ADVICE.get(status, _first_line(error))
        if isinstance(error, OfflineModeIsEnabled):
            return "HF_HUB_OFFLINE is set, which forbids asking the Hub: unset it to reach the Hub"
        if not type(error).__module__.startswith(("httpx", "httpcore")) or not isinstance(error, Exception):
            continue
        endpoint, name = constants.ENDPOINT, type(error).__name__
        text = _first_line(error)
        if "Timeout" in name:
            return (f"{endpoint} did not answer in time ({name}): check the network connection, or allow more "
                    "seconds with HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT")
        if any(words in text.lower() for words in _DNS_WORDS):
            return (f"the host of {endpoint} cannot be looked up (DNS: {text}): check the network connection, "
                    "and HF_ENDPOINT if you set it")
        return (f"cannot connect to {endpoint} ({name}: {text}): check the network connection, and HF_ENDPOINT "
                "if you set it")
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during, outermost first."""
    seen: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    return seen


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


@contextmanager
def reaching_hub(what: str) -> Iterator[None]:
    """Inside, a failed request to the Hub is a `HubNetworkError`: "WHAT: what failed, what to do"."""
    try:
        yield
    except HubModelError:
        raise
    except Exception as exc:
        problem = network_problem(exc)
        if problem is None:
            raise
        raise HubNetworkError(f"{what}: {problem}") from exc


def _download(repo_id: str, revision: str | None, allow_pickle: bool) -> tuple[Path, str | None]:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        patterns = list(MODEL_FILES)
        if not constants.HF_HUB_OFFLINE:  # the file list decides what to fetch; offline, the cache decides
            _, files = _listing(repo_id, revision)
            patterns += _pickle_patterns(where, files, allow_pickle)
        # by the revision as asked (not the listing's commit), so that the cache records what the name or
        # tag pointed to and an offline run finds it again
        elif allow_pickle:
            patterns += list(PICKLE_FILES)
        path = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except GatedRepoError as exc:
        raise HubModelError(f"{where}: a gated repository; accept its terms on the Hub and log in "
                            "(HF_TOKEN or `hf auth login`)") from exc
    except RepositoryNotFoundError as exc:
        raise HubModelError(f"{where}: no such model on the Hub (or a private one: log in with HF_TOKEN or "
                            "`hf auth login`), and no such local directory") from exc
    except RevisionNotFoundError as exc:
        raise HubModelError(f"{where}: the repository has no revision {revision!r}") from exc
    except LocalEntryNotFoundError as exc:
        raise HubModelError(f"{where}: not in the local cache and the Hub cannot be reached (HF_HUB_OFFLINE "
                            "or no network); download it once with a connection") from exc
    except OfflineModeIsEnabled as exc:
        raise HubModelError(f"{where}: not in the local cache, and HF_HUB_OFFLINE forbids asking the Hub") from exc
    except Exception as exc:
        problem = network_problem(exc)  # a connection that failed, an error status: say so in one line
        if problem is not None:
            raise HubNetworkError(f"{where}: no such local directory, and the Hub cannot be reached to look for a "
                                  f"model of that name: {problem}") from exc
        if isinstance(exc, OSError):
            raise HubModelError(f"{where}: the Hub did not answer ({type(exc).__name__}: {_first_line(exc)})") from exc
        raise
    commit = path.name if len(path.name) == 40 else None  # snapshots/<commit>
    return path, commit


def _listing(repo_id: str, revision: str | None) -> tuple[str | None, list[str]]:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo_id, revision=revision)
    return info.sha, [sibling.rfilename for sibling in info.siblings or []]


def _pickle_patterns(where: str, files: list[str], allow_pickle: bool) -> list[str]:
    """The pickle weights to fetch: none when safetensors are there; refused unless allowed otherwise."""
    if any(name.endswith(".safetensors") for name in files):
        return []
    pickled = [name for name in files if name.endswith(".bin") and name.startswith("pytorch_model")]
    if not pickled:
        raise HubModelError(f"{where}: no weights bertforge reads (model.safetensors); the repository has "
                            f"{', '.join(sorted(files)[:8]) or 'no files'}")
    if not allow_pickle:
        raise HubModelError(f"{where}: only pickle weights ({pickled[0]}), which can run code when loaded; use a "
                            "revision with safetensors (the Hub's conversion bot opens one as refs/pr/N: "
                            "NAME@refs/pr/N), or allow pickle loading if you trust the repository")
    return list(PICKLE_FILES)


def _refuse_custom_code(repo_id: str, path: Path) -> None:
    config = path / "config.json"
    if not config.is_file():
        raise HubModelError(f"{repo_id}: the repository has no config.json; it is not a model directory")
    try:
        auto_map = json.loads(config.read_text(encoding="utf-8")).get("auto_map")
    except (OSError, ValueError, AttributeError):
        return  # the model loader reports a bad config.json with its own message
    if auto_map:
        raise HubModelError(f"{repo_id}: config.json asks for the repository's own code (auto_map: "
                            f"{', '.join(sorted(auto_map))}); bertforge runs only its own model families")


__all__ = ["MODEL_FILES", "HubModelError", "HubNetworkError", "network_problem", "reaching_hub", "ResolvedModel", "is_hub_name", "local_or_hub", "resolve_local_or_hub", "model_path", "resolve_model",
           "split_revision", "with_revision"]
