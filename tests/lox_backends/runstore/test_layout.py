"""The run format as `lox_backends.runstore.layout` specifies it: a folder written by
real writers holds what the layout's docstring lists, named as the layout names it
(``_run.json`` keys, batch file metadata, heartbeats, sent records); the names are
those earlier releases wrote, so that their runs still load and their records of
what was sent still count; and no other module spells a name of the format."""

import ast
import json
import pathlib
import re

import numpy as np
import pyarrow.parquet as pq
from paths import DATA, REPO

import lox
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore import layout, reader
from lox_backends.runstore.sent import SentRecord
from lox_backends.runstore.table import RUN_COLUMNS
from lox_core import arrow

DOCSTRING = layout.__doc__ or ""


def documented(section: str) -> list[str]:
    """The names a section of the layout's docstring lists: the first word (or
    comma-separated words) of each line of its literal block indented by four spaces."""
    text = DOCSTRING.split(f"{section}\n{'-' * len(section)}\n", 1)[1].split("\n\n\n", 1)[0]
    text = re.split(r"\n[^\n]*\n-{3,}\n", text, maxsplit=1)[0]  # up to the next section
    names = []
    for line in text.splitlines():
        match = re.match(r"    (\S+(?:, \S+)*)(?:\s{2,}|$)", line)
        if match:
            names += match.group(1).split(", ")
    return names


def write_runs(root, closed=("a", "b"), running=("c",)):
    """Runs of one group written by a parquet backend: `closed` ended, `running` left open."""
    backend = ParquetBackend(str(root))
    runs = [hooks.RunInfo(run_id, name=run_id, group="g", index=i, metadata={"lr": 0.1})
            for i, run_id in enumerate((*closed, *running))]
    for run in runs:
        backend.open_run(run)
        logs = lox.logdict({"m": {"loss": np.arange(3.0)}}, steps={"step": {"m": np.arange(3)}})
        backend.write(run, logs.to_arrow(run=run.run_id))
    backend.flush()
    for run in runs[:len(closed)]:
        backend.close_run(run)
    return backend


def test_a_written_folder_holds_the_files_the_layout_lists_by_its_names(tmp_path):
    write_runs(tmp_path)
    batches = layout.batches_folder("g")
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    heartbeat = re.escape(layout.heartbeat_file("@")).replace("@", "[0-9a-f]{8}")
    forms = [rf"[abc]/{re.escape(layout.RUN_FILE)}", rf"{re.escape(batches)}/{layout.BATCH_FILE.pattern}",
             rf"{re.escape(batches)}/{heartbeat}", rf"{re.escape(batches)}/{re.escape(layout.RUNS_INDEX)}"]
    assert [path for path in found if not any(re.fullmatch(form, path) for form in forms)] == []
    assert len([path for path in found if path.endswith(layout.RUN_FILE)]) == 3
    assert f"{batches}/{layout.RUNS_INDEX}" in found
    assert not list(tmp_path.rglob(f"{layout.TEMP_PREFIX}*"))  # nothing left being written


def test_run_json_holds_the_keys_the_layout_lists(tmp_path):
    write_runs(tmp_path)
    keys = documented("``_run.json``")
    assert keys[:3] == ["run_id", "name", "group"] and "heartbeat" in keys  # the list was read
    ended = json.loads((tmp_path / "a" / layout.RUN_FILE).read_text())
    running = json.loads((tmp_path / "c" / layout.RUN_FILE).read_text())
    assert sorted(ended) == sorted(set(keys) - {"resumes"})  # a run never resumed lists none
    assert sorted(running) == sorted(set(keys) - {"rows", "ended", "resumes", "summary"})
    assert sorted(ended["summary"]) == ["keys", "values"] and sorted(ended["summary"]["keys"]["m/loss"]) == [
        "count", "last", "max", "min"]
    assert ended["batches"] == layout.batches_folder("g") and ended["rows"] == 3
    # The heartbeat it names, relative to the folder of runs, holds what the layout says.
    beat = tmp_path / running["heartbeat"]["file"]
    assert beat.parent.name == running["batches"] and beat.name.startswith(layout.HEARTBEAT_PREFIX)
    assert sorted(json.loads(beat.read_text())) == ["host", "pid", "time"]
    assert running["heartbeat"]["every"] == layout.DEFAULT_HEARTBEAT_EVERY
    assert [r["status"] for r in reader.runs(tmp_path)] == ["finished", "finished", "running"]


def test_batch_files_hold_the_metadata_the_layout_lists(tmp_path):
    write_runs(tmp_path, closed=("a",), running=())
    keys = documented("Batch files")
    assert [key.encode() for key in keys] == [layout.TIME_METADATA, layout.RUNS_METADATA,
                                              layout.SCALARS_METADATA, layout.SUMMARY_METADATA, layout.TREES_METADATA,
                                              layout.KINDS_METADATA]
    assert layout.TREES_METADATA == arrow.TREES_METADATA.encode()  # the table's key, which a file extends
    assert layout.KINDS_METADATA == arrow.KINDS_METADATA.encode()
    (path,) = (tmp_path / layout.batches_folder("g")).glob("batch-*.parquet")
    metadata = pq.read_schema(path).metadata
    table = lox.logdict({"m": {"loss": np.arange(3.0)}}, steps={"step": {"m": np.arange(3)}}).to_arrow()
    assert set(metadata) - set(table.schema.metadata) == set(layout.PER_FILE_METADATA) - {layout.SUMMARY_METADATA}
    assert layout.TREES_METADATA in metadata and json.loads(metadata[layout.RUNS_METADATA]) == {"a": [0, 3]}
    footer = pq.read_metadata(path).metadata  # the summary: in the Parquet footer only
    assert json.loads(footer[layout.SUMMARY_METADATA]) == {"a": {"keys": {"m/loss": [3, 0.0, 2.0, 2.0]},
                                                                 "steps": [0, 2]}}


