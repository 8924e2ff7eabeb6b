"""lox backends: where logs go (console, Parquet files, trackers), as pluggy plugins.

`hooks` is the plugin contract; `logger` the Logger (with `runs`, `checks`,
`batching`, `worker` and `shutdown` around it); `store` the runs on disk;
`parquet`, `memory`, `console` and the trackers (`tracker`, `mlflow`, `wandb`,
`neptune`, `tensorboard`) the backends. The core (`lox_core`) does not depend on any of it.
"""
