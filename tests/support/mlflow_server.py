"""A real MLflow tracking server on 127.0.0.1, for the tests: started as a
subprocess with a SQLite store in a temp folder, stopped by its process group."""

import os
import subprocess
import sys
import time
import urllib.request

from logs_testing import free_port, stop_group

# A server that is down must make the client fail at once (the tests then
# check lox's own retries), and nothing may leave the machine.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}


class MlflowServer:
    """``mlflow server`` on a free port of 127.0.0.1 (or `port`), its runs in `folder`."""

    def __init__(self, folder, port: int | None = None):
        self.folder = str(folder)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> "MlflowServer":
        env = {**os.environ, **CLIENT_ENV, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
            "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.db",
            "--artifacts-destination", f"{self.folder}/artifacts", "--workers", "1",
        ]
        log = open(os.path.join(self.folder, "server.log"), "ab")
        # Its own process group: stopping it stops the workers it forks too.
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.read().strip() == b"OK":
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"mlflow server not ready after {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        stop_group(self.process)

    def log(self) -> str:
        with open(os.path.join(self.folder, "server.log"), errors="replace") as f:
            return f.read()[-3000:]
