"""The linear layer every projection is built with. Models are built with plain nn.Linear; for a
quantized model, models.build_model swaps each for its format's layer (layers/quant) before any
weight is allocated."""
from torch import nn


def make_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias)
