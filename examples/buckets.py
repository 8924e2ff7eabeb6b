"""Runs in a bucket: seeds trained under `jax.vmap` write to ``parquet:s3://...``,
`lox.load` reads them back from the bucket, and ``lox sync`` sends them to a
tracker, each batch once.

So that it runs anywhere, this example starts a local S3-compatible server
(moto's, ``pip install 'moto[server]'``) and points the standard AWS variables
at it. With your own bucket, leave that part out: lox's S3 client (pyarrow's)
reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and
AWS_ENDPOINT_URL for an S3-compatible store (MinIO, Cloudflare R2, ...).

    python examples/buckets.py
"""

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import jax
import jax.numpy as jnp
import pyarrow.fs

import lox

BUCKET = "demo"
LEARNING_RATES = [0.01, 0.05, 0.1, 0.3]


@contextlib.contextmanager
def local_s3_server():
    """moto's S3 server on a free port of 127.0.0.1, the AWS environment pointing at it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                      AWS_EC2_METADATA_DISABLED="true")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        s3, _ = pyarrow.fs.FileSystem.from_uri(f"s3://{BUCKET}?allow_bucket_creation=true")
        s3.create_dir(BUCKET)
        yield
    finally:
        server.terminate()
        server.wait()


def train(w, lr):
    """Gradient descent on (w - 3)², 50 steps, logging the loss at each."""

    def step(w, i):
        lox.log({"loss": (w - 3.0) ** 2}, step=i)
        return w - lr * 2.0 * (w - 3.0), None

    return jax.lax.scan(step, w, jnp.arange(50))[0]


def main():
    with local_s3_server():
        # Four seeds, one learning rate each, as one vmapped program; one run each in the bucket.
        logger = lox.loggers.from_config(f"parquet:s3://{BUCKET}/runs?compression=zstd", name="lr")
        lrs = jnp.array(LEARNING_RATES)
        keys = jax.random.split(jax.random.key(0), len(LEARNING_RATES))
        states = jax.vmap(lambda key, lr: logger.init(key, lr=lr))(keys, lrs)
        jax.jit(jax.vmap(lambda s, lr: logger.spool(train, s)(jnp.float32(0.0), lr)))(states, lrs)
        logger.finish(states)

        runs = lox.load(f"s3://{BUCKET}/runs")  # {run_id: logdict}, oldest first
        for run in logger.runs():
            loss = runs[run.run_id]["loss"]
            print(f"{run.name}: lr={float(run.metadata['lr']):.2f}  {len(loss)} steps  final loss {loss[-1]:.6f}")

        # `lox sync` sends what a tracker has not received yet: everything the first time, nothing after.
        tracker = "mlflow:sqlite:///mlflow.db?experiment=buckets"
        for _ in range(2):
            sync = [sys.executable, "-m", "lox_backends.tools.cli", "sync", f"s3://{BUCKET}/runs", "--to", tracker]
            print(subprocess.run(sync, capture_output=True, text=True, check=True).stdout.splitlines()[-1])


if __name__ == "__main__":
    main()
