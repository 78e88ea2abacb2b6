"""specdecode: a PyTorch LLM inference engine whose first-class feature is lossless speculative decoding."""
from .config import EngineConfig, SpecConfig
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "EngineConfig", "SpecConfig", "RequestOutput"]


def __getattr__(name):  # LLM pulls in torch; keep `import specdecode` light for the CLI's --help
    if name in ("LLM", "RequestOutput"):
        from . import llm

        return getattr(llm, name)
    raise AttributeError(name)
