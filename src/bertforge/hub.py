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


def _download(repo_id: str, revision: str | None, allow_pickle: bool) -> tuple[Path, str | None]:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
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
    except (HfHubHTTPError, OSError) as exc:
        raise HubModelError(f"{where}: the Hub did not answer ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:
        if not type(exc).__module__.startswith(("httpx", "httpcore")):  # a connection that failed: say so in one line
            raise
        raise HubModelError(f"{where}: no such local directory, and the Hub cannot be reached to look for a model of "
                            f"that name ({type(exc).__name__}: {exc})") from exc
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


__all__ = ["MODEL_FILES", "HubModelError", "ResolvedModel", "is_hub_name", "local_or_hub", "resolve_local_or_hub", "model_path", "resolve_model",
           "split_revision", "with_revision"]
