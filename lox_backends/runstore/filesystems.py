"""Where runs are kept: a local folder, or a folder in a bucket (``s3://``, ``gs://``...).

A place is a string: a local path, or a URI ``scheme://bucket/key``. Local paths
go through the operating system as they always did (``os.replace``, ``fsync``);
a URI goes through a `pyarrow.fs` filesystem: pyarrow's own for ``s3://``,
``gs://`` (``gcs://``), ``abfs://``, ``hdfs://``, fsspec's for the other
schemes it knows (``memory://``, ``oss://``...) where fsspec and the scheme's
package are installed. ``file://`` URIs are local paths. Credentials and
endpoints come from the standard environment of each store (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for an
S3-compatible server; for GCS: ``GOOGLE_APPLICATION_CREDENTIALS``).

Writes are atomic everywhere: a local file is written under a hidden name and
renamed into place; an object store (S3, GCS, Azure) makes an upload visible
only once it completes, so a whole file is uploaded in one request (or one
multipart upload) under its final name; other filesystems get a hidden name
(`lox_backends.runstore.layout.upload_temp_name`) and a move. Object stores
have no fsync: a completed upload is already stored durably, so `fsync` does
nothing there. Where runs will be written is checked before: a bucket by
`resolve` (``check=True``), a local folder by `check_writable`.

Every remote operation is bounded in time: `time_limit` sets the limit for the
calls a thread makes (`DEFAULT_TIME_LIMIT`, 60 s, otherwise), an operation still
running after `SLOW_OPERATION` seconds is warned about while lox waits, and one
still running at the limit raises `TimeoutError` naming the URI. pyarrow cannot
interrupt a request: each runs in a daemon thread that lox stops waiting for,
and pyarrow's own time limits (S3's connect and request timeouts and attempts,
GCS's retry limit) end it later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import numbers
import os
import posixpath
import queue
import re
import secrets
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from lox_backends.logger.shutdown import flush_before_exit_handlers
from lox_backends.runstore import layout

# scheme://, the scheme at least two characters long: "C://x" is a Windows path.
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")
# Filesystems that make an upload visible only when it completes, whole (pyarrow's names).
_ATOMIC_UPLOADS = {"s3", "gcs", "abfs"}
# The same for fsspec's protocols; any other fsspec filesystem writes under a hidden name, then moves.
_ATOMIC_FSSPEC = {"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "oss", "r2"}
# What credentials and endpoints each store reads: the filesystems are made anew when these change.
_ENVIRONMENT = ("AWS_", "GOOGLE_", "CLOUD_STORAGE_", "STORAGE_EMULATOR_HOST", "AZURE_", "ARROW_", "HADOOP_")
CREDENTIALS_HINT = (
    "lox takes credentials and endpoints from the standard environment: for S3, AWS_ACCESS_KEY_ID, "
    "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE and ~/.aws), AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL for an "
    "S3-compatible server; for gs://, GOOGLE_APPLICATION_CREDENTIALS, and STORAGE_EMULATOR_HOST for an emulator"
)
_SHORT_HINT = "Credentials and endpoints come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)."

# The time limit of a remote operation where the caller set none: the Logger's default timeout
# (lox_backends.logger.logger.DEFAULT_TIMEOUT, not imported: the logger imports this module).
DEFAULT_TIME_LIMIT = 60.0
# An operation still running this long is warned about while lox waits (as trackers' calls are).
SLOW_OPERATION = 5.0
# pyarrow's own limits, so that a request lox stopped waiting for ends too, well within the default limit.
# S3, per attempt: connecting, and a transfer stalled (no byte for that long: not a slow one); a write to a
# frozen server then ends after about 28 s, a listing after 10 s. Interpreter exit waits for S3 requests
# still running (pyarrow's finalizer), so this also bounds how long a frozen server holds exit up.
S3_CONNECT_TIMEOUT = 3.0
S3_REQUEST_TIMEOUT = 3.0
S3_ATTEMPTS = 3
# How long GCS retries a failing request (google-cloud-cpp's default, 15 minutes, was the hang of an
# endpoint that refuses connections). Its delays between attempts double: it gives up within twice this.
GCS_RETRY_LIMIT = 15.0


def is_uri(path: str) -> bool:
    """Whether `path` is a URI of a remote store (``file://`` URIs are local paths)."""
    if "://" not in path:  # most calls: a local path, told apart at once
        return False
    match = _URI.match(path)
    return match is not None and match.group(1).lower() != "file"


def resolve(target: str | os.PathLike[str], check: bool = False) -> str:
    """`target` as lox keeps it: a local path made absolute (a ``file://`` URI
    becomes one), or a URI without trailing slashes whose scheme a filesystem
    serves; with `check`, the bucket must exist and answer (`ValueError`,
    `ImportError` or `OSError` naming the URI and what to do, otherwise).

    >>> resolve("file:///tmp/runs") == os.path.abspath("/tmp/runs")
    True
    """
    path = os.fspath(target)
    match = _URI.match(path)
    if match is None:
        return os.path.abspath(path)
    if match.group(1).lower() == "file":
        parts = urllib.parse.urlsplit(path)
        return os.path.abspath(urllib.parse.unquote(parts.netloc + parts.path))
    uri = path.rstrip("/")
    if not urllib.parse.urlsplit(uri).netloc or "?" in uri or "#" in uri:
        raise ValueError(
            f"{path!r} is not a folder URI lox can use: write scheme://bucket/folder, without '?' or '#' "
            f"({CREDENTIALS_HINT})."
        )
    if check:
        wait = _Wait(uri)
        _store(uri, wait).check(uri, wait)
    else:
        _store(uri)
    return uri


# --- paths -------------------------------------------------------------------------------
def join(folder: str, *names: str) -> str:
    if is_uri(folder):
        return "/".join([folder.rstrip("/"), *names])
    return os.path.join(folder, *names)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_uri(path) else os.path.basename(path)


def parent(path: str) -> str:
    """The folder holding `path` (absolute for a local path)."""
    if is_uri(path):
        return posixpath.dirname(path.rstrip("/"))
    return os.path.dirname(os.path.abspath(path))


# --- reading ------------------------------------------------------------------------------
def kind(path: str) -> str | None:
    """``"dir"``, ``"file"``, or None where nothing is."""
    if not is_uri(path):
        return "dir" if os.path.isdir(path) else "file" if os.path.exists(path) else None
    wait = _Wait(path)
    store = _store(path, wait)
    info = store.call(path, lambda: store.fs.get_file_info(store.path(path)), "looking up", wait)
    return {pafs.FileType.Directory: "dir", pafs.FileType.File: "file"}.get(info.type)


def scan(folder: str, missing_ok: bool = False) -> list[tuple[str, bool, str]]:
    """(name, is a folder, path) of what `folder` holds, in no particular order."""
    if not is_uri(folder):
        try:
            with os.scandir(folder) as entries:
                return [(entry.name, entry.is_dir(), entry.path) for entry in entries]
        except FileNotFoundError:
            if missing_ok:
                return []
            raise
    wait = _Wait(folder)
    store = _store(folder, wait)
    selector = pafs.FileSelector(store.path(folder), allow_not_found=missing_ok)
    infos = store.call(folder, lambda: store.fs.get_file_info(selector), "listing", wait)
    return [(info.base_name, info.type == pafs.FileType.Directory, join(folder, info.base_name)) for info in infos]


def read_bytes(path: str) -> bytes:
    """A file's contents; `FileNotFoundError` where it is missing."""
    if not is_uri(path):
        with open(path, "rb") as f:
            return f.read()
    return read_buffer(path).to_pybytes()


def read_buffer(path: str) -> pa.Buffer:
    """A remote file's contents, read in one request (what Parquet readers take
    with ``pa.BufferReader``)."""
    wait = _Wait(path)
    return _store(path, wait).read(path, wait)


def mtime(path: str) -> float:
    """When a file was last modified (Unix seconds)."""
    if not is_uri(path):
        return os.path.getmtime(path)
    wait = _Wait(path)
    store = _store(path, wait)
    info = store.call(path, lambda: store.fs.get_file_info(store.path(path)), "looking up", wait)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {path!r}")
    return info.mtime.timestamp() if info.mtime is not None else 0.0


# --- writing ------------------------------------------------------------------------------
def makedirs(path: str) -> None:
    """Create a folder and its parents (object stores have no folders: nothing to do)."""
    if not is_uri(path):
        os.makedirs(path, exist_ok=True)
        return
    wait = _Wait(path)
    store = _store(path, wait)
    if not store.atomic_uploads:
        store.call(path, lambda: store.fs.create_dir(store.path(path), recursive=True), "creating the folder", wait)


def put(path: str, data: bytes | pa.Buffer) -> None:
    """Write a remote file whole, atomically: no reader ever sees part of it."""
    wait = _Wait(path)
    store = _store(path, wait)
    if store.atomic_uploads:
        store.call(path, lambda: store.upload(store.path(path), data), "writing", wait)
        return
    final = store.path(path)
    temp = posixpath.join(posixpath.dirname(final),
                          layout.upload_temp_name(posixpath.basename(final), secrets.token_hex(4)))

    def write_and_move() -> None:
        store.upload(temp, data)
        try:
            store.fs.move(temp, final)
        except BaseException:
            _delete_quietly(store.fs, temp)
            raise

    store.call(path, write_and_move, "writing", wait)


def fsync(path: str) -> None:
    """Flush a local file, or a folder's entries (renames into it), to disk. A
    remote store keeps what it acknowledged: nothing to do there."""
    if is_uri(path) or (os.name == "nt" and os.path.isdir(path)):  # folders cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(folder: str, what: str) -> None:
    """Check that the local `folder` can be made and written, by making and
    removing a uniquely named hidden folder in the nearest part of its path that
    exists; `ValueError` naming `what` (e.g. "the parquet backend's folder"),
    the folder and why where that fails: refused when a backend is created,
    rather than losing every batch later. The folder itself is neither made nor
    removed (the backend makes it when it writes): a backend refused later in
    its creation leaves nothing behind, and processes or threads checking the
    same folder at once never remove one another's folders."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        os.rmdir(tempfile.mkdtemp(prefix=".lox-write-check-", dir=path))
    except OSError as e:
        raise ValueError(
            f"{what} {folder!r} cannot be written: {_why_unwritable(folder, e)}. "
            "Give a folder this process can write to."
        ) from e


def _why_unwritable(folder: str, error: OSError) -> str:
    path = folder
    while True:  # the nearest part of the path that exists
        if os.path.lexists(path):
            if not os.path.isdir(path):
                return f"a file is in the way: {path!r}"
            break
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    if error.errno == errno.EROFS:
        return "read-only file system"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return (os.strerror(error.errno) if error.errno else str(error)).lower()


# --- time limits --------------------------------------------------------------------------
_limits = threading.local()  # .seconds: what `time_limit` set in this thread
_UNSET = object()
_T = TypeVar("_T")


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Bound every remote operation this thread starts inside the block by
    `seconds` (None: no limit; `DEFAULT_TIME_LIMIT` outside any block). An
    operation still running at the limit raises `TimeoutError` (an `OSError`)
    naming its URI; the request itself goes on in the background until
    pyarrow's own limits end it.

    >>> with time_limit(10):
    ...     current_time_limit()
    10
    """
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"time_limit takes seconds (a positive number) or None, not {seconds!r}.")
        if not seconds > 0:  # NaN included
            raise ValueError(f"time_limit takes seconds > 0 (or None for no limit), not {seconds!r}.")
        if seconds >= threading.TIMEOUT_MAX:  # infinity included: what no wait can be given
            seconds = None
    previous = getattr(_limits, "seconds", _UNSET)
    _limits.seconds = seconds
    try:
        yield
    finally:
        if previous is _UNSET:
            del _limits.seconds
        else:
            _limits.seconds = previous


