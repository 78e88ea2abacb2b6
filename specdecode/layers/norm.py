"""RMSNorm (Llama/Qwen/Mistral): x / rms(x) * weight, computed in the input dtype."""
import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native_kernels


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nk = native_kernels()
        # Inference on CPU in float32: one native call (PyTorch's composes ~6 ops, ~20 us a call at
        # decode sizes). Training (autograd) and other dtypes or devices keep PyTorch's.
        if (nk is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[-1] % 8 == 0
                and self.weight.dtype == torch.float32 and not (torch.is_grad_enabled()
                                                                 and (x.requires_grad or self.weight.requires_grad))):
            return nk.rmsnorm(x.contiguous(), self.weight.detach(), self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
