"""The loopback Hub (tests/hub_server.py) against the real huggingface_hub client: downloads by name, at a
branch, tag, sha or PR ref; offline reuse of the cache; errors; private repos; uploads."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_server import (  # noqa: F401  (loopback_hub_fixture provides the `loopback_hub` fixture)
    LoopbackHub,
    loopback_hub_fixture,
    resolve_path,
    set_hub_offline,
    use_loopback_hub,
)

REPO = "loopback-org/tiny-bert"
V1 = {"config.json": b'{"hidden_size": 8}', "vocab.txt": b"[PAD]\n[UNK]\nhello\n",
      "model.safetensors": b"\x00weights-v1", "nested/dir/notes.txt": b"deep file"}


@pytest.fixture
def two_versions(loopback_hub: LoopbackHub) -> tuple[str, str]:
    """REPO with commit v1 (tagged `v1`) and, on main, v2 that changes the config and adds a file."""
    first = loopback_hub.commit(REPO, V1, message="v1")
    loopback_hub.tag(REPO, "v1", first)
    second = loopback_hub.commit(REPO, {"config.json": b'{"hidden_size": 16}', "extra.json": b"[]"}, message="v2")
    return first, second


def read_tree(folder: str | Path) -> dict[str, bytes]:
    root = Path(folder)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fixture_points_the_library_at_the_server(loopback_hub, tmp_path):
    from huggingface_hub import constants

    assert loopback_hub.url.rstrip("/") == constants.ENDPOINT
    assert str(tmp_path / "hf_home" / "hub") == constants.HF_HUB_CACHE
    assert constants.HF_HUB_OFFLINE is False
    assert huggingface_hub.hf_api.api.endpoint == loopback_hub.url  # the HfApi behind huggingface_hub.model_info
    assert loopback_hub.requests == []


def test_snapshot_at_main_tag_and_sha(loopback_hub, two_versions):
    first, second = two_versions
    main = Path(snapshot_download(REPO))
    assert main.name == second  # the snapshot folder is named after the commit main resolved to
    assert read_tree(main) == {**V1, "config.json": b'{"hidden_size": 16}', "extra.json": b"[]"}
    assert (main.parent.parent / "refs" / "main").read_text() == second

    tagged = Path(snapshot_download(REPO, revision="v1"))
    assert tagged.name == first
    assert read_tree(tagged) == V1

    # A full sha needs no revision lookup, and a snapshot already complete for it needs no request at all.
    loopback_hub.clear_requests()
    assert Path(snapshot_download(REPO, revision=first)) == tagged
    assert loopback_hub.requests == []


def test_snapshot_at_an_uncached_sha_lists_and_downloads_without_info(loopback_hub, two_versions):
    first, _ = two_versions
    folder = Path(snapshot_download(REPO, revision=first))
    assert read_tree(folder) == V1
    paths = [path for _, path, _ in loopback_hub.requests]
    assert not any(f"/api/models/{REPO}/revision" in p for p in paths)
    assert f"/api/models/{REPO}/tree/{first}" in paths
    assert sorted(loopback_hub.downloads("GET")) == sorted(V1)


def test_allow_patterns_fetch_only_the_matching_files(loopback_hub, two_versions):
    folder = Path(snapshot_download(REPO, allow_patterns=["*.json"]))
    assert sorted(read_tree(folder)) == ["config.json", "extra.json"]
    assert sorted(loopback_hub.downloads("GET")) == ["config.json", "extra.json"]
    assert sorted(loopback_hub.downloads("HEAD")) == ["config.json", "extra.json"]


def test_hf_hub_download_regular_lfs_and_nested_files(loopback_hub, two_versions):
    first, second = two_versions
    config = Path(hf_hub_download(REPO, "config.json"))
    assert config.read_bytes() == b'{"hidden_size": 16}'
    assert config.parent.name == second
    assert Path(hf_hub_download(REPO, "config.json", revision="v1")).read_bytes() == V1["config.json"]
    assert Path(hf_hub_download(REPO, "notes.txt", subfolder="nested/dir")).read_bytes() == b"deep file"
    # An LFS file is cached under its sha256 (from X-Linked-Etag), a regular one under its git blob oid.
    weights = Path(hf_hub_download(REPO, "model.safetensors"))
    assert weights.read_bytes() == V1["model.safetensors"]
    assert weights.resolve().name == hashlib.sha256(V1["model.safetensors"]).hexdigest()
    assert (loopback_hub.requests[0].method, loopback_hub.requests[0].path) == (
        "HEAD", resolve_path(REPO, "config.json"))


def test_offline_run_reuses_the_cache_with_zero_requests(loopback_hub, two_versions, monkeypatch):
    online = snapshot_download(REPO)
    config = hf_hub_download(REPO, "config.json")
    loopback_hub.clear_requests()
    set_hub_offline(monkeypatch)
    assert snapshot_download(REPO) == online
    assert hf_hub_download(REPO, "config.json") == config
    assert read_tree(online)["config.json"] == b'{"hidden_size": 16}'
    assert loopback_hub.requests == []
    # What was never cached is an error offline, still without a request.
    with pytest.raises(huggingface_hub.errors.LocalEntryNotFoundError):
        snapshot_download(REPO, revision="v1")
    assert loopback_hub.requests == []


def test_dataset_repo_with_a_parquet_file(loopback_hub, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": ["good", "bad"], "label": [1, 0]}), buffer)
    loopback_hub.commit("loopback-org/reviews", {"data/train.parquet": buffer.getvalue(), "README.md": "# reviews"},
                        repo_type="dataset")

    folder = Path(snapshot_download("loopback-org/reviews", repo_type="dataset"))
    assert pq.read_table(folder / "data" / "train.parquet").to_pydict() == {"text": ["good", "bad"], "label": [1, 0]}
    single = hf_hub_download("loopback-org/reviews", "data/train.parquet", repo_type="dataset")
    assert Path(single).read_bytes() == buffer.getvalue()
    paths = [path for _, path, _ in loopback_hub.requests]
    assert all(p.startswith(("/datasets/loopback-org/reviews/", "/api/datasets/loopback-org/reviews")) for p in paths)
    # A model repo of that name does not exist.
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("loopback-org/reviews")


def test_info_tree_and_refs_routes(loopback_hub, two_versions):
    first, second = two_versions
    api = HfApi()
    info = api.model_info(REPO)
    assert info.sha == second
    assert sorted(s.rfilename for s in info.siblings) == sorted([*V1, "extra.json"])
    detailed = api.model_info(REPO, revision="v1", files_metadata=True)
    assert detailed.sha == first
    weights = next(s for s in detailed.siblings if s.rfilename == "model.safetensors")
    assert weights.size == len(V1["model.safetensors"]) and weights.lfs is not None
    assert huggingface_hub.model_info(REPO).sha == second  # the module-level HfApi instance
    assert api.repo_info(REPO, revision=first).sha == first

    assert sorted(api.list_repo_files(REPO, revision="v1")) == sorted(V1)
    top = {entry.path: type(entry).__name__ for entry in api.list_repo_tree(REPO)}
    assert top == {"config.json": "RepoFile", "extra.json": "RepoFile", "model.safetensors": "RepoFile",
                   "nested": "RepoFolder", "vocab.txt": "RepoFile"}
    inside = list(api.list_repo_tree(REPO, path_in_repo="nested", recursive=True, expand=True))
    assert [e.path for e in inside] == ["nested/dir", "nested/dir/notes.txt"]
    assert inside[1].last_commit.oid == first  # v2 did not touch it
    assert api.file_exists(REPO, "extra.json") and not api.file_exists(REPO, "extra.json", revision="v1")
    assert not api.file_exists("loopback-org/missing", "config.json")

    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", second)]
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", first)]


def test_tree_pagination(loopback_hub, two_versions):
    loopback_hub.tree_page_size = 2
    files = HfApi().list_repo_files(REPO)
    assert sorted(files) == sorted([*V1, "extra.json"])
    tree_calls = [path for _, path, _ in loopback_hub.requests if "/tree/" in path]
    assert len(tree_calls) == 4  # 7 entries (files and the two folders) by pages of 2


def test_missing_repo_revision_and_file_raise_the_library_errors(loopback_hub, two_versions):
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("loopback-org/missing")
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("loopback-org/missing")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("loopback-org/missing", "config.json")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(REPO, revision="v9")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info(REPO, revision="0" * 40)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json")
    response = next(r for r in loopback_hub.requests if r.path.endswith("/missing.json"))
    assert response.method == "HEAD"


def test_private_repo_needs_the_token(loopback_hub, monkeypatch):
    loopback_hub.create_repo("loopback-org/secret", private=True)
    sha = loopback_hub.commit("loopback-org/secret", {"config.json": b"{}"})
    for call in (lambda: HfApi().model_info("loopback-org/secret"),
                 lambda: hf_hub_download("loopback-org/secret", "config.json"),
                 lambda: snapshot_download("loopback-org/secret")):
        with pytest.raises(RepositoryNotFoundError) as caught:
            call()
        assert caught.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        HfApi(token="hf_wrong").model_info("loopback-org/secret")
    assert all(auth in (None, "Bearer hf_wrong") for _, _, auth in loopback_hub.requests)

    assert HfApi(token=loopback_hub.token).model_info("loopback-org/secret").sha == sha
    loopback_hub.clear_requests()
    monkeypatch.setenv("HF_TOKEN", loopback_hub.token)  # the library reads HF_TOKEN on every call
    folder = snapshot_download("loopback-org/secret")
    assert read_tree(folder) == {"config.json": b"{}"}
    assert loopback_hub.requests and {auth for _, _, auth in loopback_hub.requests} == {f"Bearer {loopback_hub.token}"}


# huggingface_hub's LFS upload hands httpx2 a file object as `data=`, which httpx2 deprecates.
@pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")
def test_create_repo_and_upload_folder(loopback_hub, tmp_path):
    folder = tmp_path / "to_upload"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "README.md").write_text("# tiny\n")
    (folder / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 4)  # LFS by name and by content
    api = HfApi(token=loopback_hub.token)

    url = api.create_repo("loopback-org/uploaded", private=True)
    assert url.repo_id == "loopback-org/uploaded"
    assert api.create_repo("loopback-org/uploaded", exist_ok=True).repo_id == "loopback-org/uploaded"
    before = loopback_hub.head("loopback-org/uploaded")  # the Hub's initial `.gitattributes` commit
    info = api.upload_folder(repo_id="loopback-org/uploaded", folder_path=folder, commit_message="first upload")
    assert info.oid == loopback_hub.head("loopback-org/uploaded") != before
    assert loopback_hub.repos[("model", "loopback-org/uploaded")].commits[info.oid].parent == before
    paths = [path for _, path, _ in loopback_hub.requests]
    assert "/api/models/loopback-org/uploaded/preupload/main" in paths
    assert "/loopback-org/uploaded.git/info/lfs/objects/batch" in paths  # weights.bin went through LFS
    assert any(p.startswith("/lfs-upload/") for p in paths)

    downloaded = read_tree(snapshot_download("loopback-org/uploaded", token=loopback_hub.token))
    assert {k: v for k, v in downloaded.items() if k != ".gitattributes"} == read_tree(folder)
    with pytest.raises(RepositoryNotFoundError):  # private: no token, no file (in a cache that lacks it)
        hf_hub_download("loopback-org/uploaded", "config.json", cache_dir=tmp_path / "empty_cache")

    # Uploading the same files again changes nothing: the preupload oids tell the client so.
    again = api.upload_folder(repo_id="loopback-org/uploaded", folder_path=folder)
    assert again.oid == info.oid

    # A pull request: a `refs/pr/1` ref, downloadable with the URL-encoded revision.
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "layers": 2}))
    pr = api.upload_folder(repo_id="loopback-org/uploaded", folder_path=folder, create_pr=True)
    assert pr.pr_revision == "refs/pr/1" and loopback_hub.head("loopback-org/uploaded") == info.oid
    loopback_hub.clear_requests()
    config = hf_hub_download("loopback-org/uploaded", "config.json", revision="refs/pr/1", token=loopback_hub.token)
    assert json.loads(Path(config).read_text())["layers"] == 2
    assert "/loopback-org/uploaded/resolve/refs%2Fpr%2F1/config.json" in [p for _, p, _ in loopback_hub.requests]


def test_uploads_need_a_token(loopback_hub):
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as caught:
        HfApi().create_repo("loopback-org/anonymous")
    assert caught.value.response.status_code == 401
    loopback_hub.commit("loopback-org/public", {"a.txt": b"a"})
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError):
        HfApi().upload_file(path_or_fileobj=b"b", path_in_repo="b.txt", repo_id="loopback-org/public")
    assert loopback_hub.files("loopback-org/public") == {"a.txt": b"a"}


def test_upload_into_an_empty_repo_made_on_the_hub_side(loopback_hub):
    loopback_hub.create_repo("loopback-org/empty")  # no commit, no main yet
    assert HfApi().model_info("loopback-org/empty").sha is None
    info = HfApi(token=loopback_hub.token).upload_file(path_or_fileobj=b"x", path_in_repo="x.txt",
                                                       repo_id="loopback-org/empty")
    assert loopback_hub.files("loopback-org/empty") == {"x.txt": b"x"}
    assert Path(hf_hub_download("loopback-org/empty", "x.txt")).parent.name == info.oid
    uploads = [r for r in loopback_hub.requests if r.method == "POST"]
    assert uploads and all(r.authorization == f"Bearer {loopback_hub.token}" for r in uploads)


def test_branch_and_pr_refs_created_on_the_hub_side(loopback_hub):
    main = loopback_hub.commit(REPO, {"config.json": b"main"})
    dev = loopback_hub.commit(REPO, {"config.json": b"dev"}, branch="dev")
    pr = loopback_hub.commit(REPO, {"config.json": b"pr"}, branch="refs/pr/3")
    assert loopback_hub.repos[("model", REPO)].commits[dev].parent == main
    for revision, content, sha in (("main", b"main", main), ("dev", b"dev", dev), ("refs/pr/3", b"pr", pr)):
        path = Path(hf_hub_download(REPO, "config.json", revision=revision))
        assert (path.read_bytes(), path.parent.name) == (content, sha)
    assert resolve_path(REPO, "config.json", "refs/pr/3") in [p for _, p, _ in loopback_hub.requests]


def test_a_child_process_finds_the_hub_through_the_environment(loopback_hub, tmp_path):
    loopback_hub.commit(REPO, {"config.json": b'{"from": "child"}'})
    code = f"import huggingface_hub as h; print(open(h.hf_hub_download({REPO!r}, 'config.json')).read())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == '{"from": "child"}'
    assert loopback_hub.downloads() == ["config.json"]
    assert (tmp_path / "hf_home" / "hub" / f"models--{REPO.replace('/', '--')}").is_dir()


def test_pointing_the_library_at_a_hub_is_undone(tmp_path):
    from huggingface_hub import constants

    before = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
              constants.HF_HUB_OFFLINE, huggingface_hub.hf_api.api.endpoint)
    with LoopbackHub() as hub, pytest.MonkeyPatch.context() as patch:
        use_loopback_hub(hub, tmp_path / "home", patch)
        set_hub_offline(patch)
        assert hub.url == constants.ENDPOINT and constants.HF_HUB_OFFLINE is True
    assert (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
            constants.HF_HUB_OFFLINE, huggingface_hub.hf_api.api.endpoint) == before