def current_time_limit() -> float | None:
    """The time limit of the remote operations this thread starts (seconds; None: no limit)."""
    return getattr(_limits, "seconds", DEFAULT_TIME_LIMIT)


def with_time_limit(function: Callable[..., _T]) -> Callable[..., _T]:
    """`function`, to run in another thread (a pool's) under the time limit in effect here
    (a thread starts with the default: it does not inherit the limit of the thread that made it)."""
    seconds = current_time_limit()

    def bounded(*args: Any, **kwargs: Any) -> _T:
        with time_limit(seconds):
            return function(*args, **kwargs)

    return bounded


class _Wait:
    """The time one storage call (`put`, `scan`...) may take, its steps together
    (finding the filesystem, then the request), and whether it was warned about."""

    __slots__ = ("uri", "limit", "began", "warned")

    def __init__(self, uri: str):
        self.uri = uri
        self.limit = current_time_limit()
        self.began = time.monotonic()
        self.warned = False

    def until(self, job: _Job, what: str) -> Any:
        """`job`'s result (or its exception), waited for within the limit: a
        `RuntimeWarning` after `SLOW_OPERATION` seconds, `TimeoutError` at the limit."""
        while True:
            elapsed = time.monotonic() - self.began
            if self.limit is not None and elapsed >= self.limit:
                raise TimeoutError(
                    f"lox: {what} {self.uri!r} did not finish within {self.limit:g} s; lox stopped waiting for it. "
                    f"Check that the store answers ({_endpoint_hint(self.uri)}), or give a longer timeout "
                    "(the Logger's timeout=, `lox sync --timeout`)."
                )
            checkpoints = [] if self.warned else [SLOW_OPERATION]
            if self.limit is not None:
                checkpoints.append(self.limit)
            pending = [point - elapsed for point in checkpoints if point > elapsed]
            if job.done.wait(min(pending) if pending else None):
                return job.outcome()
            if not self.warned and time.monotonic() - self.began >= SLOW_OPERATION:
                self.warned = True
                more = f"up to {self.limit:g} s in all" if self.limit is not None else "(no time limit)"
                warnings.warn(
                    f"lox: {what} {self.uri!r} has not finished after {SLOW_OPERATION:g} s; lox keeps waiting {more}. "
                    f"Check that the store answers ({_endpoint_hint(self.uri)}).",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def run(self, what: str, operation: Callable[[], Any]) -> Any:
        """`operation()` in a thread of the pool, waited for within the limit;
        at most `MAX_RUNNING` at once per store (those given up on included)."""
        slots = _slots.get(_prefix(self.uri)) or _slots.setdefault(_prefix(self.uri), threading.Semaphore(MAX_RUNNING))
        timeout = None if self.limit is None else max(0.0, self.limit - (time.monotonic() - self.began))
        if not slots.acquire(timeout=timeout):
            raise TimeoutError(
                f"lox: {what} {self.uri!r} could not start within {self.limit:g} s: {MAX_RUNNING} earlier operations "
                f"on {_prefix(self.uri)} are still waiting for an answer. Check that the store answers "
                f"({_endpoint_hint(self.uri)}), or give a longer timeout (the Logger's timeout=, `lox sync --timeout`)."
            )
        job = _Job(operation, slots.release)
        _start(job)
        return self.until(job, what)


# Operations running at once on one store (scheme://bucket), those lox stopped waiting for included: a store
# that stopped answering holds at most this many threads; further calls wait for one of them, within their limit.
MAX_RUNNING = 16
_slots: dict[str, threading.Semaphore] = {}
# Threads of the pool kept waiting for work (one per call running at once, beyond that they end).
_MAX_IDLE = 8
_idle: list[queue.SimpleQueue] = []
_idle_lock = threading.Lock()


class _Job:
    """An operation run in a thread of the pool, and its outcome."""

    __slots__ = ("operation", "done", "result", "error", "finished")

    def __init__(self, operation: Callable[[], Any], finished: Callable[[], None] | None = None):
        self.operation: Callable[[], Any] | None = operation
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = finished  # called once it ran (a slot given back)

    def execute(self) -> None:
        operation, self.operation = self.operation, None  # what it holds (a batch's bytes) freed once it ran
        try:
            if operation is not None:
                self.result = operation()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, raised there
            self.error = error
        del operation

    def signal(self) -> None:
        if self.finished is not None:
            self.finished()
        self.done.set()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


def _start(job: _Job) -> None:
    """Run `job` in an idle thread of the pool, or a new one; here, unbounded, where
    no thread can start (the interpreter exits)."""
    with _idle_lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        try:
            threading.Thread(target=_serve, args=(inbox,), name="lox-storage", daemon=True).start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            job.execute()
            job.signal()
            return
    inbox.put(job)


def _serve(inbox: queue.SimpleQueue) -> None:
    """A thread of the pool: runs the jobs put in its inbox, one at a time."""
    while True:
        job = inbox.get()
        job.execute()
        with _idle_lock:  # idle again before the caller hears of it: its next call finds this thread
            keep = len(_idle) < _MAX_IDLE
            if keep:
                _idle.append(inbox)
        job.signal()
        del job
        if not keep:
            return


def _prefix(uri: str) -> str:
    """``scheme://authority`` of a URI: the store it is in."""
    parts = urllib.parse.urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}"