def test_the_runs_index_holds_the_table_columns_and_the_metadata_the_layout_lists(tmp_path):
    write_runs(tmp_path).flush()  # runs closed while another is open: their rows at the next flush
    keys = documented("The runs index")
    assert [key.encode() for key in keys] == [layout.INDEX_WRITER_METADATA, layout.INDEX_VALUES_METADATA]
    index = pq.read_table(tmp_path / layout.batches_folder("g") / layout.RUNS_INDEX)
    assert sorted(index.schema.metadata) == sorted(key.encode() for key in keys)
    writer = json.loads(index.schema.metadata[layout.INDEX_WRITER_METADATA])
    running = json.loads((tmp_path / "c" / layout.RUN_FILE).read_text())
    assert writer == {name: running[name] for name in ("host", "pid", "heartbeat")}
    assert index.column_names == [*RUN_COLUMNS, "lr", "m/loss.last", "m/loss.min", "m/loss.max", "m/loss.count"]
    assert sorted(zip(index["run_id"].to_pylist(), index["status"].to_pylist(), strict=True)) == [
        ("a", "finished"), ("b", "finished"), ("c", "running")]


def test_names_are_those_earlier_releases_wrote():
    """Runs, heartbeats and sent records written before keep their names: a name
    changed here would hide them (a run's rows, what was sent to a tracker)."""
    assert layout.DEFAULT_DIR == "lox-runs" and layout.RUN_FILE == "_run.json"
    assert layout.batches_folder("sweep") == "sweep.batches"
    assert layout.batch_file(12, "0123abcd") == "batch-000012-0123abcd.parquet"
    assert layout.BATCH_FILE.fullmatch("batch-1234567-0123abcd.parquet")  # past a million flushes
    assert not layout.BATCH_FILE.fullmatch(".batch-000001-0123abcd.parquet.tmp")
    assert layout.heartbeat_file("0123abcd") == "_alive-0123abcd.json"
    temp = layout.temp_name("batch-000001-0123abcd.parquet", 42, "host-1")
    assert temp == ".batch-000001-0123abcd.parquet.42@host-1.tmp"
    match = layout.TEMP_FILE.fullmatch(layout.temp_name("_run.json.89abcdef", 42, "host-1"))
    assert match is not None and (match["pid"], match["host"]) == ("42", "host-1")
    assert layout.is_temp(".batch-000003-89abcdef.parquet.tmp")  # lox before 0.3 named no writer
    assert layout.upload_temp_name("_run.json", "0badf00d") == "._run.json.0badf00d.tmp"
    destination = "http://127.0.0.1:5000 experiment=demo"
    assert layout.destination_hash(destination) == "a841c601b8"
    assert layout.sent_record("mlflow", destination) == "_sent-mlflow-a841c601b8.jsonl"
    assert layout.sent_folder("mlflow", destination) == "_sent-mlflow-a841c601b8"
    assert layout.sending_lock("mlflow", destination) == "_sending-mlflow-a841c601b8.lock"
    assert layout.is_sending_lock("_sending-mlflow-a841c601b8.lock") and not layout.is_sending_lock("_run.json")
    assert layout.sent_marker("batch-000000-0123abcd.parquet") == "batch-000000-0123abcd.parquet.sent"
    assert (layout.SENT_REMOTE, layout.SENT_CLOSED) == ("remote.json", "closed")
    assert layout.bucket_sending_lock("mlflow", "s3://b/runs/r/_sent-mlflow-a841c601b8") == (
        "lox-sending-mlflow-254155bbc9fba8da.lock")


def test_runs_of_lox_0_1_are_named_as_the_layout_says():
    for run in (DATA / "lox-0.1-runs").iterdir():
        names = sorted(p.name for p in run.iterdir())
        assert names[0] == layout.RUN_FILE and all(layout.BATCH_FILE.fullmatch(name) for name in names[1:])


def test_sent_records_are_named_as_the_layout_says(tmp_path):
    destination = "http://127.0.0.1:5000 experiment=demo"
    record = SentRecord(str(tmp_path), "mlflow", destination)
    assert record.path == str(tmp_path / layout.sent_record("mlflow", destination))
    assert record.lock_path == str(tmp_path / layout.sending_lock("mlflow", destination))
    bucket = SentRecord("memory://bucket/runs/r", "mlflow", destination)
    assert bucket.path == f"memory://bucket/runs/r/{layout.sent_folder('mlflow', destination)}"
    assert pathlib.Path(bucket.lock_path).name == layout.bucket_sending_lock("mlflow", bucket.path)


# What only the layout spells: a file or folder name, or a metadata key, of the format.
FORMAT = re.compile(r"_run\.json|_runs\.parquet|_alive-|_sent-|_sending-|\.batches|batch-\d|batch-[{%<]"
                    r"|lox\.(time_ms|scalars|summary|writer|values)|lox\.runs(?!\()|lox-sending|remote\.json|\.tmp\b")


def test_no_module_but_the_layout_spells_a_name_of_the_format():
    """Messages and docstrings name the files, in words; code takes the names from `layout`."""
    spelled = []
    for path in sorted([*(REPO / "lox_backends").rglob("*.py"), *(REPO / "lox").rglob("*.py")]):
        if path == REPO / "lox_backends" / "runstore" / "layout.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in docstrings:
                text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                if FORMAT.search(text):
                    spelled.append(f"{path.relative_to(REPO)}:{node.lineno}: {text[:80]!r}")
    assert spelled == []
