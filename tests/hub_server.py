"""A loopback Hugging Face Hub: a real HTTP server on 127.0.0.1 answering the routes huggingface_hub calls.

It serves `snapshot_download`, `hf_hub_download`, `HfApi().model_info / dataset_info / repo_info /
list_repo_files / list_repo_tree / file_exists / list_repo_refs` and uploads (`create_repo`, `upload_folder`,
`create_commit`, with the Git LFS batch protocol for the files the Hub keeps in LFS), following what huggingface_hub 2.4.0 sends and reads (file_download.py, hf_api.py,
_commit_api.py, lfs.py, utils/_http.py). Usage in a test module (the repository root is on sys.path):

    from tests.hub_server import loopback_hub_fixture  # noqa: F401  (provides the `loopback_hub` fixture)

    def test_something(loopback_hub):
        sha = loopback_hub.commit("org/tiny-bert", {"config.json": b"{}"})
        path = huggingface_hub.snapshot_download("org/tiny-bert")
        assert loopback_hub.requests  # (method, path, authorization) of every request

The fixture points huggingface_hub (its constants, read at import, and the environment children inherit) at
the server and at a temporary HF_HOME, and undoes it all afterwards; `set_hub_offline(monkeypatch)` is
HF_HUB_OFFLINE=1. Simplifications: repos live in memory; any valid token reads private repos and writes
anywhere; no Xet (the fixture disables it, so uploads use plain LFS); no CDN redirect (LFS files are served
directly, with the headers the Hub puts on its redirect).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import pytest

Reply = tuple[int, dict[str, str], bytes]  # status, headers, body

# URL prefix of each repo type on the web routes (`/datasets/org/x/resolve/...`) and plural on the API routes.
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
API_PLURAL = {"model": "models", "dataset": "datasets", "space": "spaces"}
TYPE_OF_PLURAL = {plural: repo_type for repo_type, plural in API_PLURAL.items()}

# Files the Hub stores in LFS: the patterns of the `.gitattributes` a new Hub repo starts with (abridged),
# plus any file of 10 MiB or more and any file with a NUL byte (what the Hub's preupload check calls binary).
DEFAULT_LFS_PATTERNS = ("*.bin", "*.safetensors", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.onnx", "*.msgpack",
                        "*.parquet", "*.arrow", "*.npy", "*.npz", "*.pkl", "*.gguf", "*.zip", "*.tar.gz")
LFS_MIN_SIZE = 10 * 1024 * 1024
# Commit dates: deterministic, one second apart, so `lastModified` orders like the history.
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
# The API routes' verbs after the repo id: `/api/models/{id}/{verb}/...`.
_API_VERBS = {"revision", "tree", "preupload", "commit", "refs"}


class Request(NamedTuple):
    """One request as the server saw it: the path is the raw (URL-encoded) path, without the query."""

    method: str
    path: str
    authorization: str | None


def _git_blob_oid(content: bytes) -> str:
    """The git object id of a blob, which the Hub reports as `oid` / `ETag` for regular files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class Blob:
    content: bytes
    lfs: bool  # stored in LFS: the client then keys its cache on the sha256 instead of the git oid

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def pointer(self) -> bytes:  # the LFS pointer file git stores in place of the content
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
                f"size {len(self.content)}\n").encode()

    @property
    def oid(self) -> str:  # the tree entry's oid: that of the blob git holds (the pointer, for LFS)
        return _git_blob_oid(self.pointer if self.lfs else self.content)

    @property
    def etag(self) -> str:  # what huggingface_hub names the cached blob after
        return self.sha256 if self.lfs else self.oid


@dataclass
class Commit:
    sha: str
    parent: str | None
    files: dict[str, Blob]
    title: str
    date: str


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created_at: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)  # name -> sha; pull requests as "refs/pr/N"
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        """The commit sha a branch, tag, `refs/heads|tags|pr/...` ref or full sha names; None if none."""
        if revision in self.branches:
            return self.branches[revision]
        if revision.startswith("refs/heads/"):
            return self.branches.get(revision[len("refs/heads/"):])
        if revision in self.tags or revision.startswith("refs/tags/"):
            return self.tags.get(revision.removeprefix("refs/tags/"))
        return revision.lower() if revision.lower() in self.commits else None