def _endpoint_hint(uri: str) -> str:
    """Where the store of `uri` is reached, for messages: the endpoint variable in effect, or what sets one."""
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in ("s3", "s3a"):
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(name):
                return f"its endpoint {name}={_without_userinfo(os.environ[name])!r}"
        return "the network to AWS S3; AWS_ENDPOINT_URL sets the endpoint of an S3-compatible server"
    if scheme in ("gs", "gcs"):
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            return f"its endpoint STORAGE_EMULATOR_HOST={_without_userinfo(os.environ['STORAGE_EMULATOR_HOST'])!r}"
        return "the network to Google Cloud Storage; STORAGE_EMULATOR_HOST sets the endpoint of an emulator"
    return f"the network to {_prefix(uri)}"


def _without_userinfo(url: str) -> str:
    """`url` without a ``user:password@`` part: messages never show secrets."""
    return re.sub(r"//[^/@]*@", "//", url)


# --- the filesystems ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Store:
    """A remote filesystem for the URIs starting with `prefix` (``scheme://authority``)."""

    prefix: str
    fs: pafs.FileSystem
    to_path: Callable[[str], str]  # URI -> the filesystem's path
    atomic_uploads: bool
    bucket: bool  # the first part of a path is a bucket (S3, GCS, Azure)

    def path(self, uri: str) -> str:
        return self.to_path(uri)

    def call(self, uri: str, operation: Callable, what: str, wait: _Wait | None = None):
        """`operation()` (`what` it does, for messages) within `wait`'s time limit,
        its OSError (a network or permission error) naming `uri`."""
        try:
            return (wait or _Wait(uri)).run(what, operation)
        except OSError as error:
            if uri in str(error):  # lox's own messages (TimeoutError included), pyarrow's naming the URI
                raise
            if isinstance(error, FileNotFoundError):
                raise FileNotFoundError(f"no such file or folder: {uri!r}") from error
            raise OSError(f"{uri!r}: {error}. {_SHORT_HINT}") from error

    def read(self, uri: str, wait: _Wait | None = None) -> pa.Buffer:
        def read() -> pa.Buffer:
            with self.fs.open_input_file(self.path(uri)) as f:  # its size known: one request (a stream: several)
                return f.read_buffer()

        return self.call(uri, read, "reading", wait)

    def upload(self, path: str, data: bytes | pa.Buffer) -> None:
        with self.fs.open_output_stream(path) as f:
            f.write(data)

    def check(self, uri: str, wait: _Wait | None = None) -> None:
        """The bucket exists and answers; `uri` is not a file."""
        path = self.path(uri)

        def look() -> pafs.FileType:
            try:
                if self.bucket:
                    bucket = path.split("/", 1)[0]
                    if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                        raise FileNotFoundError(
                            f"cannot write runs to {uri!r}: the bucket {bucket!r} does not exist (or these credentials "
                            f"cannot see it). Create it first, or fix the URI; {CREDENTIALS_HINT}."
                        )
                return self.fs.get_file_info(path).type
            except FileNotFoundError:
                raise
            except OSError as error:
                raise OSError(f"cannot write runs to {uri!r}: {error}. {CREDENTIALS_HINT}.") from error

        found = (wait or _Wait(uri)).run("checking", look)
        if found == pafs.FileType.File:
            raise ValueError(f"cannot write runs to {uri!r}: it is a file; give a folder (a prefix) instead.")


