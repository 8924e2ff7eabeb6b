"""Sent records: what of a run reached a tracker, kept in the run's folder, and
the lock that keeps two processes from sending one run to one destination.

Their names and contents are specified in `lox_backends.runstore.layout`
(Sent records).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import IO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks (see `SentRecord.lock`)
    fcntl = None

from lox_backends.plugin.config import mask_secrets
from lox_backends.runstore import filesystems, layout


class SentRecord:
    """The record of what of the run in `folder` reached `destination` of
    `tracker` (`layout.sent_record`): the tracker's run (`remote`), the batch
    files it took (`files`), whether the run was ended there (`closed`). Read
    when made; each change is written at once, appended and fsynced line by
    line (a torn last line is ignored).

    In a bucket, where objects cannot be appended to, the record is a folder of
    objects, each written whole (`layout.sent_folder`); reading it is one
    listing (and one read). The lock that keeps two processes from sending a
    run at once is then a file in the local temp folder: it keeps apart the
    processes of one machine only."""

    def __init__(self, folder: str, tracker: str, destination: str):
        self.in_bucket = filesystems.is_uri(folder)
        self.destination = destination
        self.remote: dict | None = None
        self.files: set[str] = set()
        self.unconfirmed: list[str] = []  # sent, recorded when the run ends (`confirms_at_end`)
        self.closed = False
        self._lock_file = None
        if self.in_bucket:
            self.path = filesystems.join(folder, layout.sent_folder(tracker, destination))
            self.lock_path = os.path.join(tempfile.gettempdir(), layout.bucket_sending_lock(tracker, self.path))
            self._kept: _Lines | _Objects = _Objects(self.path)
        else:
            self.path = os.path.join(folder, layout.sent_record(tracker, destination))
            self.lock_path = os.path.join(folder, layout.sending_lock(tracker, destination))
            self._kept = _Lines(self.path)
        for entry in self._kept.read():
            if "remote" in entry:
                self.remote = entry["remote"]
            if "file" in entry:
                self.files.add(entry["file"])
            if "closed" in entry:  # false: reopened (`reopen`)
                self.closed = bool(entry["closed"])

    def set_remote(self, remote: dict) -> None:
        self.remote = remote
        self._kept.append({"remote": remote, "destination": mask_secrets(self.destination)})

    def add_file(self, name: str) -> None:
        self.files.add(name)
        self._kept.append({"file": name})

    def close(self) -> None:
        self.closed = True
        self._kept.append({"closed": True})

    def reopen(self) -> None:
        """The run goes on (it was resumed, `hooks.RunInfo.resumed`): it is to be
        ended at the tracker again."""
        if self.closed:
            self.closed = False
            self._kept.append({"closed": False})

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
            if layout.is_sending_lock(name):
                path = os.path.join(folder, name)
                file = _take_lock(path, create=False)
                if file is not None:
                    _release_lock(file, path)


class _Lines:
    """A sent record in a local run folder: a file of JSON lines."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> list[dict]:
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for line in lines:
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # the process died while writing this line
        return entries

    def append(self, entry: dict) -> None:
        with open(self.path, "ab+") as f:
            # A line torn by a crash is ended first, so that it spoils only itself.
            size = f.seek(0, os.SEEK_END)
            torn = size > 0 and f.seek(size - 1) >= 0 and f.read(1) != b"\n"
            f.write((b"\n" if torn else b"") + json.dumps(entry).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())


class _Objects:
    """A sent record in a run folder in a bucket: a folder of objects, an object per entry, each uploaded whole."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> list[dict]:
        """The entries the objects hold, as a file of lines would: one listing, and one read (`remote.json`)."""
        names = {name for name, _, _ in filesystems.scan(self.path, missing_ok=True)}
        entries: list[dict] = []
        if layout.SENT_REMOTE in names:
            entries.append(json.loads(filesystems.read_bytes(filesystems.join(self.path, layout.SENT_REMOTE))))
        suffix = layout.SENT_MARKER_SUFFIX
        entries += [{"file": name.removesuffix(suffix)} for name in sorted(names) if name.endswith(suffix)]
        if layout.SENT_CLOSED in names:  # `{"closed": false}` once reopened
            entries.append(json.loads(filesystems.read_bytes(filesystems.join(self.path, layout.SENT_CLOSED))))
        return entries

    def append(self, entry: dict) -> None:
        name = (layout.SENT_REMOTE if "remote" in entry
                else layout.sent_marker(entry["file"]) if "file" in entry else layout.SENT_CLOSED)
        filesystems.put(filesystems.join(self.path, name), json.dumps(entry).encode() + b"\n")


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
