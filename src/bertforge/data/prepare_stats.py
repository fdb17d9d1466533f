"""stats.json of a prepare run: what was read, skipped, packed and masked, summed over the shards' own
records (of one run, or of all the parts of a run split over machines); and the merge of such parts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from bertforge.data.corpus import DataError, ReadStats
from bertforge.data.instances import InstanceCounters
from bertforge.data.shards import read_json, shard_name
from bertforge.fileio import atomic_path, write_text_atomic

DATASET_FORMAT = "bertforge-pretraining-data"


def collect_stats(out: Path, dataset: dict, plan_warnings: list[str]) -> dict[str, Any]:
    records = [read_json(out / "done" / f"{shard_name(i)}.json") for i in range(len(dataset["shards"]))]
    return summarize(records, dataset, plan_warnings)


def summarize(records: list[dict], dataset: dict, plan_warnings: list[str]) -> dict[str, Any]:
    """stats.json from the shards' records (of one run, or of all the parts of one)."""
    read = ReadStats()
    train, valid = InstanceCounters(), InstanceCounters()
    for rec in records:
        read.merge(ReadStats.from_json(rec["read"]))
        train.merge(InstanceCounters(**rec["train"]["counters"]))
        valid.merge(InstanceCounters(**rec["valid"]["counters"]))
    o = dataset["options"]

    def total(split: str, key: str) -> int:
        return sum(rec[split][key] for rec in records)

    masked_split = "train" if o["masking"] == "static" else "valid"
    maskable = total(masked_split, "maskable")
    instances = total("train", "instances")
    made = train.instances  # before dupe/packing bookkeeping, the pairs made (labelled)
    warnings_: list[str] = list(plan_warnings)
    if read.bad_lines:
        warnings_.append(f"skipped {read.bad_lines} line(s) with bytes that are not UTF-8, first at "
                         f"{', '.join(read.bad_line_locations)}")
    if read.bad_records:
        field = (f"field {o['text_field']!r}" if o["text_field"] == o["text_column"]
                 else f"field {o['text_field']!r} / column {o['text_column']!r}")
        warnings_.append(f"skipped {read.bad_records} record(s) without usable text in {field} (bad_records='error' "
                         f"stops at the first), first at {', '.join(read.bad_record_locations)}")
    if read.overlong_lines:
        warnings_.append(f"{read.overlong_lines} line(s) longer than {o['max_line_chars']} characters were split "
                         f"into sentences (is the input really one sentence per line?), first at "
                         f"{', '.join(read.overlong_locations)}")
    planned = {r[1] for rec in records for r in rec["ranges"]}
    for index, entry in enumerate(dataset["inputs"]):
        if entry["bytes"] and not read.sentences_per_file.get(index) and index in planned:
            warnings_.append(f"{entry['path']}: no sentences found (only blank lines?)")
    one = train.one_sentence_documents + valid.one_sentence_documents
    if one and o["objective"] != "none":
        where = [loc for rec in records for loc in rec.get("one_sentence_locations", [])][:5]
        warnings_.append(f"skipped {one} document(s) of a single sentence (a pair needs two), first at "
                         f"{', '.join(where)}")
    fallbacks = train.random_next_fallbacks + valid.random_next_fallbacks
    if fallbacks:
        warnings_.append(f"{fallbacks} NotNext draw(s) found no other document in their shard and used the actual "
                         "next segment instead (a shard holding a single document?)")
    capped = total("train", "capped_rows") + total("valid", "capped_rows")
    if capped:
        warnings_.append(f"max_predictions_per_seq={o['max_predictions_per_seq']} capped the masks of {capped} "
                         "sequences")
    return {
        "documents": read.documents,
        "sentences": read.sentences,
        "tokens": sum(rec["tokens"] for rec in records),
        "bytes": read.bytes,
        "instances": instances,
        "validation_instances": total("valid", "instances"),
        "instance_tokens": total("train", "tokens"),
        "masked_fraction": round(total(masked_split, "masked") / maskable, 5) if maskable else None,
        "masked_fraction_of": masked_split,
        "is_next_fraction": round(train.is_next / made, 5) if made and o["objective"] != "none" else None,
        "truncated_fraction": round(train.truncated / made, 5) if made else None,
        "skipped": {
            "bad_lines": read.bad_lines, "bad_records": read.bad_records, "overlong_lines": read.overlong_lines,
            "first_bad_record": read.bad_record_locations[0] if read.bad_record_locations else None,
            "empty_files": sum(1 for e in dataset["inputs"] if e["bytes"] == 0),
            "one_sentence_documents": one, "dropped_sentences": train.dropped_sentences + valid.dropped_sentences,
            "random_next_fallbacks": fallbacks,
        },
        "per_shard": [
            {**({"part": rec["part"]} if "part" in rec else {}), "shard": rec["shard"], "documents": rec["read"]["documents"], "sentences": rec["read"]["sentences"],
             "bytes": rec["read"]["bytes"], "tokens": rec["tokens"], "instances": rec["train"]["instances"],
             "validation_instances": rec["valid"]["instances"], "wall_s": rec["wall_s"]}
            for rec in records
        ],
        "options": o,
        "warnings": warnings_,
    }


