"""Suite-wide settings. The tests run tiny models whose ops take microseconds: a second intra-op
thread only adds synchronisation (on a loaded 2-core machine, 100x slower per op), so use one."""
import os
import sys

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.dirname(__file__))  # tests import their helpers (tiny_models, ...) by name