_stores: dict[tuple, _Store] = {}
_creating: dict[tuple, _Job] = {}  # stores being made: later callers wait for the same one
_stores_lock = threading.Lock()


def _store(uri: str, wait: _Wait | None = None) -> _Store:
    """The filesystem of `uri`'s store, made once per store and environment (within
    `wait`'s time limit: pyarrow may look for the bucket's region, credentials...)."""
    parts = urllib.parse.urlsplit(uri)
    prefix = f"{parts.scheme}://{parts.netloc}"
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    key = (prefix, environment)
    store = _stores.get(key)
    if store is not None:
        return store
    wait = wait or _Wait(uri)
    with _stores_lock:
        job = _creating.get(key)
        if job is None and key not in _stores:
            job = _creating[key] = _Job(lambda: _make_store(key, prefix, parts.scheme.lower()))
            _start(job)  # made in the background: a store that never answers holds one thread, not the lock
    if job is not None:
        try:
            wait.until(job, "connecting to")
        except TimeoutError:
            raise
        except OSError as error:  # pyarrow looks for the bucket's region, a credentials file...
            raise OSError(f"cannot use {uri!r}: {error}. {CREDENTIALS_HINT}.") from error
    # pyarrow shuts its S3 client down at exit: lox's exit flush (what a Logger still holds) goes first.
    flush_before_exit_handlers()
    return _stores[key]


