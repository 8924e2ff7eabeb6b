"""A real S3-compatible server on 127.0.0.1, for the tests and the benchmarks:
moto's standalone server (``moto[server]``) as a subprocess, stopped by its
process group. Clients reach it through the standard AWS environment
(`S3Server.env`), as users reach their buckets. Faults are real too: `pause`
freezes the server (SIGSTOP: connections are accepted, nothing answers),
`kill` ends it (connections refused), `start` brings it back on the same port;
moto keeps its buckets in memory, so a restarted server has none."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pyarrow.fs as pafs
from logs_testing import free_port, stop_group

# Credentials the server accepts, a region, and no instance metadata service:
# nothing may leave the machine.
CLIENT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class S3Server:
    """``moto_server`` on a free port of 127.0.0.1. With `authenticate`, it checks
    every request's credentials against its (empty) IAM users, so that any key
    is refused, as a real store refuses wrong credentials."""

    def __init__(self, folder, authenticate: bool = False):
        self.folder = str(folder)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.authenticate = authenticate
        self.process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs to reach this server."""
        return {**CLIENT_ENV, "AWS_ENDPOINT_URL": self.url}

    def start(self, timeout: float = 60.0) -> "S3Server":
        if importlib.util.find_spec("moto") is None:
            raise ModuleNotFoundError("the S3 server of the tests is moto's: pip install 'moto[server]'", name="moto")
        env = {**os.environ, **CLIENT_ENV}
        if self.authenticate:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        log = open(os.path.join(self.folder, f"moto-{self.port}.log"), "ab")
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"moto_server not ready after {timeout} s:\n{self.log()}")

    def filesystem(self, **options) -> pafs.S3FileSystem:
        """pyarrow's S3 client for this server (its endpoint given explicitly:
        pyarrow's constructor does not read AWS_ENDPOINT_URL)."""
        return pafs.S3FileSystem(access_key=CLIENT_ENV["AWS_ACCESS_KEY_ID"],
                                 secret_key=CLIENT_ENV["AWS_SECRET_ACCESS_KEY"],
                                 region=CLIENT_ENV["AWS_DEFAULT_REGION"], endpoint_override=self.url, **options)

    def create_bucket(self, name: str) -> None:
        self.filesystem(allow_bucket_creation=True).create_dir(name)

    def fresh_bucket(self, monkeypatch) -> str:
        """A new bucket's URI (``s3://lox-...``), the AWS environment pointing at this server."""
        for variable, value in self.env.items():
            monkeypatch.setenv(variable, value)
        name = f"lox-{uuid.uuid4().hex[:12]}"
        self.create_bucket(name)
        return f"s3://{name}"

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): the kernel still accepts connections, nothing answers them."""
        assert self.process is not None and self.process.poll() is None, "the server is not running"
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server answer again (SIGCONT; nothing happens to a running one)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would: its port then refuses
        connections, and what it held in memory (buckets, objects) is gone."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def bucket_exists(self, name: str) -> bool:
        return self.filesystem().get_file_info(name).type != pafs.FileType.NotFound

    def stop(self) -> None:
        self.resume()  # a paused server would not see SIGTERM
        stop_group(self.process)

    def log(self) -> str:
        with open(os.path.join(self.folder, f"moto-{self.port}.log"), errors="replace") as f:
            return f.read()[-3000:]
