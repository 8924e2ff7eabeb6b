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
and a move. Object stores have no fsync: a completed upload is already stored
durably, so `fsync` does nothing there.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from lox_backends.shutdown import flush_before_exit_handlers

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
    "S3-compatible server; for gs://, GOOGLE_APPLICATION_CREDENTIALS"
)
_SHORT_HINT = "Credentials and endpoints come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL...)."


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
    store = _store(uri)
    if check:
        store.check(uri)
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
    store = _store(path)
    info = store.call(path, lambda: store.fs.get_file_info(store.path(path)))
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
    store = _store(folder)
    selector = pafs.FileSelector(store.path(folder), allow_not_found=missing_ok)
    infos = store.call(folder, lambda: store.fs.get_file_info(selector))
    return [(info.base_name, info.type == pafs.FileType.Directory, join(folder, info.base_name)) for info in infos]


def read_bytes(path: str) -> bytes:
    """A file's contents; `FileNotFoundError` where it is missing."""
    if not is_uri(path):
        with open(path, "rb") as f:
            return f.read()
    return _store(path).read(path).to_pybytes()


def read_buffer(path: str) -> pa.Buffer:
    """A remote file's contents, read in one request (what Parquet readers take
    with ``pa.BufferReader``)."""
    return _store(path).read(path)


def mtime(path: str) -> float:
    """When a file was last modified (Unix seconds)."""
    if not is_uri(path):
        return os.path.getmtime(path)
    store = _store(path)
    info = store.call(path, lambda: store.fs.get_file_info(store.path(path)))
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {path!r}")
    return info.mtime.timestamp() if info.mtime is not None else 0.0


# --- writing ------------------------------------------------------------------------------
def makedirs(path: str) -> None:
    """Create a folder and its parents (object stores have no folders: nothing to do)."""
    if not is_uri(path):
        os.makedirs(path, exist_ok=True)
        return
    store = _store(path)
    if not store.atomic_uploads:
        store.call(path, lambda: store.fs.create_dir(store.path(path), recursive=True))


def put(path: str, data: bytes | pa.Buffer) -> None:
    """Write a remote file whole, atomically: no reader ever sees part of it."""
    store = _store(path)
    if store.atomic_uploads:
        store.call(path, lambda: store.upload(store.path(path), data))
        return
    final = store.path(path)
    temp = posixpath.join(posixpath.dirname(final), f".{posixpath.basename(final)}.{secrets.token_hex(4)}.tmp")

    def write_and_move() -> None:
        store.upload(temp, data)
        try:
            store.fs.move(temp, final)
        except BaseException:
            _delete_quietly(store.fs, temp)
            raise

    store.call(path, write_and_move)


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

    def call(self, uri: str, operation: Callable):
        """`operation()`, its OSError (a network or permission error) naming `uri`."""
        try:
            return operation()
        except OSError as error:
            if uri in str(error):
                raise
            if isinstance(error, FileNotFoundError):
                raise FileNotFoundError(f"no such file or folder: {uri!r}") from error
            raise OSError(f"{uri!r}: {error}. {_SHORT_HINT}") from error

    def read(self, uri: str) -> pa.Buffer:
        def read() -> pa.Buffer:
            with self.fs.open_input_file(self.path(uri)) as f:  # its size known: one request (a stream: several)
                return f.read_buffer()

        return self.call(uri, read)

    def upload(self, path: str, data: bytes | pa.Buffer) -> None:
        with self.fs.open_output_stream(path) as f:
            f.write(data)

    def check(self, uri: str) -> None:
        """The bucket exists and answers; `uri` is not a file."""
        path = self.path(uri)
        try:
            if self.bucket:
                bucket = path.split("/", 1)[0]
                if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                    raise FileNotFoundError(
                        f"cannot write runs to {uri!r}: the bucket {bucket!r} does not exist (or these credentials "
                        f"cannot see it). Create it first, or fix the URI; {CREDENTIALS_HINT}."
                    )
            found = self.fs.get_file_info(path).type
        except FileNotFoundError:
            raise
        except OSError as error:
            raise OSError(f"cannot write runs to {uri!r}: {error}. {CREDENTIALS_HINT}.") from error
        if found == pafs.FileType.File:
            raise ValueError(f"cannot write runs to {uri!r}: it is a file; give a folder (a prefix) instead.")


_stores: dict[tuple, _Store] = {}
_stores_lock = threading.Lock()


def _store(uri: str) -> _Store:
    parts = urllib.parse.urlsplit(uri)
    prefix = f"{parts.scheme}://{parts.netloc}"
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENVIRONMENT)))
    key = (prefix, environment)
    store = _stores.get(key)
    if store is None:
        with _stores_lock:
            try:
                store = _stores.get(key) or _new_store(prefix, parts.scheme.lower())
            except OSError as error:  # pyarrow looks for the bucket's region, a credentials file...
                raise OSError(f"cannot use {uri!r}: {error}. {CREDENTIALS_HINT}.") from error
            _stores[key] = store
        # pyarrow shuts its S3 client down at exit: lox's exit flush (what a Logger still holds) goes first.
        flush_before_exit_handlers()
    return store


def _new_store(prefix: str, scheme: str) -> _Store:
    try:
        options = _s3_options() if scheme == "s3" else {}
        try:
            fs, base = pafs.FileSystem.from_uri(prefix + (f"?{urllib.parse.urlencode(options)}" if options else ""))
        except pa.ArrowInvalid:
            if "allow_delayed_open" not in options:
                raise
            del options["allow_delayed_open"]  # a pyarrow without that option
            fs, base = pafs.FileSystem.from_uri(prefix + (f"?{urllib.parse.urlencode(options)}" if options else ""))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ImportError) as error:
        if isinstance(error, pa.ArrowInvalid) and "Unrecognized filesystem type" not in str(error):
            raise ValueError(f"lox cannot store runs at {prefix}/...: {error}") from error  # pyarrow's scheme
        return _fsspec_store(prefix, scheme, error)  # a scheme pyarrow does not serve, or was built without
    base = base.rstrip("/")
    return _Store(prefix, fs, lambda uri: base + uri[len(prefix):], fs.type_name in _ATOMIC_UPLOADS,
                  fs.type_name in _ATOMIC_UPLOADS)


def _s3_options() -> dict[str, str]:
    """pyarrow's S3 options: a file smaller than a part in one PUT (not a multipart upload of three
    requests), and the endpoint of AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL given explicitly (pyarrow
    reads them itself only since version 15)."""
    options = {"allow_delayed_open": "true"}
    endpoint = urllib.parse.urlsplit(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "")
    if endpoint.scheme in ("http", "https") and endpoint.netloc:
        options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme)
    return options


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