def merge_parts(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Join the parts that `prepare(..., part="I/N")` wrote under `data_dir` into one dataset.

    Checks that all N parts are there and finished, made from the same inputs with the same options
    and vocabulary; then writes `data_dir/dataset.json` (which lists the parts), `stats.json` (over all
    of them), `continuation.npy` and `tokenizer/`. No shard is copied: the loader reads each part's
    shards in place, part after part. Returns the statistics.
    """
    data = Path(data_dir)
    found: dict[int, tuple[int, Path]] = {}
    for directory in sorted(data.glob("part-*-of-*")):
        index, _, count = directory.name.removeprefix("part-").partition("-of-")
        if directory.is_dir() and index.isdigit() and count.isdigit():
            found[int(index)] = (int(count), directory)
    if not found:
        raise DataError(f"{data}: no part directories (part-I-of-N) to merge; make them with prepare --part I/N")
    counts = {count for count, _ in found.values()}
    if len(counts) > 1:
        raise DataError(f"{data}: parts of different splits ({', '.join(f'of {n}' for n in sorted(counts))}); "
                        "keep the parts of one split only")
    num_parts = counts.pop()
    missing = [i for i in range(num_parts) if i not in found]
    if missing:
        raise DataError(f"{data}: part(s) {', '.join(f'{i}/{num_parts}' for i in missing)} missing; "
                        f"prepare them with --part I/{num_parts} and the same arguments")
    record = data / "dataset.json"
    if record.exists() and "parts" not in read_json(record):
        raise DataError(f"{data} holds a whole dataset already (dataset.json without parts); merge parts into "
                        "the directory that holds only them")
    dirs = [found[i][1] for i in range(num_parts)]
    infos = []
    for directory in dirs:
        if not (directory / "stats.json").is_file():
            raise DataError(f"{directory}: this part has not finished (no stats.json); run its prepare again")
        infos.append(read_json(directory / "dataset.json"))

    def job(info: dict) -> dict:
        return {"options": {k: v for k, v in info["options"].items() if k != "part"},
                "tokenizer": info["tokenizer"], "inputs": info["inputs"]}

    for directory, info in zip(dirs[1:], infos[1:], strict=True):
        differ = [k for k, v in job(info).items() if v != job(infos[0])[k]]
        if differ:
            raise DataError(f"{directory} was made with other {' and '.join(differ)} than {dirs[0]}; every part "
                            "needs the same inputs, options and tokenizer")
    records = []
    for part, (directory, info) in enumerate(zip(dirs, infos, strict=True)):
        for shard in range(len(info["shards"])):
            records.append({**read_json(directory / "done" / f"{shard_name(shard)}.json"), "part": part})
    merged = {"format": DATASET_FORMAT, "version": 1, **job(infos[0]), "shards": [],
              "parts": [d.name for d in dirs]}
    merged["options"]["part"] = None
    stats = summarize(records, merged, [])
    stats["parts"] = num_parts
    shutil.copytree(dirs[0] / "tokenizer", data / "tokenizer", dirs_exist_ok=True)
    with atomic_path(data / "continuation.npy") as tmp:
        shutil.copyfile(dirs[0] / "continuation.npy", tmp)
    write_text_atomic(data / "dataset.json", json.dumps(merged, indent=1) + "\n")
    write_text_atomic(data / "stats.json", json.dumps(stats, indent=1) + "\n")
    return stats