def _make_store(key: tuple, prefix: str, scheme: str) -> None:
    """Make a store and keep it (even where its caller stopped waiting: the next call finds it)."""
    try:
        store = _new_store(prefix, scheme)
    except BaseException:
        with _stores_lock:
            del _creating[key]  # the next call tries again
        raise
    with _stores_lock:
        _stores[key] = store
        del _creating[key]


def _new_store(prefix: str, scheme: str) -> _Store:
    try:
        options = _s3_options() if scheme == "s3" else {"retry_limit_seconds": f"{GCS_RETRY_LIMIT:g}"} if scheme in (
            "gs", "gcs") else {}
        try:
            fs, base = pafs.FileSystem.from_uri(prefix + (f"?{urllib.parse.urlencode(options)}" if options else ""))
        except pa.ArrowInvalid as error:
            optional = [name for name in ("allow_delayed_open", "retry_limit_seconds") if name in str(error)]
            if not optional or optional[0] not in options:
                raise
            del options[optional[0]]  # a pyarrow without that option
            fs, base = pafs.FileSystem.from_uri(prefix + (f"?{urllib.parse.urlencode(options)}" if options else ""))
        if isinstance(fs, pafs.S3FileSystem) and "@" not in prefix:
            fs = _with_s3_limits(fs, options)
        if isinstance(fs, pafs.GcsFileSystem) and os.environ.get("STORAGE_EMULATOR_HOST"):
            fs = _gcs_emulator(os.environ["STORAGE_EMULATOR_HOST"])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ImportError) as error:
        if isinstance(error, pa.ArrowInvalid) and "Unrecognized filesystem type" not in str(error):
            raise ValueError(f"lox cannot store runs at {prefix}/...: {error}") from error  # pyarrow's scheme
        return _fsspec_store(prefix, scheme, error)  # a scheme pyarrow does not serve, or was built without
    base = base.rstrip("/")
    return _Store(prefix, fs, lambda uri: base + uri[len(prefix):], fs.type_name in _ATOMIC_UPLOADS,
                  fs.type_name in _ATOMIC_UPLOADS)


