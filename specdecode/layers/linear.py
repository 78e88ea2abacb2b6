"""The linear layer every projection goes through. Weight-only quantized variants plug in here."""
from torch import nn


def make_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    return nn.Linear(in_features, out_features, bias=bias)
