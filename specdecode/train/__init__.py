"""Training draft heads for a frozen target: ``specdecode train-head`` (train/cli.py).

data.py: the corpus (Python's standard library by default), self-distillation prompts, and the
target's features cached in shards; eagle.py: EAGLE-3 / EAGLE-1 training with the training-time
test; mtp.py: MTP heads."""
