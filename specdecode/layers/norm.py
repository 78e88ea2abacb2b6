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

    def native_operands(self) -> tuple[torch.Tensor, float] | None:
        """(weight, eps) for the native kernel's rmsnorm where it takes this norm's weight (float32, a
        length divisible by 8), else None; the input must also be float32 on the CPU."""
        w = self.weight
        if native_kernels() is None or w.dtype != torch.float32 or w.shape[-1] % 8:
            return None
        return w.detach(), self.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inference on CPU in float32: one native call (PyTorch's composes ~6 ops, ~20 us a call at
        # decode sizes). Training (autograd) and other dtypes or devices keep PyTorch's.
        ops = self.native_operands()
        if (ops is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[-1] % 8 == 0
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return native_kernels().rmsnorm(x.contiguous(), *ops)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