class HubError(Exception):
    """An error answer: huggingface_hub maps `X-Error-Code` to its exception classes."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class LoopbackHub:
    """In-memory repos plus the HTTP server that serves them. `start()` it (or use the fixture)."""

    def __init__(self, *, user: str = "loopback-user", token: str = "hf_loopback_token",
                 lfs_patterns: tuple[str, ...] = DEFAULT_LFS_PATTERNS, tree_page_size: int = 1000) -> None:
        self.user = user
        self.token = token  # the one valid token; `tokens` may hold more (token -> user name)
        self.tokens: dict[str, str] = {token: user}
        self.lfs_patterns = lfs_patterns
        self.tree_page_size = tree_page_size  # the Hub pages trees by 1000 (50 with expand); lower it to test paging
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[Request] = []
        self.lock = threading.RLock()  # the handler threads and the test thread share the repos
        self._lfs_objects: dict[str, bytes] = {}  # sha256 -> content: uploaded through LFS, maybe not committed yet
        self._counter = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ---------------------------------------------------------------- server
    def start(self) -> LoopbackHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="loopback-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = self._thread = None

    def __enter__(self) -> LoopbackHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- repos, from the test's side
    def create_repo(self, repo_id: str, repo_type: str = "model", *, private: bool = False,
                    exist_ok: bool = True) -> Repo:
        """An empty repo (no commit, no `main` until the first commit). Over HTTP, see `_create_repo`."""
        if repo_type not in URL_PREFIX:
            raise ValueError(f"unknown repo type {repo_type!r}")
        with self.lock:
            key = (repo_type, repo_id)
            if key in self.repos:
                if not exist_ok:
                    raise ValueError(f"{repo_type} repo {repo_id} exists")
                return self.repos[key]
            repo = Repo(repo_type, repo_id, private, self._next_date())
            self.repos[key] = repo
            return repo

    def commit(self, repo_id: str, files: dict[str, bytes | str], repo_type: str = "model", branch: str = "main",
               message: str = "Upload files", *, delete: tuple[str, ...] = (), lfs: bool | None = None) -> str:
        """Add a commit on `branch` (created from `main`'s head if new; a `refs/pr/N` name makes a pull
        request ref) with `files` added or replaced and `delete` removed; returns its 40-hex sha. The repo
        is created (public) if missing. `lfs` forces LFS storage on or off; by default the Hub's rule."""
        with self.lock:
            repo = self.create_repo(repo_id, repo_type)
            add = {}
            for path, data in files.items():
                content = data.encode() if isinstance(data, str) else bytes(data)
                add[path] = Blob(content, self.is_lfs(path, content) if lfs is None else lfs)
            return self._commit(repo, branch, add, delete, message)

    def tag(self, repo_id: str, tag: str, sha: str = "main", repo_type: str = "model") -> None:
        """Point tag `tag` at `sha` (or at what a branch or tag name resolves to)."""
        with self.lock:
            repo, target = self._lookup(repo_id, sha, repo_type)
            repo.tags[tag] = target

    def branch(self, repo_id: str, name: str, revision: str = "main", repo_type: str = "model") -> None:
        with self.lock:
            repo, target = self._lookup(repo_id, revision, repo_type)
            repo.branches[name] = target

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        """The commit sha `revision` resolves to."""
        with self.lock:
            return self._lookup(repo_id, revision, repo_type)[1]

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """The repo's files at `revision`, path -> content."""
        with self.lock:
            repo, sha = self._lookup(repo_id, revision, repo_type)
            return {path: blob.content for path, blob in repo.commits[sha].files.items()}

    def _lookup(self, repo_id: str, revision: str, repo_type: str) -> tuple[Repo, str]:
        repo = self.repos[(repo_type, repo_id)]
        sha = repo.resolve(revision)
        if sha is None:
            raise KeyError(f"no revision {revision!r} in {repo_type} repo {repo_id}")
        return repo, sha

    def is_lfs(self, path: str, sample: bytes, size: int | None = None) -> bool:
        size = len(sample) if size is None else size
        name = path.rsplit("/", 1)[-1]
        return (size >= LFS_MIN_SIZE or b"\0" in sample[:512]
                or any(fnmatch.fnmatch(name, pattern) for pattern in self.lfs_patterns))

    # ---------------------------------------------------------------- the request log
    def clear_requests(self) -> None:
        with self.lock:
            self.requests.clear()

    def downloads(self, method: str = "GET") -> list[str]:
        """Files fetched through a `resolve` route with `method`, in request order ("dir/file.txt")."""
        with self.lock:
            found = []
            for request in self.requests:
                segments = request.path.strip("/").split("/")
                if request.method == method and "resolve" in segments:
                    at = segments.index("resolve")
                    found.append("/".join(unquote(s) for s in segments[at + 2:]))
            return found

    # ---------------------------------------------------------------- internals
    def _next_date(self) -> str:
        self._counter += 1
        return (_EPOCH + timedelta(seconds=self._counter)).strftime("%Y-%m-%dT%H:%M:%S.000Z")

    def _commit(self, repo: Repo, branch: str, add: dict[str, Blob], delete: tuple[str, ...] | list[str],
                title: str, parent_check: str | None = None) -> str:
        parent = repo.branches.get(branch)
        if parent is None and branch != "main":
            parent = repo.branches.get("main")  # a new branch or PR ref starts at main's head
        if parent_check is not None and (parent is None or not parent.startswith(parent_check.lower())):
            raise HubError(412, None, f"Parent commit {parent_check} is not the head of {branch}")
        files = dict(repo.commits[parent].files) if parent else {}
        for path in delete:  # a file, or a folder when it ends with "/" or holds files
            prefix = path.rstrip("/") + "/"
            for existing in [p for p in files if p == path or p.startswith(prefix)]:
                del files[existing]
        files.update(add)
        date = self._next_date()
        listing = json.dumps([parent, sorted((p, b.oid) for p, b in files.items()), title, date]).encode()
        sha = hashlib.sha1(b"commit " + listing).hexdigest()
        repo.commits[sha] = Commit(sha, parent, files, title, date)
        repo.branches[branch] = sha
        return sha


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return query.get(name, ["false"])[0].lower() in ("1", "true")


