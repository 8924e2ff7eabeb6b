"""The filesystems with remote stores that stop answering: every operation they start
ends within its time limit (`filesystems.time_limit`, 60 s by default), warns while it
waits longer than 5 s, and names the URI, the operation and what to do. Real
faults only: a GCS or S3 endpoint at a closed port of 127.0.0.1, moto's S3 server
frozen (SIGSTOP) and killed, then back (SIGCONT, a restart on the same port)."""

import threading
import time
import warnings

import pyarrow.fs as pafs
import pytest
from logs_testing import free_port
from s3_server import CLIENT_ENV, S3Server

from lox_backends.parquet import ParquetBackend
from lox_backends.runstore import filesystems

MARGIN = 3.0  # seconds a bounded wait may run past its limit on a loaded machine


@pytest.fixture
def s3_server(tmp_path):
    """moto's S3 server on 127.0.0.1, for one test: the tests freeze and kill it.
    Let go and stopped whatever the test did to it, also when it fails."""
    server = S3Server(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()  # resumes a paused server first


@pytest.fixture
def bucket(s3_server, monkeypatch):
    """A fresh bucket's URI, the AWS environment pointing at the server."""
    return s3_server.fresh_bucket(monkeypatch)


def closed_port_url() -> str:
    """An http URL at a port of 127.0.0.1 where nothing listens: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"


def elapsed_since(began: float) -> float:
    return time.monotonic() - began


# --- a GCS endpoint that refuses connections (google-cloud-cpp alone retries it for 15 minutes) -------
@pytest.fixture
def gcs_closed(monkeypatch):
    url = closed_port_url()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    return url


def test_a_gcs_endpoint_that_refuses_connections_times_out_at_the_limit_naming_it(gcs_closed):
    began = time.monotonic()
    with filesystems.time_limit(3), pytest.raises(
        TimeoutError,
        match=rf"checking 'gs://bucket/runs' did not finish within 3 s; lox stopped waiting for it\. Check that the "
              rf"store answers \(its endpoint STORAGE_EMULATOR_HOST='{gcs_closed}'\), or give a longer timeout",
    ):
        filesystems.resolve("gs://bucket/runs", check=True)
    assert 3 <= elapsed_since(began) < 3 + MARGIN


def test_a_parquet_backend_in_an_unreachable_gcs_bucket_is_refused_within_the_limit(gcs_closed):
    began = time.monotonic()
    with filesystems.time_limit(3), pytest.raises(TimeoutError, match=r"'gs://bucket/runs' did not finish within 3 s"):
        ParquetBackend("gs://bucket/runs")
    assert elapsed_since(began) < 3 + MARGIN


def test_without_a_time_limit_pyarrow_gives_up_on_gcs_itself_after_warning(gcs_closed):
    """No limit of lox's: what ends the wait is pyarrow's own retry limit, passed
    to it (its default, 15 minutes, was the hang), with its error naming the URI."""
    began = time.monotonic()
    with filesystems.time_limit(None), pytest.warns(
        RuntimeWarning,
        match=rf"checking 'gs://other-bucket/runs' has not finished after 5 s; lox keeps waiting \(no time limit\)\. "
              rf"Check that the store answers \(its endpoint STORAGE_EMULATOR_HOST='{gcs_closed}'\)",
    ), pytest.raises(
        OSError, match=r"cannot write runs to 'gs://other-bucket/runs': .*STORAGE_EMULATOR_HOST for an emulator"
    ):
        filesystems.resolve("gs://other-bucket/runs", check=True)
    # google-cloud-cpp checks its limit after each attempt, then waits a delay that doubles each time.
    assert 5 <= elapsed_since(began) < 2 * filesystems.GCS_RETRY_LIMIT + MARGIN


# --- an S3 endpoint that refuses connections --------------------------------------------------------
def test_an_s3_endpoint_that_refuses_connections_fails_fast_naming_the_uri(monkeypatch):
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    url = closed_port_url()
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    began = time.monotonic()
    with filesystems.time_limit(20), pytest.raises(
        OSError, match=rf"cannot write runs to 's3://bucket/runs': .*Failed to connect to 127\.0\.0\.1 port "
                       rf"{url.rsplit(':', 1)[1]}.*AWS_ENDPOINT_URL for an S3-compatible server"
    ) as raised:
        filesystems.resolve("s3://bucket/runs", check=True)
    assert not isinstance(raised.value, TimeoutError)  # refused at once, the cause named: no waiting
    assert elapsed_since(began) < 10
    with filesystems.time_limit(20), pytest.raises(OSError, match=r"'s3://bucket/runs/x\.parquet': .*AWS_ENDPOINT_URL"):
        filesystems.put("s3://bucket/runs/x.parquet", b"data")


# --- moto frozen, then back --------------------------------------------------------------------------
def test_a_frozen_s3_server_is_warned_about_then_times_out_and_the_same_write_succeeds_once_back(s3_server, bucket):
    path = f"{bucket}/runs/batch-0.parquet"
    filesystems.put(path, b"before")  # the store is made, its connection opened
    s3_server.pause()
    began = time.monotonic()
    with filesystems.time_limit(8), pytest.warns(
        RuntimeWarning,
        match=rf"writing '{path}' has not finished after 5 s; lox keeps waiting up to 8 s in all\. Check that the "
              rf"store answers \(its endpoint AWS_ENDPOINT_URL='{s3_server.url}'\)",
    ), pytest.raises(
        TimeoutError,
        match=rf"lox: writing '{path}' did not finish within 8 s; lox stopped waiting for it\. Check that the store "
              rf"answers \(its endpoint AWS_ENDPOINT_URL='{s3_server.url}'\), or give a longer timeout \(the Logger's "
              r"timeout=, `lox sync --timeout`\)\.",
    ):
        filesystems.put(path, b"after")
    assert 8 <= elapsed_since(began) < 8 + MARGIN
    s3_server.resume()
    filesystems.put(path, b"after")
    assert filesystems.read_bytes(path) == b"after"


def test_a_frozen_store_holds_a_bounded_number_of_threads(s3_server, bucket):
    """Each call given up on leaves its request running in a thread until pyarrow
    ends it: past `filesystems.MAX_RUNNING` of them, further calls wait for one to end (within
    their limit) instead of starting more."""
    filesystems.put(f"{bucket}/x", b"x")
    before = {thread for thread in threading.enumerate() if thread.name == "lox-storage"}
    s3_server.pause()
    limit = 0.3
    for i in range(filesystems.MAX_RUNNING):
        late = pytest.raises(TimeoutError, match=rf"writing '{bucket}/{i}' did not finish")
        with filesystems.time_limit(limit), late:
            filesystems.put(f"{bucket}/{i}", b"x")
    began = time.monotonic()
    with filesystems.time_limit(limit), pytest.raises(
        TimeoutError,
        match=rf"writing '{bucket}/more' could not start within 0.3 s: {filesystems.MAX_RUNNING} earlier operations on "
              rf"{bucket} are still waiting for an answer\. Check that the store answers",
    ):
        filesystems.put(f"{bucket}/more", b"x")
    assert limit <= elapsed_since(began) < limit + MARGIN
    started = {thread for thread in threading.enumerate() if thread.name == "lox-storage"} - before
    assert len(started) <= filesystems.MAX_RUNNING
    s3_server.resume()
    filesystems.put(f"{bucket}/more", b"x")  # the stuck requests end, their threads serve again


# --- moto killed, then restarted ---------------------------------------------------------------------
def test_a_killed_s3_server_fails_fast_and_a_restarted_one_is_written_to_again(s3_server, bucket):
    path = f"{bucket}/runs/batch-0.parquet"
    filesystems.put(path, b"before")
    s3_server.kill()
    began = time.monotonic()
    with pytest.raises(OSError, match=rf"'{path}': .*Failed to connect to 127\.0\.0\.1.*AWS_ENDPOINT_URL") as raised:
        filesystems.put(path, b"after")
    assert not isinstance(raised.value, TimeoutError)
    assert elapsed_since(began) < 10  # refused connections fail at once, retries included: far below the limit
    s3_server.start()  # the same port: the client reaches it again as it is
    name = bucket.removeprefix("s3://")
    if not s3_server.bucket_exists(name):  # moto keeps buckets in memory: an operator would recreate it
        s3_server.create_bucket(name)
    filesystems.put(path, b"after")
    assert filesystems.read_bytes(path) == b"after"


# --- the limit itself --------------------------------------------------------------------------------
def test_the_time_limit_is_the_callers_own_and_nests():
    assert filesystems.current_time_limit() == filesystems.DEFAULT_TIME_LIMIT == 60
    seen = {}
    with filesystems.time_limit(3):
        thread = threading.Thread(target=lambda: seen.update(other=filesystems.current_time_limit()))
        thread.start()
        thread.join()
        with filesystems.time_limit(None):
            seen["inner"] = filesystems.current_time_limit()
            seen["handed"] = filesystems.with_time_limit(filesystems.current_time_limit)
        seen["outer"] = filesystems.current_time_limit()
    handed = []
    thread = threading.Thread(target=lambda: handed.append(seen["handed"]()))
    thread.start()
    thread.join()
    assert (seen["other"], seen["inner"], seen["outer"], handed) == (60, None, 3, [None])
    assert filesystems.current_time_limit() == 60
    with filesystems.time_limit(float("inf")):
        assert filesystems.current_time_limit() is None


@pytest.mark.parametrize("seconds, error, message", [
    (0, ValueError, r"time_limit takes seconds > 0 \(or None for no limit\), not 0\."),
    (-3, ValueError, r"time_limit takes seconds > 0 \(or None for no limit\), not -3\."),
    (float("nan"), ValueError, r"time_limit takes seconds > 0 \(or None for no limit\), not nan\."),
    ("5", TypeError, r"time_limit takes seconds \(a positive number\) or None, not '5'\."),
    (True, TypeError, r"time_limit takes seconds \(a positive number\) or None, not True\."),
])
def test_a_bad_time_limit_is_refused_naming_it(seconds, error, message):
    with pytest.raises(error, match=message), filesystems.time_limit(seconds):
        pass


def test_a_store_that_answers_is_not_slowed_or_warned_about(s3_server, bucket):
    with filesystems.time_limit(5), warnings.catch_warnings():
        warnings.simplefilter("error")
        filesystems.put(f"{bucket}/a/b.bin", b"data")
        assert filesystems.read_bytes(f"{bucket}/a/b.bin") == b"data"
        assert [(name, is_dir) for name, is_dir, _ in filesystems.scan(f"{bucket}/a")] == [("b.bin", False)]
        assert filesystems.kind(f"{bucket}/a/b.bin") == "file"
    fs = s3_server.filesystem()
    assert fs.get_file_info(f"{bucket.removeprefix('s3://')}/a/b.bin").type == pafs.FileType.File


def test_a_gcs_emulator_at_storage_emulator_host_is_the_endpoint_lox_talks_to(monkeypatch):
    """STORAGE_EMULATOR_HOST, as Google's clients read it: lox's requests reach it (not Google's OAuth)."""
    import http.server
    import threading

    paths = []

    class Emulator(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            paths.append(self.path)
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"code": 404, "message": "no such bucket"}}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Emulator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with filesystems.time_limit(20), pytest.raises((FileNotFoundError, OSError), match=r"gs://emulated/runs"):
            filesystems.resolve("gs://emulated/runs", check=True)
    finally:
        server.shutdown()
    assert any("emulated" in path for path in paths), paths
