"""The one way files of a run directory or judge set are written and read: atomic, confined, bounded.

A run directory (or judge set) may come from someone else, who can plant
symbolic links, FIFOs or huge files in it. Every file the project writes goes
through :func:`atomic_write_bytes` (or :func:`open_append` for the two files
that grow: ``commands.jsonl`` and a predictions CSV), and every file it reads
from such a directory through :func:`read_bytes`:

- **Writes never follow a symbolic link.** The folders from the *root* (the run
  directory, the judge set, the ``--out`` folder) down to the file are opened
  one by one with ``O_NOFOLLOW`` relative to each other, so a planted link in
  place of a folder is refused (:class:`UnsafeFile`) and nothing is created
  outside. The data goes to a temporary file created with ``O_EXCL |
  O_NOFOLLOW`` in that checked folder, fsynced and renamed over the name: a
  link in place of the file is replaced, never written through. Appends open the
  file with ``O_NOFOLLOW`` and require a regular file.
- **Reads are bounded and never block.** A file is opened with ``O_NONBLOCK``
  (a FIFO cannot stall the command) and read only when it is a regular file of
  at most ``max_bytes``; below a root, no component may be a link. A path named
  *inside* a file (a snapshot, an image) must be relative, without ``..``
  (:func:`inside`).
- **The root.** A caller passes ``root=``, or runs inside :func:`confined`
  (``with confined(run_dir): ...``): every write and read of a path under a
  confined root is checked from that root down. Elsewhere (a path the user gave
  on the command line) only the file's own name is protected; the folders are
  the user's.
- **Crashes.** A killed writer leaves a temporary ``.NAME.PID.XXXX.tmp`` file;
  :func:`clean_orphans` removes those of dead processes when a command next
  opens the directory (``RunStore.lock``, an export, a judge run).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import secrets
import stat
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

from robocasa_shift.errors import RunDirError

# Documented maxima of what a shared directory's files may hold (bytes on disk); larger files are refused.
MAX_FILE_BYTES = 256 * 2**20       # any file without a more specific limit
MAX_JSON_BYTES = 64 * 2**20        # a manifest, plan, record, trunk or sample JSON, an export's manifest.jsonl
MAX_RECORD_BYTES = 16 * 2**20      # one rollout record
MAX_IMAGE_BYTES = 16 * 2**20       # one PNG of a judge set (its pixels are capped again when decoded)
MAX_CSV_HEADER_BYTES = 2**20       # a CSV table's header line (a records table's is about 1 kB)
MAX_CSV_COLUMNS = 4096             # columns of a CSV table (a records table has about 60)

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_LINK_ERRNOS = {errno.ELOOP, errno.ENOTDIR, getattr(errno, "EMLINK", errno.ELOOP)}
# .NAME.PID.tmp (older writers) and .NAME.PID.HEX.tmp
_TMP = re.compile(r"^\..+\.(?P<pid>\d+)(\.[0-9a-f]{8})?\.tmp$")

_ROOTS: ContextVar[Tuple[str, ...]] = ContextVar("robocasa_shift_confined_roots", default=())


class UnsafeFile(RunDirError, OSError):
    """A file or folder of a shared directory that is refused: a symbolic link, a FIFO or device, or too large.

    It is an ``OSError`` too, so code that skips unreadable files skips it (with this message).
    """

    def __init__(self, message: str, path: Any = None):
        super().__init__(message)
        self.strerror, self.filename = message, None if path is None else str(path)

    def __str__(self) -> str:
        return self.strerror


# --------------------------------------------------------------------------- roots


@contextlib.contextmanager
def confined(root: Path | str) -> Iterator[Path]:
    """Within the block, every write and read of a path under ``root`` is checked from ``root`` down."""
    token = _ROOTS.set(_ROOTS.get() + (os.path.abspath(root),))
    try:
        yield Path(root)
    finally:
        _ROOTS.reset(token)


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _anchor(path: Path, root: Optional[Path | str]) -> Tuple[Optional[str], List[str]]:
    """(root, parts of ``path`` below it); root None when ``path`` is under no root (given or confined)."""
    absolute = os.path.abspath(path)
    if root is None:
        root = next((r for r in _ROOTS.get() if _is_under(absolute, r)), None)
        if root is None:
            return None, []
    root = os.path.abspath(root)
    if not _is_under(absolute, root) or absolute == root:
        raise UnsafeFile(f"{path}: not a file inside {root}; refused", path)
    return root, list(Path(os.path.relpath(absolute, root)).parts)


def inside(root: Path | str, relative: Any, what: str = "path") -> Path:
    """``root / relative`` for a path named inside a file of ``root``: relative, no ``..``, no empty part.

    Raises:
        UnsafeFile: an absolute path, a ``..``, a backslash or NUL, or not a string.
    """
    if not isinstance(relative, str) or not relative or "\x00" in relative or "\\" in relative:
        raise UnsafeFile(f"{root}: {what} {relative!r} is not a relative path inside it; refused", root)
    parts = Path(relative).parts
    if Path(relative).is_absolute() or any(p in ("..", "") for p in parts):
        raise UnsafeFile(f"{root}: {what} {relative!r} points outside it; refused", root)
    return Path(root) / relative


def _open_dirs(root: str, parts: List[str], create: bool, path: Path, verb: str) -> int:
    """A descriptor of ``root/parts...``, each part opened with O_NOFOLLOW below the last (created if asked)."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
        Path(root).mkdir(parents=True, exist_ok=True)
        fd = os.open(root, _DIR_FLAGS)
    except NotADirectoryError:
        raise UnsafeFile(f"{root} is not a folder; cannot {verb} {path}", root) from None
    try:
        for i, part in enumerate(parts):
            try:
                child = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                child = _open_child(part, fd, root, parts[: i + 1], path, verb)
            except OSError as exc:
                if exc.errno not in _LINK_ERRNOS:
                    raise
                raise _link_error(root, parts[: i + 1], path, verb) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_child(part: str, fd: int, root: str, parts: List[str], path: Path, verb: str) -> int:
    try:
        return os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in _LINK_ERRNOS:
            raise
        raise _link_error(root, parts, path, verb) from None


