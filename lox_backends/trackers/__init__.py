"""Experiment trackers: the template every tracker fills in (`template`) and one
module per tracker (`mlflow`, `wandb`, `neptune`, `tensorboard`)."""
