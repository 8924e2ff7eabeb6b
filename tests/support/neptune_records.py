"""A reader for the neptune client's offline operation log (the data-*.log JSON
lines of NEPTUNE_DATA_DIRECTORY/offline/run__*), for the tests."""

import base64
import glob
import json
import os
import pathlib

import pyarrow.parquet as pq

from lox_core.arrow import from_arrow
from lox_core.logdict import concat


class OfflineRun:
    """One offline Neptune run: its operations, in order, from its data-*.log files."""

    def __init__(self, folder):
        self.folder = pathlib.Path(folder)
        entries = []
        for path in self.folder.glob("data-*.log"):
            entries += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.ops = [entry["obj"] for entry in sorted(entries, key=lambda e: e["version"])]

    def of_type(self, kind, path=None):
        return [op for op in self.ops if op["type"] == kind and (path is None or "/".join(op["path"]) == path)]

    def fields(self):
        """Path → value of every assigned atom, and the string sets added to."""
        out = {}
        for op in self.ops:
            path = "/".join(op["path"])
            if op["type"].startswith("Assign"):
                out[path] = op["value"]
            elif op["type"] == "AddStrings":
                out.setdefault(path, set()).update(op["values"])
        return out

    def series(self, path):
        """(step, value) of every point logged to a float series, in order."""
        return [(p["step"], p["value"]) for op in self.of_type("LogFloats", path) for p in op["values"]]

    def timestamps(self, path):
        return [p["ts"] for op in self.of_type("LogFloats", path) for p in op["values"]]

    def arrays(self):
        """The uploaded array files, read back as one logdict."""
        parts = []
        for op in self.of_type("UploadFile"):
            if op["path"][:2] == ["lox", "arrays"]:
                assert op["ext"] == "parquet"
                parts.append(from_arrow(pq.read_table(self.folder / "upload_path" / op["tmp_file_name"])))
        return concat(parts)

    def images(self, path):
        """(step, file content) of every image (PNG, GIF) appended to the file series `path`, in order."""
        return [(p["step"], base64.b64decode(p["value"]["data"]))
                for op in self.of_type("LogImages", path) for p in op["values"]]

    def strings(self, path):
        """(step, value) of every point logged to a string series, in order."""
        return [(p["step"], p["value"]) for op in self.of_type("LogStrings", path) for p in op["values"]]

    def uploads(self, prefix):
        """(path, extension, content) of every file uploaded to a field below `prefix`, in order."""
        return [("/".join(op["path"]), op["ext"], (self.folder / "upload_path" / op["tmp_file_name"]).read_bytes())
                for op in self.of_type("UploadFile") if "/".join(op["path"]).startswith(prefix)]


def offline_runs(data_directory):
    """lox run id → its offline Neptune runs under `data_directory` (Neptune's
    NEPTUNE_DATA_DIRECTORY), oldest first (several after a crash and `lox sync`)."""
    found = {}
    folders = glob.glob(os.path.join(data_directory, "offline", "run__*"))
    created = {f: json.loads(pathlib.Path(f, "metadata.json").read_text())["createdAt"] for f in folders}
    for folder in sorted(folders, key=created.get):
        run = OfflineRun(folder)
        found.setdefault(run.fields()["lox/run_id"], []).append(run)
    return found