def _link_error(root: str, parts: List[str], path: Path, verb: str) -> UnsafeFile:
    where = os.path.join(root, *parts)
    return UnsafeFile(f"{where} is a symbolic link or not a folder; refusing to {verb} {path} through it "
                      f"(a shared directory may not hold links)", where)


def fsync_directory(directory: Path) -> None:
    """Flush a directory's entries to disk: without it a rename can be lost in a crash after it returned."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writing


def atomic_write_bytes(path: Path | str, data: bytes, root: Optional[Path | str] = None) -> None:
    """Write ``data`` to a temporary file and rename it over ``path``: readers see all of it or none.

    The folders from the root (``root``, a :func:`confined` one, or else ``path``'s own folder) down
    are opened without following links; the temporary file is created with ``O_EXCL | O_NOFOLLOW``,
    fsynced before the rename and its folder after it, so the new name survives a crash.

    Raises:
        UnsafeFile: a folder on the way is a symbolic link (nothing is written).
        RunDirError: the file cannot be written (the message says why).
    """
    path = Path(path)
    base, parts = _anchor(path, root)
    if base is None:
        base, parts = os.path.abspath(path.parent), [path.name]
    name = parts[-1]
    try:
        dfd = _open_dirs(base, parts[:-1], True, path, "write")
    except OSError as exc:
        if isinstance(exc, UnsafeFile):
            raise
        raise RunDirError(f"{path}: cannot be written ({exc.strerror})") from None
    tmp = f".{name[:180]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o666,
                     dir_fd=dfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    finally:
        os.close(dfd)


def atomic_write_text(path: Path | str, text: str, root: Optional[Path | str] = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), root)


def atomic_write_json(path: Path | str, data: Any, root: Optional[Path | str] = None) -> None:
    """:func:`atomic_write_bytes` of ``data`` as indented JSON with sorted keys."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=True), root)


def write_csv(frame, path: Path | str, root: Optional[Path | str] = None, **to_csv: Any) -> None:
    """A pandas frame as CSV (``index=False`` unless given), through :func:`atomic_write_bytes`."""
    atomic_write_text(path, frame.to_csv(**{"index": False, **to_csv}), root)


def save_figure(fig, path: Path | str, root: Optional[Path | str] = None, **savefig: Any) -> None:
    """A matplotlib figure rendered in memory (format from the suffix), through :func:`atomic_write_bytes`."""
    buffer = io.BytesIO()
    fig.savefig(buffer, **{"format": Path(path).suffix.lstrip(".") or "png", **savefig})
    atomic_write_bytes(path, buffer.getvalue(), root)


def _open_leaf(path: Path, root: Optional[Path | str], flags: int, create: bool, verb: str,
               mode: int = 0o666) -> int:
    """A descriptor of the regular file ``path`` (never through a link below the root; never blocking)."""
    base, parts = _anchor(Path(path), root)
    if base is None:
        base, parts = os.path.abspath(Path(path).parent), [Path(path).name]
    dfd = _open_dirs(base, parts[:-1], create, Path(path), verb)
    try:
        fd = os.open(parts[-1], flags | _NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(f"{path} is a symbolic link; refusing to {verb} it (a shared directory may not hold "
                             f"links)", path) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.ENODEV, errno.ETXTBSY):
            raise UnsafeFile(f"{path} is not a regular file; refusing to {verb} it", path) from None
        raise
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(f"{path} is not a regular file (a FIFO, device, socket or folder); refusing to {verb} it",
                             path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: Path | str, root: Optional[Path | str] = None, text: bool = True):
    """``path`` opened for appending (created if missing): a regular file, never through a symbolic link.

    Raises:
        UnsafeFile: the file or a folder below the root is a link, or the file is not a regular file.
    """
    try:
        fd = _open_leaf(Path(path), root, os.O_WRONLY | os.O_APPEND | os.O_CREAT, True, "append to")
    except UnsafeFile:
        raise
    except OSError as exc:
        raise RunDirError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    return os.fdopen(fd, "a", newline="", encoding="utf-8") if text else os.fdopen(fd, "ab")


def append_text(path: Path | str, text: str, root: Optional[Path | str] = None) -> None:
    """Append ``text`` to ``path`` (see :func:`open_append`)."""
    with open_append(path, root) as f:
        f.write(text)


def move(src: Path | str, dest: Path | str, root: Optional[Path | str] = None) -> None:
    """Rename ``src`` to ``dest`` (its folders created), both reached without a link below the root.

    Raises:
        UnsafeFile: a folder on either way is a symbolic link (nothing is moved).
    """
    src, dest = Path(src), Path(dest)
    ends = []
    try:
        for path, create in ((src, False), (dest, True)):
            base, parts = _anchor(path, root)
            if base is None:
                base, parts = os.path.abspath(path.parent), [path.name]
            ends.append((_open_dirs(base, parts[:-1], create, path, "move"), parts[-1]))
        os.replace(ends[0][1], ends[1][1], src_dir_fd=ends[0][0], dst_dir_fd=ends[1][0])
        os.fsync(ends[1][0])
    finally:
        for fd, _ in ends:
            os.close(fd)


def open_lock(path: Path | str, root: Optional[Path | str] = None) -> int:
    """A read-write descriptor of a lock file (created if missing), never through a symbolic link."""
    return _open_leaf(Path(path), root, os.O_RDWR | os.O_CREAT, True, "lock", 0o644)


# --------------------------------------------------------------------------- reading


def read_bytes(path: Path | str, root: Optional[Path | str] = None, max_bytes: int = MAX_FILE_BYTES,
               what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, opened without blocking.

    Below a root (given or :func:`confined`) no component may be a symbolic link; elsewhere links
    are followed (the path is the user's) but the file must still be regular and small enough.

    Raises:
        FileNotFoundError: no such file.
        UnsafeFile: a link below the root, a FIFO, device or folder, or more than ``max_bytes``.
        OSError: another reason it cannot be read.
    """
    path = Path(path)
    base, _ = _anchor(path, root)
    if base is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafeFile(f"{path} is not a regular file (a FIFO, device, socket or folder); refusing to "
                                 f"read it", path)
        except BaseException:
            os.close(fd)
            raise
    else:
        fd = _open_leaf(path, root, os.O_RDONLY, False, "read")
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise UnsafeFile(f"{path}: {size} bytes, more than a {what} may hold ({max_bytes}); refused", path)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UnsafeFile(f"{path}: more than a {what} may hold ({max_bytes} bytes); refused", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: Path | str, root: Optional[Path | str] = None, max_bytes: int = MAX_FILE_BYTES,
              what: str = "file") -> str:
    """:func:`read_bytes` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_bytes(path, root, max_bytes, what).decode("utf-8", errors="replace")


def read_json(path: Path | str, root: Optional[Path | str] = None, max_bytes: int = MAX_JSON_BYTES,
              what: str = "JSON file") -> Any:
    """A JSON file read with :func:`read_bytes`; a file that is not JSON is a :class:`RunDirError` naming it."""
    data = read_bytes(path, root, max_bytes, what)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc})") from None


def csv_header(data: bytes, path: Path | str, max_bytes: int = MAX_CSV_HEADER_BYTES,
               max_columns: int = MAX_CSV_COLUMNS) -> List[str]:
    """The column names of a CSV table's first line, read from at most ``max_bytes`` of it.

    A reader then asks pandas for the columns it needs only (``usecols``): a table of a million columns
    is refused here, in milliseconds, instead of being parsed whole.

    Raises:
        ValueError: a header longer than ``max_bytes`` or with more than ``max_columns`` columns, or one
            that is not CSV (the message names the file).
    """
    import csv

    head = data[3:max_bytes + 4] if data.startswith(b"\xef\xbb\xbf") else data[:max_bytes + 1]  # a UTF-8 BOM
    end = head.find(b"\n")
    if end < 0 and len(data) > max_bytes:
        raise ValueError(f"{path}: its header line is longer than {max_bytes} bytes; not a table this project reads")
    line = head[:end if end >= 0 else len(head)].decode("utf-8", errors="replace")
    try:
        header = next(csv.reader([line]), [])
    except csv.Error as exc:
        raise ValueError(f"{path}, line 1: not a CSV header ({exc})") from None
    if len(header) > max_columns:
        raise ValueError(f"{path}: its header has {len(header)} columns, more than a table this project reads "
                         f"({max_columns})")
    return header


def is_regular_file(path: Path | str, root: Optional[Path | str] = None) -> bool:
    """Whether ``path`` is a regular file reached without a link below the root (never blocks)."""
    try:
        os.close(_open_leaf(Path(path), root, os.O_RDONLY, False, "read"))
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- crashes


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def clean_orphans(root: Path | str) -> List[Path]:
    """Remove the temporary files a killed writer left under ``root`` (its process is gone); return them.

    Links are never followed; a temporary file of a live process (another command writing now) is kept.
    """
    removed: List[Path] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in names:
            match = _TMP.match(name)
            if match and not _alive(int(match["pid"])):
                path = Path(folder) / name
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(path).st_mode):
                        os.unlink(path)
                        removed.append(path)
    return removed


__all__ = ["MAX_CSV_COLUMNS", "MAX_CSV_HEADER_BYTES", "MAX_FILE_BYTES", "MAX_IMAGE_BYTES", "MAX_JSON_BYTES",
           "MAX_RECORD_BYTES", "UnsafeFile", "append_text", "atomic_write_bytes", "atomic_write_json", "atomic_write_text",
           "clean_orphans", "confined", "csv_header", "fsync_directory", "inside", "is_regular_file", "move",
           "open_append", "open_lock", "read_bytes", "read_json", "read_text", "save_figure", "write_csv"]
