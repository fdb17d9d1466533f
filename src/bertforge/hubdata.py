"""Data sets by name: a Hugging Face Hub data set wherever a data directory or file is accepted.

    --data nyu-mll/glue                      a benchmark family's data (its config: the task's own, sst2)
    --data nyu-mll/glue:sst2                 the config named
    --train org/reviews:default:train        an own-data file: repository, config and split
    --dev org/reviews@v1.0::validation       a revision (a branch, tag or commit); the config left out

A name is `org/name[@revision][:config][:split]`. A string that names an existing file or directory is
always local, and so is one that reads as a path (see `bertforge.hub.is_hub_name`) or ends in a data
file's extension (.csv, .jsonl, ...): a mistyped file name never reaches the Hub.

The rows come from the repository's Parquet files, found in the layouts the Hub uses
(`config/split-*.parquet`, `config/split/*.parquet`, `data/split-*.parquet`); a repository that has none
at the revision asked for is read from the Hub's own Parquet conversion (`refs/convert/parquet`) when
no revision was named, and refused in one line otherwise (data sets with loading scripts run code, and
`datasets` 4 no longer runs them either). Only the split's files are downloaded, into the shared cache
(HF_HOME / HF_HUB_CACHE); HF_HUB_OFFLINE=1 reads the cache without a request. The split names
bertforge uses map to the Hub's: dev -> validation (or dev, valid), dev_matched -> validation_matched.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from bertforge.hub import HubModelError, is_hub_name, network_problem

# a name ending in one of these is a file the user meant, never a data set on the Hub
DATA_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".jsonl", ".ndjson", ".parquet", ".gz", ".bz2",
                           ".xz", ".zst", ".conll", ".iob", ".iob2", ".bio", ".train", ".testa", ".testb"})
PARQUET_CONVERSION = "refs/convert/parquet"  # the branch where the Hub keeps every data set as Parquet


class HubDataError(HubModelError):
    """A data set name that does not resolve: no such repository, revision, config, split or Parquet
    files, or not in the cache offline. One line that says what there is."""


class MissingSplitError(HubDataError):
    """The data set is there, but not the config or split asked for."""


@dataclass(frozen=True)
class DatasetName:
    """`org/name[@revision][:config][:split]`, parsed."""

    repo_id: str
    revision: str | None = None
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        text = self.repo_id + (f"@{self.revision}" if self.revision else "")
        if self.config or self.split:
            text += f":{self.config or ''}"
        return text + (f":{self.split}" if self.split else "")


def dataset_name(spec: str | os.PathLike[str] | None) -> DatasetName | None:
    """The Hub data set `spec` names, or None when it is a local path (existing or not)."""
    if spec is None or isinstance(spec, DatasetName):
        return spec
    text = os.fspath(spec)
    if not text or Path(text).expanduser().exists():
        return None
    repo, _, rest = text.partition(":")
    config, _, split = rest.partition(":")
    name, at, revision = repo.partition("@")
    if not is_hub_name(repo) or ":" in split or Path(name).suffix.lower() in DATA_SUFFIXES:
        return None
    return DatasetName(name, revision if at else None, config or None, split or None)


def split_aliases(split: str) -> tuple[str, ...]:
    """The Hub's names for one of bertforge's splits, most usual first."""
    if split == "dev":
        return ("validation", "dev", "valid", "val")
    if split.startswith("dev_"):  # MNLI's dev_matched / dev_mismatched
        return ("validation" + split[3:], split)
    return (split,)


@dataclass(frozen=True)
class DatasetSplit:
    """One split of a Hub data set, downloaded: its Parquet files and the commit they are of."""

    name: DatasetName  # with the config and the Hub's split name as found
    files: tuple[Path, ...]
    commit: str | None

    def provenance(self) -> dict[str, str | None]:
        """What run records keep to repeat the run."""
        return {"repo_id": self.name.repo_id, "revision": self.name.revision, "config": self.name.config,
                "split": self.name.split, "commit": self.commit}

    def features(self) -> dict[str, Any]:
        """The `datasets` features the Parquet schema records (ClassLabel names live there), or {}."""
        import pyarrow.parquet as pq

        raw = (pq.read_schema(self.files[0]).metadata or {}).get(b"huggingface")
        try:
            features = json.loads(raw)["info"]["features"] if raw else {}
        except (ValueError, KeyError, TypeError):
            return {}
        return features if isinstance(features, dict) else {}

    def class_names(self, column: str) -> list[str] | None:
        """A ClassLabel column's names (also of a list of ClassLabels, as NER tags are), or None."""
        feature: Any = self.features().get(column)
        while isinstance(feature, dict):
            if isinstance(feature.get("names"), list):
                return [str(n) for n in feature["names"]]
            feature = feature.get("feature")
        if isinstance(feature, list) and feature and isinstance(feature[0], dict):
            names = feature[0].get("names")
            return [str(n) for n in names] if isinstance(names, list) else None
        return None

    def rows(self) -> list[dict[str, Any]]:
        """Every row of the split, in file order."""
        import pyarrow.parquet as pq

        return [row for path in self.files for row in pq.read_table(path).to_pylist()]

    def local_file(self) -> Path:
        """One Parquet file for the own-data readers: the split's only file, or its files joined, with
        ClassLabel columns as their names (-1, no label, as null; a column of nothing but -1 dropped)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        labels = {c: n for c in pq.read_schema(self.files[0]).names if (n := self._scalar_names(c))}
        if len(self.files) == 1 and not labels:
            return self.files[0]
        target = _derived_dir(self) / f"{self.name.config or 'default'}-{self.name.split}.parquet"
        if target.is_file():
            return target
        table = pa.concat_tables([pq.read_table(path) for path in self.files])
        features = self.features()
        for column, names in labels.items():
            ids = table.column(column).to_pylist()
            decoded = [names[i] if isinstance(i, int) and 0 <= i < len(names) else None for i in ids]
            position = table.schema.get_field_index(column)
            if all(value is None for value in decoded):  # a test split's hidden labels
                table = table.remove_column(position)
                features.pop(column, None)
            else:
                table = table.set_column(position, column, pa.array(decoded, pa.string()))
                features[column] = {"dtype": "string", "_type": "Value"}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.partial")
        pq.write_table(table, partial)
        partial.replace(target)
        return target

    def _scalar_names(self, column: str) -> list[str] | None:
        feature = self.features().get(column)
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
            return self.class_names(column)
        return None


def resolve_split(spec: str | DatasetName, split: str, *, config: str | None = None) -> DatasetSplit:
    """Download the Parquet files of `split` (bertforge's name: train, dev, test, ...; a split in the
    name itself wins) of the data set `spec` names, `config` being the default when it names none."""
    name = spec if isinstance(spec, DatasetName) else dataset_name(spec)
    if name is None:
        raise HubDataError(f"{spec}: no such file or directory")
    wanted = (name.split,) if name.split else split_aliases(split)
    if name.config is None and config is not None:  # the task's usual config, else the data set's only one
        try:
            return resolve_split(replace(name, config=config), split)
        except MissingSplitError:
            pass
    folder, commit = _snapshot(name, wanted)
    found = _split_files(folder, name.config, wanted)
    if found is None and name.revision is None:  # a data set without Parquet files: the Hub's conversion
        converted = replace(name, revision=PARQUET_CONVERSION)
        try:
            folder, commit = _snapshot(converted, wanted)
        except HubDataError:
            pass
        else:
            if (found := _split_files(folder, name.config, wanted)) is not None:
                name = converted
    if found is None:
        raise MissingSplitError(_missing_split_message(name, wanted))
    config, hub_split, files = found
    return DatasetSplit(replace(name, config=config, split=hub_split), tuple(files), commit)


def _patterns(config: str | None, split: str) -> list[str]:
    """Where the Hub's layouts put a split's Parquet files (fnmatch: `*` also matches `/`)."""
    own = [f"{config}/{split}-*.parquet", f"{config}/{split}.parquet", f"{config}/{split}/*.parquet"] if config else []
    default = [f"data/{split}-*.parquet", f"data/{split}.parquet", f"data/{split}/*.parquet", f"{split}-*.parquet",
               f"{split}.parquet"]
    return own if config else [*default, f"*/{split}-*.parquet", f"*/{split}/*.parquet"]


def _snapshot(name: DatasetName, splits: tuple[str, ...]) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{name.repo_id}@{name.revision}" if name.revision else name.repo_id
    patterns = [p for split in splits for p in _patterns(name.config, split)]
    try:
        path = Path(snapshot_download(name.repo_id, repo_type="dataset", revision=name.revision,
                                      allow_patterns=patterns))
    except RepositoryNotFoundError as exc:
        raise HubDataError(f"{where}: no such data set on the Hub (or a private one: log in with HF_TOKEN), "
                           "and no such local file or directory") from exc
    except RevisionNotFoundError as exc:
        raise HubDataError(f"{where}: the data set has no revision {name.revision!r}") from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise HubDataError(f"{where}: not in the local cache and the Hub cannot be asked (HF_HUB_OFFLINE or no "
                           "network); download it once with a connection") from exc
    except Exception as exc:
        problem = network_problem(exc)  # a failed connection or an error status: one line, what to do
        if problem is not None:
            raise HubDataError(f"{where}: no such local file, and the Hub cannot be reached to look for a data "
                               f"set of that name: {problem}") from exc
        if isinstance(exc, OSError):
            raise HubDataError(f"{where}: the Hub did not answer ({type(exc).__name__}: {exc})") from exc
        raise
    return path, (path.name if len(path.name) == 40 else None)


def _split_files(folder: Path, config: str | None,
                 splits: tuple[str, ...]) -> tuple[str | None, str, list[Path]] | None:
    """(config, split, files) of the first split name that has files; a data set of several configs
    needs one named."""
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet"))
    for split in splits:
        for pattern in _patterns(config, split):
            matched = [name for name in present if fnmatch(name, pattern)]
            if not matched:
                continue
            configs = {name.split("/")[0] for name in matched if "/" in name and not name.startswith("data/")}
            if len(configs) > 1:
                raise HubDataError(f"{folder.parent.parent.name.removeprefix('datasets--').replace('--', '/')}: "
                                   f"several configs ({', '.join(sorted(configs))}); name one as NAME:CONFIG")
            found_config = config or (configs.pop() if configs else None)
            return found_config, split, [folder / name for name in matched]
    return None


def _missing_split_message(name: DatasetName, splits: tuple[str, ...]) -> str:
    """What the repository has instead, when it can be asked."""
    what = f"split {' / '.join(splits)}" + (f" of config {name.config}" if name.config else "")
    try:
        from huggingface_hub import HfApi, constants

        if constants.HF_HUB_OFFLINE:
            return f"{name}: no Parquet files of {what} in the local cache (HF_HUB_OFFLINE)"
        files = HfApi().list_repo_files(name.repo_id, repo_type="dataset", revision=name.revision)
    except Exception:  # the listing only words the message
        return f"{name}: no Parquet files of {what}"
    parquet = sorted({_config_split(f) for f in files if f.endswith(".parquet")})
    if not parquet:
        return (f"{name}: the data set has no Parquet files (a loading script's data is not read: name a revision "
                f"that has Parquet files, such as @{PARQUET_CONVERSION})")
    return f"{name}: no {what}; the data set has {', '.join(parquet[:12])}"


def _config_split(path: str) -> str:
    """"sst2/train" from "sst2/train-00000-of-00001.parquet" (or ".../train/0000.parquet")."""
    parts = path.split("/")
    if len(parts) >= 3:
        return f"{parts[-3]}/{parts[-2]}"
    stem = parts[-1].removesuffix(".parquet").split("-")[0]
    return f"{parts[0]}/{stem}" if len(parts) == 2 else stem


def _derived_dir(split: DatasetSplit) -> Path:
    """Where files bertforge derives from a cached data set go: beside the Hub's cache, by commit."""
    from huggingface_hub import constants

    return (Path(constants.HF_HOME) / "bertforge" / "datasets" / split.name.repo_id.replace("/", "--")
            / (split.commit or split.name.revision or "main"))


__all__ = ["DATA_SUFFIXES", "PARQUET_CONVERSION", "DatasetName", "DatasetSplit", "HubDataError", "dataset_name",
           "resolve_split", "split_aliases"]
