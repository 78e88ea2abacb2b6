"""Our decoder gives the logits of transformers' own implementation on the same random weights."""
import pytest
import torch

from tiny_models import hf_model, ours_from_hf


@pytest.mark.parametrize("model_type,overrides", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("qwen2", {}),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}),
    ("mistral", {}),
    ("qwen3", {}),
])
def test_logits_match_transformers(model_type, overrides):
    hf = hf_model(model_type, dtype=torch.float64, **overrides)
    runner = ours_from_hf(hf, dtype=torch.float64)
    ids = torch.randint(0, hf.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    slot = runner.kv.allocate()
    logits, _, _ = runner.forward([slot], [ids[0].tolist()])
    # float64 on both sides: the only differences are summation order, ~1e-12 relative.
    torch.testing.assert_close(logits[0].double(), ref, rtol=0, atol=1e-5)
