"""Sent records (`lox_backends.runstore.sent`): what of a run reached a tracker reads
back as it was recorded, in a local run folder (a file of JSON lines, a torn last
line ignored) and in a bucket (a folder of objects, here fsspec's memory://); the
sending lock keeps a second holder out and leaves no file behind. Sending to real
trackers, and the lock across processes, are tested in tests/lox_backends/trackers."""

import json

import fsspec
import pytest

from lox_backends.runstore import layout
from lox_backends.runstore.sent import SentRecord

DESTINATION = "http://127.0.0.1:5000?token=secret experiment=demo"
FILES = ["batch-000000-0123abcd.parquet", "batch-000001-89abcdef.parquet"]


def record_everything(folder):
    record = SentRecord(folder, "mlflow", DESTINATION)
    assert (record.remote, record.files, record.closed) == (None, set(), False)  # nothing recorded yet
    record.set_remote({"run_id": "r1"})
    for name in FILES:
        record.add_file(name)
    record.set_remote({"run_id": "r2"})  # the tracker's run changed: the last one counts
    record.close()
    return record


@pytest.mark.parametrize("where", ["disk", "bucket"])
def test_a_record_reads_back_as_it_was_recorded(tmp_path, where):
    folder = str(tmp_path / "run") if where == "disk" else f"memory://sent-{tmp_path.name}/runs/run"
    if where == "disk":
        (tmp_path / "run").mkdir()
    written = record_everything(folder)
    again = SentRecord(folder, "mlflow", DESTINATION)
    assert (again.remote, again.files, again.closed) == ({"run_id": "r2"}, set(FILES), True)
    assert again.path == written.path
    other = SentRecord(folder, "mlflow", DESTINATION + "2")  # another destination: a record of its own
    assert (other.remote, other.files, other.closed) == (None, set(), False)


def test_on_disk_a_record_is_json_lines_with_secrets_masked(tmp_path):
    record = record_everything(str(tmp_path))
    lines = [json.loads(line) for line in open(record.path, encoding="utf-8")]
    assert lines[0]["remote"] == {"run_id": "r1"} and "secret" not in lines[0]["destination"]
    assert lines[1:] == [{"file": FILES[0]}, {"file": FILES[1]}, lines[3], {"closed": True}]


def test_a_torn_last_line_spoils_only_itself(tmp_path):
    record = SentRecord(str(tmp_path), "mlflow", DESTINATION)
    record.add_file(FILES[0])
    with open(record.path, "a", encoding="utf-8") as f:
        f.write('{"file": "batch-000001-89ab')  # the process died here
    again = SentRecord(str(tmp_path), "mlflow", DESTINATION)
    assert again.files == {FILES[0]}
    again.add_file(FILES[1])  # ends the torn line first
    assert SentRecord(str(tmp_path), "mlflow", DESTINATION).files == set(FILES)


def test_in_a_bucket_a_record_is_a_folder_of_objects(tmp_path):
    bucket = f"sent-objects-{tmp_path.name}"
    record = record_everything(f"memory://{bucket}/runs/run")
    assert record.in_bucket
    prefix = f"/{bucket}/runs/run/{layout.sent_folder('mlflow', DESTINATION)}/"
    names = sorted(path.removeprefix(prefix) for path in fsspec.filesystem("memory").find(f"/{bucket}"))
    assert names == sorted([layout.SENT_CLOSED, layout.SENT_REMOTE, *map(layout.sent_marker, FILES)])
    remote = json.loads(fsspec.filesystem("memory").cat(prefix + layout.SENT_REMOTE))
    assert remote["remote"] == {"run_id": "r2"} and "secret" not in remote["destination"]


def test_the_sending_lock_keeps_a_second_holder_out_and_goes_when_let_go(tmp_path):
    first = SentRecord(str(tmp_path), "mlflow", DESTINATION)
    second = SentRecord(str(tmp_path), "mlflow", DESTINATION)
    assert first.lock() and not second.lock()
    first.unlock()
    assert not list(tmp_path.glob(f"{layout.SENDING_LOCK_PREFIX}*"))
    assert second.lock()
    second.unlock()


def test_leftover_locks_that_nobody_holds_are_removed(tmp_path):
    left = tmp_path / layout.sending_lock("mlflow", "somewhere")  # a killed sender's
    left.write_text("")
    held = SentRecord(str(tmp_path), "mlflow", DESTINATION)
    assert held.lock()
    SentRecord.remove_leftover_locks(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [layout.sending_lock("mlflow", DESTINATION)]
    held.unlock()
