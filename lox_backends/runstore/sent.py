"""Sent records: what of a run reached a tracker, kept in the run's folder, and
the lock that keeps two processes from sending one run to one destination.

The file names are specified in `lox_backends.runstore.layout`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks (see `SentRecord.lock`)
    fcntl = None

from lox_backends.plugin.config import mask_secrets
from lox_backends.runstore import filesystems


class SentRecord:
    """``_sent-<tracker>-<hash>.jsonl`` in a run folder: the tracker's run id,
    then one line per batch file that reached the tracker, then ``closed``.
    Appended and fsynced line by line; a torn last line is ignored.

    In a bucket, where objects cannot be appended to, the record is a folder
    ``_sent-<tracker>-<hash>/`` of objects, each written whole: ``remote.json``
    (the tracker's run id, replaced when it changes), ``<batch file>.sent`` per
    file that reached the tracker, and ``closed``; reading it is one listing
    (and one read). The lock that keeps two processes from sending a run at
    once is then a file in the local temp folder: it keeps apart the processes
    of one machine only."""

    def __init__(self, folder: str, tracker: str, destination: str):
        digest = hashlib.sha256(destination.encode()).hexdigest()[:10]
        self.in_bucket = filesystems.is_uri(folder)
        self.destination = destination
        self.remote: dict | None = None
        self.files: set[str] = set()
        self.unconfirmed: list[str] = []  # sent, recorded when the run ends (`confirms_at_end`)
        self.closed = False
        self._lock_file = None
        if self.in_bucket:
            self.path = filesystems.join(folder, f"_sent-{tracker}-{digest}")
            where = hashlib.sha256(self.path.encode()).hexdigest()[:16]
            self.lock_path = os.path.join(tempfile.gettempdir(), f"lox-sending-{tracker}-{where}.lock")
            self._read_objects()
            return
        self.path = os.path.join(folder, f"_sent-{tracker}-{digest}.jsonl")
        self.lock_path = os.path.join(folder, f"_sending-{tracker}-{digest}.lock")
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # the process died while writing this line
            if "remote" in entry:
                self.remote = entry["remote"]
            if "file" in entry:
                self.files.add(entry["file"])
            if entry.get("closed"):
                self.closed = True

    def set_remote(self, remote: dict) -> None:
        self.remote = remote
        self._append({"remote": remote, "destination": mask_secrets(self.destination)})

    def add_file(self, name: str) -> None:
        self.files.add(name)
        self._append({"file": name})

    def close(self) -> None:
        self.closed = True
        self._append({"closed": True})

    def _read_objects(self) -> None:
        names = {name for name, _, _ in filesystems.scan(self.path, missing_ok=True)}
        if "remote.json" in names:
            self.remote = json.loads(filesystems.read_bytes(filesystems.join(self.path, "remote.json")))["remote"]
        self.files = {name.removesuffix(".sent") for name in names if name.endswith(".sent")}
        self.closed = "closed" in names

    def _append(self, entry: dict) -> None:
        if self.in_bucket:  # an object per entry, each uploaded whole
            name = "remote.json" if "remote" in entry else f"{entry['file']}.sent" if "file" in entry else "closed"
            filesystems.put(filesystems.join(self.path, name), json.dumps(entry).encode() + b"\n")
            return
        with open(self.path, "ab+") as f:
            # A line torn by a crash is ended first, so that it spoils only itself.
            size = f.seek(0, os.SEEK_END)
            torn = size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
            f.write((b"\n" if torn else b"") + json.dumps(entry).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def lock(self) -> bool:
        """Hold the run's sending lock (released when the process ends, also
        when it is killed); False if another process holds it."""
        if fcntl is None:  # Windows: no advisory locks; `lox sync` trusts the user
            return True
        self._lock_file = _take_lock(self.lock_path)
        return self._lock_file is not None

    def unlock(self) -> None:
        """Let go of the lock and remove its file (see `_take_lock`)."""
        if self._lock_file is not None:
            _release_lock(self._lock_file, self.lock_path)
            self._lock_file = None

    @staticmethod
    def remove_leftover_locks(folder: str) -> None:
        """Remove the lock files in a run folder that no process holds (left
        by senders that were killed); in a bucket, where they are in the local
        temp folder, nothing."""
        if fcntl is None or filesystems.is_uri(folder):
            return
        try:
            names = [entry.name for entry in os.scandir(folder)]
        except OSError:
            return
        for name in names:
            if name.startswith("_sending-") and name.endswith(".lock"):
                path = os.path.join(folder, name)
                file = _take_lock(path, create=False)
                if file is not None:
                    _release_lock(file, path)


def _take_lock(path: str, create: bool = True) -> IO | None:
    """The lock file at `path`, opened and flocked, or None if another process
    holds it (or, without `create`, if there is none).

    Its holder removes it when it lets go (`_release_lock`), so another process
    may have opened the file just before, and take the lock on a file that is
    no longer there, while a third makes a new one at `path`: whoever takes
    the lock checks that `path` still names the file it locked, and otherwise
    tries again. A file is removed only by a process that holds its lock."""
    assert fcntl is not None
    while True:
        try:
            file = open(path, "a" if create else "r")
        except FileNotFoundError:
            if not create:
                return None
            raise
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.close()
            return None
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        held = os.fstat(file.fileno())
        if named is not None and (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
            return file
        file.close()  # removed (and maybe made again) meanwhile: a lock on it keeps nobody out
        if not create:
            return None


def _release_lock(file: IO, path: str) -> None:
    """Remove the lock file, then let go of its lock (closing releases it)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        file.close()
