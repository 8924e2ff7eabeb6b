"""Experiment trackers, sent to from a local log in the background.

- `template`: `TrackerBackend`, what every tracker implements, and the steps of sending one run;
- `tables`: `Batch`, what a tracker is sent, and `scalars` / `arrays`, which split its table;
- `sending`: the threads that follow the local log and send, with retries (typed work items);
- `sync`: ``lox sync``, which sends saved runs, each step bounded by a timeout;
- one module per tracker: `mlflow`, `wandb`, `neptune`, `tensorboard`.
"""
