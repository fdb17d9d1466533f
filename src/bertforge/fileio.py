"""Small file helpers shared by every module: atomic writes, so a crash never leaves half a file; UTF-8
decoding whose error names the file, the line and the byte, which every reader turns into its own error type;
`DataFormatError`, the located error of every reader of users' files; streaming decompression by suffix;
the exclusive lock a run holds on its directory (`run_lock`); and file fingerprints (`file_fingerprint`),
by which a resumed run checks that its inputs are the ones it started with.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file so that a crash leaves either the old file or the new one, never half of one."""
    write_bytes_atomic(path, text.encode("utf-8"))


def file_mode() -> int:
    """The permissions a new file gets from the user's umask (mkstemp's are always 0600, which would
    shut the other users of a shared model or run directory out)."""
    try:  # Linux says it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: read it by setting it, and put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, file_mode())
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename.

    For writers that want a file name rather than bytes (safetensors, torch.save, numpy).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, file_mode())  # after the writer: some (safetensors) create the file anew
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except Exception as exc:
        Path(tmp).unlink(missing_ok=True)
        if not isinstance(exc, OSError) and _disk_full(path.parent):
            # torch.save and safetensors report a full disk in their own words ("unexpected pos",
            # "SafetensorError"): say it as what it is, naming the file
            raise OSError(errno.ENOSPC, f"no space left on the device writing {path} "
                                        f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _disk_full(directory: Path) -> bool:
    """Whether the file system of `directory` has (almost) no space left."""
    import shutil

    try:
        return shutil.disk_usage(directory).free < 1 << 20
    except OSError:
        return False


class DataFormatError(ValueError):
    """Input that a reader cannot use, located as `file:line: field: what is wrong`.

    `line` is 1-based (None when the problem is not on one line); `field` names the column, key or
    JSON path concerned (None when the whole line is at fault).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


# ------------------------------------------------------------------------------------------------
# reading UTF-8
# ------------------------------------------------------------------------------------------------
class NotUtf8Error(ValueError):
    """Bytes that are not UTF-8, located: `path:line: not UTF-8 text (b'\\xe9' at byte 4 of the line)`.

    `line` is 1-based, `byte` the 1-based position in that line, `offset` the 0-based position in the
    bytes decoded, `bad` the offending bytes; `detail` is the parenthesised part, for callers that word
    their own message around it.
    """

    def __init__(self, path: str | os.PathLike[str], line: int, byte: int, offset: int, bad: bytes) -> None:
        self.path, self.line, self.byte, self.offset, self.bad = str(path), line, byte, offset, bad
        self.detail = f"{bad!r} at byte {byte} of the line"
        super().__init__(f"{self.path}:{line}: not UTF-8 text ({self.detail})")


def decode_utf8(data: bytes, path: str | os.PathLike[str], first_line: int = 1) -> str:
    """`data`, read from `path` and starting at its line `first_line`, as text (a BOM stays: U+FEFF).

    Bytes that are not UTF-8 raise `NotUtf8Error` naming the file, the line and the byte.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        raise NotUtf8Error(path, first_line + data.count(b"\n", 0, exc.start), exc.start - line_start + 1,
                           exc.start, data[exc.start:exc.end]) from None


def read_utf8_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a UTF-8 file without their endings, split on "\\n" only (a stray \\x1c or \\u2028 inside
    a sentence stays in it) and without a trailing "\\r"; a BOM at the start is dropped. Bytes that are
    not UTF-8 raise `NotUtf8Error`, located."""
    lines = decode_utf8(Path(path).read_bytes(), path).removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# ------------------------------------------------------------------------------------------------
# compressed inputs
# ------------------------------------------------------------------------------------------------
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def compression_of(path: str | os.PathLike[str]) -> str | None:
    """The compression a file's name announces ("gz", "bz2", "xz", "zst") or None for a plain file."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in COMPRESSED_SUFFIXES else None


def strip_compression(path: str | os.PathLike[str]) -> Path:
    """`corpus.jsonl.gz` -> `corpus.jsonl`: the name whose suffix says the format inside."""
    path = Path(path)
    return path.with_suffix("") if compression_of(path) else path


def open_binary(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for reading bytes, decompressed on the fly when its suffix says so (.gz, .bz2, .xz,
    .zst); a streaming reader, so a large file is never held whole in memory."""
    kind = compression_of(path)
    if kind == "gz":
        import gzip
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "bz2":
        import bz2
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if kind == "xz":
        import lzma
        return lzma.open(path, "rb")  # type: ignore[return-value]
    if kind == "zst":
        import io

        import zstandard
        # zstandard's reader has no readline: buffer it as the standard library's readers are
        return io.BufferedReader(zstandard.open(path, "rb"), 1 << 16)  # type: ignore[arg-type]
    return open(path, "rb")


# ------------------------------------------------------------------------------------------------
# the lock a run holds on its directory
# ------------------------------------------------------------------------------------------------
LOCK_FILE = ".bertforge.lock"


class RunLockedError(FileExistsError):
    """Another live process holds the run directory's lock; `holder` is what its lock file says
    (pid, host, started, command), as far as it could be read."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


@contextmanager
def run_lock(directory: str | os.PathLike[str], *, what: str = "run") -> Iterator[Path]:
    """Hold an exclusive lock on `directory` (created if need be) for the life of the block.

    The lock is `fcntl.flock` on `directory/.bertforge.lock`, which records the holder's pid, host,
    start time and command line. The kernel releases a flock when its process dies however it dies
    (SIGKILL, OOM), so a lock file left by a killed run is stale: its flock is not held, and the next
    run takes it over without a word. A live holder makes this raise `RunLockedError` naming its pid
    and host. The file is removed on a clean exit, and the directory too if this made it and the run
    left nothing in it (a run that failed on its input). Locks are per open file, so a second `run_lock` of
    the same directory in the same process is refused too. On a filesystem without flock (some
    network mounts) the run goes on unlocked.
    """
    import fcntl

    directory = Path(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            who = f"pid {holder.get('pid', '?')}" + (f" on {holder['host']}" if holder.get("host") else "")
            since = f", since {holder['started']}" if holder.get("started") else ""
            raise RunLockedError(f"{directory} is in use by another {what} ({who}{since}); wait for it to end, "
                                 f"stop it, or use another output directory", holder) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            fd = -1  # flock not supported here: better an unlocked run than none
            break
        # the file may have been removed (by its holder's clean exit) between our open and our flock:
        # then we hold the lock of a file nobody else will open, so start again
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    if fd < 0:
        yield path
        return
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": _command_line()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while still holding it (see the inode check above)
        os.close(fd)  # releases the flock
        if created:
            with contextlib.suppress(OSError):  # not empty: the run's output stays
                directory.rmdir()


def _lock_holder(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _command_line() -> str:
    import sys

    return " ".join(sys.argv)[:500]


# ------------------------------------------------------------------------------------------------
# file fingerprints
# ------------------------------------------------------------------------------------------------
def file_fingerprint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies a file's contents: its size, its modification time and the SHA-256 of its bytes."""
    path = Path(path)
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def same_file_contents(recorded: dict[str, Any], path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` still holds what `recorded` (a `file_fingerprint`) describes.

    Another size differs; the same size and modification time is taken as the same file without
    reading it; otherwise (a copy, a `touch`) the SHA-256 decides.
    """
    try:
        stat = Path(path).stat()
    except OSError:
        return False
    if stat.st_size != recorded.get("size"):
        return False
    if stat.st_mtime_ns == recorded.get("mtime_ns"):
        return True
    return file_fingerprint(path)["sha256"] == recorded.get("sha256")