def _tree_oid(files: dict[str, Blob], folder: str) -> str:
    """A stand-in for a folder's git tree id: a hash of what it holds."""
    inside = sorted((p, b.oid) for p, b in files.items() if p.startswith(folder + "/"))
    return hashlib.sha1(json.dumps(inside).encode()).hexdigest()


def _last_commit(repo: Repo, sha: str, path: str) -> dict:
    """The last commit at or before `sha` that changed `path` (a file or folder), as the tree API shows it."""
    def state(commit: Commit) -> list:
        return sorted((p, b.oid) for p, b in commit.files.items() if p == path or p.startswith(path + "/"))

    commit = repo.commits[sha]
    while commit.parent is not None and state(repo.commits[commit.parent]) == state(commit):
        commit = repo.commits[commit.parent]
    return {"id": commit.sha, "title": commit.title, "date": commit.date}


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so a response never has to be framed for keep-alive and a
    # stopped server leaves no idle connection behind. Locally, the extra TCP handshakes cost nothing.
    protocol_version = "HTTP/1.0"
    server_version = "LoopbackHub/1.0"

    def log_message(self, format: str, *args: object) -> None:  # keep the test output quiet
        pass

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    @property
    def hub(self) -> LoopbackHub:
        return self.server.hub  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- plumbing
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":  # httpx streams unsized bodies
            chunks = []
            while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        self.query = parse_qs(split.query)
        self.raw_path = split.path
        self.auth = self.headers.get("Authorization")
        self.body = self._read_body()
        with self.hub.lock:
            self.hub.requests.append(Request(self.command, split.path, self.auth))
            try:
                status, headers, body = self._route([s for s in split.path.strip("/").split("/") if s])
            except HubError as error:
                status, body = error.status, json.dumps({"error": error.message}).encode()
                headers = {**error.headers, "X-Error-Message": error.message, "Content-Type": "application/json"}
                if error.code:
                    headers["X-Error-Code"] = error.code
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: object, status: int = 200,
              headers: dict[str, str] | None = None) -> Reply:
        return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(payload).encode()

    def _user(self) -> str | None:  # whom the `Authorization: Bearer <token>` header names
        if self.auth and self.auth.startswith("Bearer "):
            return self.hub.tokens.get(self.auth[len("Bearer "):].strip())
        return None

    def _require_user(self) -> str:
        user = self._user()
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        return user

    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        if repo.private and self._user() is None:
            # What the Hub answers for a private repo without a valid token: 401 with RepoNotFound,
            # which huggingface_hub turns into RepositoryNotFoundError (response.status_code == 401).
            raise HubError(401, "RepoNotFound", "Invalid username or password.")
        return repo

    def _sha(self, repo: Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha

    def _split_repo_id(self, repo_type: str, segments: list[str], markers: set[str]) -> tuple[str, list[str]]:
        """Split `segments` into (repo id, the rest): ids have one segment ("gpt2") or two ("org/name")
        and are followed by one of `markers` (or by nothing); a known repo wins an ambiguity."""
        options = [n for n in (2, 1) if len(segments) >= n and (len(segments) == n or segments[n] in markers)]
        if not options:
            raise HubError(404, None, f"No route for {self.raw_path}")
        for n in options:
            repo_id = "/".join(unquote(s) for s in segments[:n])
            if (repo_type, repo_id) in self.hub.repos:
                return repo_id, segments[n:]
        return "/".join(unquote(s) for s in segments[:options[0]]), segments[options[0]:]

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.hub.url}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    # ---------------------------------------------------------------- routing
    def _route(self, segments: list[str]) -> Reply:
        method = self.command
        if segments[:1] == ["api"]:
            rest = segments[1:]
            if rest == ["whoami-v2"] and method == "GET":
                return self._json({"type": "user", "name": self._require_user(), "orgs": []})
            if rest == ["validate-yaml"] and method == "POST":
                return self._json({"errors": [], "warnings": []})
            if rest == ["agent-harnesses"]:  # huggingface_hub's user-agent probe, when telemetry is on
                return self._json({})
            if rest == ["repos", "create"] and method == "POST":
                return self._create_repo()
            if rest and rest[0] in TYPE_OF_PLURAL:
                repo_type = TYPE_OF_PLURAL[rest[0]]
                repo_id, tail = self._split_repo_id(repo_type, rest[1:], _API_VERBS)
                return self._api(repo_type, repo_id, tail)
            raise HubError(404, None, f"No route for {self.raw_path}")
        if segments[:1] == ["lfs-upload"] and method == "PUT" and len(segments) == 2:
            return self._lfs_put(segments[1])
        repo_type = TYPE_OF_PLURAL.get(segments[0], "model") if segments else "model"
        rest = segments[1:] if segments and segments[0] in ("datasets", "spaces") else segments
        if self.raw_path.endswith(".git/info/lfs/objects/batch") and method == "POST":
            repo_id = "/".join(unquote(s) for s in rest[:-4]).removesuffix(".git")
            return self._lfs_batch(self._repo(repo_type, repo_id))
        if "resolve" in rest[1:3] and method in ("GET", "HEAD"):
            repo_id, tail = self._split_repo_id(repo_type, rest, {"resolve"})
            return self._resolve(self._repo(repo_type, repo_id), tail[1:])
        raise HubError(404, None, f"No route for {method} {self.raw_path}")

    def _api(self, repo_type: str, repo_id: str, tail: list[str]) -> Reply:
        repo = self._repo(repo_type, repo_id)
        verb = tail[0] if tail else ""
        revision = unquote(tail[1]) if len(tail) > 1 else "main"
        method = self.command
        if method == "GET" and verb in ("", "revision"):
            return self._info(repo, revision if verb else "main", missing_ok=not verb)
        if method == "GET" and verb == "tree":
            return self._tree(repo, revision, "/".join(unquote(s) for s in tail[2:]))
        if method == "GET" and verb == "refs":
            return self._refs(repo)
        if method == "POST" and verb == "preupload":
            self._require_user()
            return self._preupload(repo, revision, json.loads(self.body))
        if method == "POST" and verb == "commit":
            self._require_user()
            return self._commit(repo, revision)
        raise HubError(404, None, f"No route for {method} {self.raw_path}")

    # ---------------------------------------------------------------- read routes
    def _entry(self, repo: Repo, sha: str, path: str, expand: bool) -> dict:
        """A tree API entry (what RepoFile / RepoFolder parse) for a file or folder of commit `sha`."""
        files = repo.commits[sha].files
        if path in files:
            blob = files[path]
            entry: dict = {"type": "file", "oid": blob.oid, "size": len(blob.content), "path": path}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": len(blob.content), "pointerSize": len(blob.pointer)}
        else:
            entry = {"type": "directory", "oid": _tree_oid(files, path), "size": 0, "path": path}
        if expand:
            entry["lastCommit"] = _last_commit(repo, sha, path)
        return entry

    def _info(self, repo: Repo, revision: str, missing_ok: bool) -> Reply:
        """`/api/models/{id}` (main, and an empty repo is fine) and `/api/models/{id}/revision/{rev}`."""
        sha = repo.resolve(revision)
        if sha is None and not missing_ok:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        commit = repo.commits[sha] if sha else None
        blobs = _flag(self.query, "blobs")
        siblings = []
        for path, blob in sorted(commit.files.items()) if commit else []:
            sibling: dict = {"rfilename": path}
            if blobs:  # files_metadata=True
                sibling.update(size=len(blob.content), blobId=blob.oid)
                if blob.lfs:
                    sibling["lfs"] = {"size": len(blob.content), "sha256": blob.sha256,
                                      "pointerSize": len(blob.pointer)}
            siblings.append(sibling)
        info = {"id": repo.repo_id, "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
                "sha": sha, "lastModified": commit.date if commit else repo.created_at,
                "createdAt": repo.created_at, "private": repo.private, "gated": False, "disabled": False,
                "tags": [], "siblings": siblings,
                "usedStorage": sum(len(b.content) for b in commit.files.values()) if commit else 0}
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        return self._json(info)

    def _tree(self, repo: Repo, revision: str, folder: str) -> Reply:
        sha = self._sha(repo, revision)
        files = repo.commits[sha].files
        recursive, expand = _flag(self.query, "recursive"), _flag(self.query, "expand")
        prefix = folder + "/" if folder else ""
        if folder and (folder in files or not any(p.startswith(prefix) for p in files)):
            raise HubError(404, "EntryNotFound", f"{folder} is not a folder of {revision}",
                           {"X-Repo-Commit": sha})
        paths = set()
        for path in files:
            if path.startswith(prefix):
                parts = path[len(prefix):].split("/")
                depth = len(parts) if recursive else 1  # folders on the way are listed too
                paths.update(prefix + "/".join(parts[:n]) for n in range(1, depth + 1))
        paths_sorted = sorted(paths)
        # Pagination as the Hub does it: a `Link: <next page>; rel="next"` header with a cursor.
        size = min(self.hub.tree_page_size, 50) if expand else self.hub.tree_page_size
        start = int(self.query.get("cursor", ["0"])[0])
        page = [self._entry(repo, sha, p, expand) for p in paths_sorted[start:start + size]]
        headers = {}
        if start + size < len(paths_sorted):
            query = urlencode({"recursive": str(recursive).lower(), "expand": str(expand).lower(),
                               "cursor": start + size})
            headers["Link"] = f'<{self.hub.url}{self.raw_path}?{query}>; rel="next"'
        return self._json(page, headers=headers)

    def _refs(self, repo: Repo) -> Reply:
        def ref(name: str, full: str, sha: str) -> dict:
            return {"name": name, "ref": full, "targetCommit": sha}

        branches = [ref(n, f"refs/heads/{n}", s) for n, s in repo.branches.items() if not n.startswith("refs/")]
        prs = [ref(n, n, s) for n, s in repo.branches.items() if n.startswith("refs/pr/")]
        return self._json({"branches": branches, "converts": [], "pullRequests": prs,
                           "tags": [ref(n, f"refs/tags/{n}", s) for n, s in repo.tags.items()]})

    def _resolve(self, repo: Repo, tail: list[str]) -> Reply:
        """GET/HEAD `/{id}/resolve/{revision}/{path}`: the file, with the headers hf_hub_download reads."""
        if len(tail) > 3 and tail[0] == "refs" and tail[1] in ("pr", "heads", "tags"):
            tail = ["/".join(tail[:3]), *tail[3:]]  # an unencoded `refs/pr/1`
        if len(tail) < 2:
            raise HubError(404, None, f"No route for {self.raw_path}")
        revision, path = unquote(tail[0]), "/".join(unquote(s) for s in tail[1:])
        sha = self._sha(repo, revision)
        blob = repo.commits[sha].files.get(path)
        if blob is None:
            # X-Repo-Commit lets the client cache the file's absence (`.no_exist/<sha>/<path>`).
            raise HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{blob.etag}"', "Content-Type": "application/octet-stream"}
        if blob.lfs:  # on the Hub these come with the redirect to the CDN; the client prefers them to ETag
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.content))})
        # No Range support: huggingface_hub only asks for one to resume a broken download.
        return 200, headers, blob.content

    # ---------------------------------------------------------------- write routes
    def _create_repo(self) -> Reply:
        user = self._require_user()
        data = json.loads(self.body)
        repo_type = data.get("type") or "model"
        repo_id = f"{data.get('organization') or user}/{data['name']}"
        if (repo_type, repo_id) in self.hub.repos:
            url = self._repo_url(self.hub.repos[(repo_type, repo_id)])
            return self._json({"error": f"You already created this {repo_type} repo", "url": url}, 409)
        private = data.get("visibility") == "private" or bool(data.get("private"))
        repo = self.hub.create_repo(repo_id, repo_type, private=private)
        # Like the Hub, a new repo starts with one commit holding a `.gitattributes` of LFS patterns.
        attributes = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in self.hub.lfs_patterns)
        self.hub._commit(repo, "main", {".gitattributes": Blob(attributes.encode(), False)}, (), "initial commit")
        return self._json({"url": self._repo_url(repo), "name": repo_id, "id": repo_id})

    def _preupload(self, repo: Repo, revision: str, data: dict) -> Reply:
        """Tells the client, per file, whether to send it inline ("regular") or through LFS, and the oid
        the file has now (so that unchanged files are left out of the commit)."""
        sha = repo.resolve(revision)
        if sha is None and repo.commits and "create_pr" not in self.query:  # an empty repo takes a first commit
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        current = repo.commits[sha].files if sha else {}
        answers = []
        for item in data["files"]:
            lfs = self.hub.is_lfs(item["path"], base64.b64decode(item["sample"]), item["size"])
            existing = current.get(item["path"])
            oid = None if existing is None else existing.sha256 if lfs else _git_blob_oid(existing.content)
            answers.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular",
                            "shouldIgnore": False, "oid": oid})
        return self._json({"files": answers, "commitOid": sha})

    def _commit(self, repo: Repo, revision: str) -> Reply:
        """The ndjson commit: a header line, then `file` (inline base64), `lfsFile` (an uploaded LFS
        object), `deletedFile` and `deletedFolder` lines."""
        header: dict = {}
        add: dict[str, Blob] = {}
        delete: list[str] = []
        for line in self.body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                header = value
            elif key == "file":
                add[value["path"]] = Blob(base64.b64decode(value["content"]), False)
            elif key == "lfsFile":
                content = self.hub._lfs_objects.get(value["oid"])
                if content is None:  # a copy of an LFS file the repo already has
                    content = next((b.content for c in repo.commits.values() for b in c.files.values()
                                    if b.lfs and b.sha256 == value["oid"]), None)
                if content is None:
                    raise HubError(422, None, f"LFS object {value['oid']} was never uploaded")
                add[value["path"]] = Blob(content, True)
            elif key in ("deletedFile", "deletedFolder"):
                delete.append(value["path"] + ("/" if key == "deletedFolder" else ""))
        branch, pr_url = revision, None
        if "create_pr" in self.query:
            base = self._sha(repo, revision)
            number = 1 + max([int(n.rsplit("/", 1)[1]) for n in repo.branches if n.startswith("refs/pr/")] or [0])
            branch = f"refs/pr/{number}"
            repo.branches[branch] = base
            pr_url = f"{self._repo_url(repo)}/discussions/{number}"
        elif branch not in repo.branches and repo.commits:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision} is not a branch")
        sha = self.hub._commit(repo, branch, add, delete, header.get("summary", ""), header.get("parentCommit"))
        return self._json({"commitUrl": f"{self._repo_url(repo)}/commit/{sha}", "commitOid": sha,
                           "pullRequestUrl": pr_url, "success": True})

    def _lfs_batch(self, repo: Repo) -> Reply:
        """The Git LFS batch API: for each object not stored yet, where to PUT it (no verify step)."""
        self._require_user()
        objects = []
        for obj in json.loads(self.body)["objects"]:
            entry: dict = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub._lfs_objects:  # no actions = already there, nothing to send
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs-upload/{obj['oid']}"}}
            objects.append(entry)
        return self._json({"transfer": "basic", "objects": objects},
                          headers={"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_put(self, oid: str) -> Reply:
        """The "signed URL" an LFS object is PUT to (no Authorization, as with the Hub's S3 URLs)."""
        if hashlib.sha256(self.body).hexdigest() != oid:
            raise HubError(400, None, f"Content does not match sha256 {oid}")
        self.hub._lfs_objects[oid] = self.body
        return 200, {}, b""


# -------------------------------------------------------------------- pointing huggingface_hub at the server
def use_loopback_hub(hub: LoopbackHub, hf_home: str | os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Point huggingface_hub at `hub` and at an empty `hf_home`, through `monkeypatch` (so it is undone).

    huggingface_hub reads its environment once, at import, into `huggingface_hub.constants`; its functions
    read those attributes at call time, so patching them works in this process. A few values are copied at
    import too: the default `HfApi` behind `huggingface_hub.model_info` & co. keeps its own `endpoint`, the
    cache scanner imports HF_HUB_CACHE by value. The environment is set as well, for child processes.
    """
    import huggingface_hub
    import huggingface_hub.hf_api  # a lazy attribute of the package until the module is imported
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    home = Path(hf_home)
    home.mkdir(parents=True, exist_ok=True)
    paths = {"HF_HOME": home, "HF_HUB_CACHE": home / "hub", "HF_ASSETS_CACHE": home / "assets",
             "HF_XET_CACHE": home / "xet", "HF_TOKEN_PATH": home / "token"}
    flags = {"HF_HUB_DISABLE_TELEMETRY": True,  # also stops the user agent's `/api/agent-harnesses` fetch
             "HF_HUB_DISABLE_XET": True,  # hf_xet is installed: LFS uploads would go to a Xet server
             "HF_HUB_DISABLE_UPDATE_CHECK": True}

    def setattr_if_present(target: object, name: str, value: object) -> None:
        if hasattr(target, name):  # names move between huggingface_hub versions: patch what exists
            monkeypatch.setattr(target, name, value)

    # The environment, for child processes and anything that reads it late.
    for name, value in {**paths, "HF_ENDPOINT": hub.url, **dict.fromkeys(flags, "1")}.items():
        monkeypatch.setenv(name, str(value))
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN", "HF_OIDC_RESOURCE",
                 "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_CACHE", "HUGGINGFACE_ASSETS_CACHE",
                 "HUGGINGFACE_CO_STAGING", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_STORED_TOKENS_PATH"):
        monkeypatch.delenv(name, raising=False)
    for name in ("NO_PROXY", "no_proxy"):  # httpx honours HTTP(S)_PROXY: keep loopback traffic off proxies
        monkeypatch.setenv(name, ",".join(filter(None, [os.environ.get(name), "127.0.0.1", "localhost"])))

    # The constants huggingface_hub read at import.
    for name, value in {**paths, "HUGGINGFACE_HUB_CACHE": paths["HF_HUB_CACHE"],
                        "HUGGINGFACE_ASSETS_CACHE": paths["HF_ASSETS_CACHE"],
                        "HF_STORED_TOKENS_PATH": home / "stored_tokens",
                        "AGENT_HARNESSES_PATH": home / ".agent_harnesses.json",
                        "CHECK_FOR_UPDATE_DONE_PATH": home / ".check_for_update_done",
                        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": home / ".check_for_skill_update_done"}.items():
        setattr_if_present(constants, name, str(value))
    for name, value in {**flags, "HF_HUB_OFFLINE": False, "HF_HUB_DISABLE_IMPLICIT_TOKEN": False,
                        "ENDPOINT": hub.url,
                        "HUGGINGFACE_CO_URL_TEMPLATE": hub.url + "/{repo_id}/resolve/{revision}/{filename}",
                        "HF_URL_HOSTS": frozenset(getattr(constants, "HF_URL_HOSTS", ())) | {"127.0.0.1"}}.items():
        setattr_if_present(constants, name, value)
    # Copies taken at import time.
    setattr_if_present(huggingface_hub.hf_api.api, "endpoint", hub.url)
    if "huggingface_hub.utils._cache_manager" in sys.modules:
        setattr_if_present(sys.modules["huggingface_hub.utils._cache_manager"], "HF_HUB_CACHE", str(paths["HF_HUB_CACHE"]))
    origin = ("http", "127.0.0.1", int(hub.url.rsplit(":", 1)[1]))  # redirects to it keep the token
    setattr_if_present(_http, "_HUB_ORIGINS", frozenset(getattr(_http, "_HUB_ORIGINS", ())) | {origin})
    if "datasets.config" in sys.modules:  # `datasets` copies HF_ENDPOINT and the offline flag the same way
        config = sys.modules["datasets.config"]
        for name, value in {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": False, "HF_DATASETS_OFFLINE": False,
                            "HUB_DATASETS_URL": hub.url + "/datasets/{repo_id}/resolve/{revision}/{path}"}.items():
            setattr_if_present(config, name, value)
    # The shared httpx client was built under the old environment (proxies): drop it, a new one follows.
    _http.close_session()


def set_hub_offline(monkeypatch: pytest.MonkeyPatch, offline: bool = True) -> None:
    """Offline mode as HF_HUB_OFFLINE=1 gives it: the library reads `constants.HF_HUB_OFFLINE` (set from
    the environment at import), so the environment variable alone would only reach child processes."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    if "datasets.config" in sys.modules:
        monkeypatch.setattr(sys.modules["datasets.config"], "HF_HUB_OFFLINE", offline, raising=False)


# Registered as `loopback_hub`; the function has another name so that a test module can import it without
# its tests' `loopback_hub` parameters shadowing an imported name (ruff F811).
@pytest.fixture(name="loopback_hub")
def loopback_hub_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    """A started `LoopbackHub` that huggingface_hub talks to, with HF_HOME at `tmp_path / "hf_home"`.

    Import it with `from tests.hub_server import loopback_hub_fixture  # noqa: F401`.
    The valid token is `loopback_hub.token`; no token is sent unless a test passes one or sets HF_TOKEN.
    """
    from huggingface_hub.utils import _http

    hub = LoopbackHub().start()
    try:
        use_loopback_hub(hub, tmp_path / "hf_home", monkeypatch)
        yield hub
    finally:
        hub.stop()
        _http.close_session()  # its pooled connections point at the stopped server


def resolve_path(repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> str:
    """The raw request path of a `resolve` download, as it appears in `hub.requests`."""
    return f"/{URL_PREFIX[repo_type]}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"