def _gcs_emulator(host: str) -> pafs.GcsFileSystem:
    """GCS at `host`, the ``STORAGE_EMULATOR_HOST`` Google's own clients read (an emulator such as
    fake-gcs-server): pyarrow's URIs take no endpoint, and an emulator takes no credentials."""
    endpoint = urllib.parse.urlsplit(host if "://" in host else f"http://{host}")
    return pafs.GcsFileSystem(anonymous=True, scheme=endpoint.scheme, endpoint_override=endpoint.netloc,
                              retry_time_limit=datetime.timedelta(seconds=GCS_RETRY_LIMIT))


def _s3_options() -> dict[str, str]:
    """pyarrow's S3 options: a file smaller than a part in one PUT (not a multipart upload of three
    requests), and the endpoint of AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL given explicitly (pyarrow
    reads them itself only since version 15)."""
    options = {"allow_delayed_open": "true"}
    endpoint = urllib.parse.urlsplit(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "")
    if endpoint.scheme in ("http", "https") and endpoint.netloc:
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
    return options


def _with_s3_limits(fs: pafs.S3FileSystem, options: dict[str, str]) -> pafs.S3FileSystem:
    """The same S3 client (its region as ``from_uri`` found it, the same `options`), with
    pyarrow's limits on each attempt and the number of attempts (``from_uri`` takes none of them)."""
    kwargs: dict[str, Any] = {"region": fs.region, "connect_timeout": S3_CONNECT_TIMEOUT,
                              "request_timeout": S3_REQUEST_TIMEOUT,
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS)}
    if "endpoint_override" in options:
        kwargs.update(endpoint_override=options["endpoint_override"], scheme=options["scheme"])
    if "allow_delayed_open" in options:
        kwargs["allow_delayed_open"] = True
    return pafs.S3FileSystem(**kwargs)


