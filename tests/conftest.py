"""Fixtures that start real components: an MLflow tracking server, and
hermetic environments for the W&B and Neptune clients (offline).

The helpers they use are in tests/support/ (on the path); `devices` comes first:
it gives JAX eight CPU devices before JAX starts.
"""


import devices  # noqa: F401  (first: it sets XLA_FLAGS before JAX starts)
import pytest  # noqa: E402
import wandb  # noqa: E402
from mlflow_server import CLIENT_ENV, MlflowServer  # noqa: E402
from s3_server import S3Server  # noqa: E402


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1, for the whole session (a test that freezes or kills
    it starts one of its own)."""
    server = S3Server(tmp_path_factory.mktemp("s3-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 (SQLite store), for the whole session."""
    mp = pytest.MonkeyPatch()
    for name, value in CLIENT_ENV.items():
        mp.setenv(name, value)
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()
    mp.undo()


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """W&B offline, silent, every folder of its own in tmp_path, and no way to
    reach a server (a stray request fails locally)."""
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_META": "true",
        "WANDB_X_DISABLE_MACHINE_INFO": "true",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
    }
    for name, sub in [("WANDB_DIR", "wb"), ("WANDB_CACHE_DIR", "wb-cache"), ("WANDB_CONFIG_DIR", "wb-config"),
                      ("WANDB_DATA_DIR", "wb-data"), ("WANDB_ARTIFACT_DIR", "wb-artifacts")]:
        (tmp_path / sub).mkdir()
        env[name] = str(tmp_path / sub)
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "LOX_BACKENDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    wandb.teardown()  # W&B reads its environment once per process: start afresh
    yield env
    wandb.teardown()


@pytest.fixture
def neptune_env(tmp_path, monkeypatch):
    """Neptune offline: its operation log in tmp_path/neptune-data, tmp_path the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NEPTUNE_DATA_DIRECTORY", str(tmp_path / "neptune-data"))
    for name in ("NEPTUNE_MODE", "NEPTUNE_PROJECT", "NEPTUNE_API_TOKEN", "LOX_BACKENDS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path