def _fsspec_store(prefix: str, scheme: str, pyarrow_error: BaseException) -> _Store:
    """A scheme pyarrow does not serve (or was built without), through fsspec."""
    try:
        # Optional (not in any extra): only for schemes pyarrow does not serve.
        import fsspec  # pyright: ignore[reportMissingImports]
        from fsspec.registry import known_implementations  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise ModuleNotFoundError(
            f"lox cannot store runs at {prefix}/...: pyarrow does not serve the scheme '{scheme}://' "
            f"({pyarrow_error}); fsspec may: `pip install fsspec` and the package for '{scheme}://' "
            "(gcsfs for gs://, s3fs for s3://, adlfs for az://...).",
            name="fsspec",
        ) from None
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError as error:
        package = known_implementations.get(scheme, {}).get("class", "").split(".")[0] or "its package"
        raise ModuleNotFoundError(
            f"lox cannot store runs at {prefix}/...: the scheme '{scheme}://' needs the package {package} "
            f"({error}): `pip install {package}`.",
            name=package,
        ) from None
    except ValueError:
        raise ValueError(
            f"lox cannot store runs at {prefix}/...: no filesystem serves the scheme '{scheme}://'. pyarrow "
            "serves s3://, gs://, abfs://, hdfs:// and file://; fsspec (with the scheme's package) serves "
            f"more, e.g. memory://, oss://. Check the spelling, or give a local folder."
        ) from None
    fs = fsspec.core.url_to_fs(prefix)[0]
    protocols = {cls.protocol} if isinstance(cls.protocol, str) else set(cls.protocol)
    atomic = bool(protocols & _ATOMIC_FSSPEC)
    return _Store(prefix, pafs.PyFileSystem(pafs.FSSpecHandler(fs)), fs._strip_protocol, atomic, atomic)


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass
