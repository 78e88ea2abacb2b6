"""EAGLE head checkpoints in their published layouts: a directory with config.json + weights.

- HF layout (SafeAILab EAGLE-3, SpecForge; served by SGLang and vLLM): config.json is a Llama config
  with ``draft_vocab_size`` (architectures ``LlamaForCausalLMEagle3``), optionally
  ``eagle_config.eagle_aux_hidden_state_layer_ids``; tensors ``fc.weight``, ``midlayer.*`` (or
  ``layers.0.*``), ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``, optionally ``embed_tokens.weight``.
  EAGLE-1 (SafeAILab): ``fc.weight`` [H, 2H] (+ ``fc.bias``), ``layers.0.*``, no norm / lm_head.
- vLLM ``speculators`` layout: config with ``speculators_model_type`` (eagle3 | eagle),
  ``transformer_layer_config``, ``draft_vocab_size``, ``eagle_aux_hidden_state_layer_ids``; tensors
  ``layers.0.*`` (EAGLE-1: ``fusion_fc.*``, ``transformer.*``).

Aux-layer ids come in two conventions under one key name: SGLang/SpecForge's ``eagle_config`` names
layer *outputs* (our capture index), while vLLM, speculators and llama.cpp's converter read the key at
the top level and name layer *inputs* (output of layer id-1). We write both (the top-level one is
what llama.cpp's ``convert_hf_to_gguf.py`` reads) and read either; when both are present they must
name the same layers."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import ModelFileError
from ..layers.quant import quantize_int8
from ..models.config import ModelConfig, RopeScaling
from ..models.eagle import EagleConfig, EagleHead, default_aux_layers
from .hf import rope_scaling_from_dict

_SKIP = ("rotary_emb.", "verifier_", "mask_hidden")


def _layer_fields(c: dict) -> dict:
    heads = c["num_attention_heads"]
    rope = c.get("rope_scaling") or c.get("rope_parameters")
    theta = c.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
    return dict(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"], num_heads=heads,
                num_kv_heads=c.get("num_key_value_heads") or heads,
                head_dim=c.get("head_dim") or c["hidden_size"] // heads, rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                rope_theta=float(theta), rope_scaling=rope_scaling_from_dict(rope),
                max_position_embeddings=c.get("max_position_embeddings", 4096),
                attention_bias=bool(c.get("attention_bias", False)))


def read_head_config(path: Path, target: ModelConfig, fc_in: int) -> tuple[EagleConfig, str]:
    """(config, layout) from ``path``/config.json; ``fc_in`` (the fc weight's input width) tells
    EAGLE-1 (2H) from EAGLE-3 (3H_t) where the config does not say."""
    try:
        c = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: not an EAGLE head directory (config.json: {e})") from None
    try:
        if "speculators_model_type" in c:
            kind, layout = c["speculators_model_type"], "speculators"
            if kind not in ("eagle3", "eagle"):
                raise ModelFileError(f"{path}: speculators model type {kind!r} is not an EAGLE head")
            if c.get("layernorms"):
                raise ModelFileError(f"{path}: EAGLE heads with extra layernorms are not supported")
            f = _layer_fields(c["transformer_layer_config"])
            vocab = c["transformer_layer_config"]["vocab_size"]
            ids = c.get("eagle_aux_hidden_state_layer_ids")
            aux = tuple(i - 1 for i in ids) if ids else None  # vLLM: input of layer i
            fc_bias = bool(c.get("fusion_bias", False))
        else:
            f, vocab, layout = _layer_fields(c), c["vocab_size"], "hf"
            kind = "eagle" if fc_in == 2 * f["hidden_size"] and "draft_vocab_size" not in c else "eagle3"
            ids = (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            top = c.get("eagle_aux_hidden_state_layer_ids")
            if ids and top and [i - 1 for i in top] != list(ids):
                raise ModelFileError(f"{path}/config.json: eagle_aux_hidden_state_layer_ids {list(top)} (layer "
                                     f"inputs) and eagle_config's {list(ids)} (layer outputs) name different layers")
            aux = tuple(ids) if ids else (tuple(i - 1 for i in top) if top else None)
            fc_bias = bool(c.get("bias", False)) and kind == "eagle"
        cfg = EagleConfig(kind=kind, vocab_size=vocab, target_hidden_size=c.get("target_hidden_size") or f["hidden_size"],
                          draft_vocab_size=c.get("draft_vocab_size") or vocab if kind == "eagle3" else vocab,
                          aux_layers=(aux or default_aux_layers(target.num_layers)) if kind == "eagle3" else (),
                          norm_before_residual=bool(c.get("norm_before_residual", False)), fc_bias=fc_bias,
                          verifier=str(((c.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
                                       or c.get("verifier") or ""),
                          **f)
    except (KeyError, TypeError) as e:
        raise ModelFileError(f"{path}/config.json: missing or malformed field {e}") from None
    return cfg, layout


# How save_head(store="int8") writes a matrix: symmetric int8 per output row, weight = q * scale[:, None].
INT8_SCHEME = {"quant_method": "specdecode-int8-rows",
               "format": "<name> int8 [out, in] and <name>_scale float32 [out]: weight = <name> * <name>_scale[:, None]"}


def _dequantize_rows(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replaces every int8 ``<name>`` that has a ``<name>_scale`` by its float32 matrix."""
    for sname in [n for n in raw if n.endswith("_scale")]:
        name = sname.removesuffix("_scale")
        if name in raw and raw[name].dtype == torch.int8:
            raw[name] = raw[name].float() * raw.pop(sname).float()[:, None]
    return raw


def read_head_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a head directory (*.safetensors, else pytorch_model.bin), names normalised to
    ours: ``midlayer.*``, ``fc.*`` (``model.`` prefixes and speculators' EAGLE-1 names mapped); int8
    matrices (INT8_SCHEME) dequantized."""
    files = sorted(path.glob("*.safetensors"))
    raw: dict[str, torch.Tensor] = {}
    try:
        if files:
            from safetensors.torch import load_file

            for f in files:
                raw.update(load_file(str(f)))
        elif (path / "pytorch_model.bin").is_file():
            raw = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise ModelFileError(f"{path}: no *.safetensors or pytorch_model.bin")
    except (OSError, RuntimeError, ValueError) as e:
        raise ModelFileError(f"{path}: unreadable weights ({e})") from None
    out = {}
    for name, t in _dequantize_rows(raw).items():
        name = name.removeprefix("model.")
        for src, dst in (("layers.0.", "midlayer."), ("transformer.", "midlayer."), ("fusion_fc.", "fc.")):
            if name.startswith(src):
                name = dst + name[len(src):]
        if not name.startswith(_SKIP):
            out[name] = t
    return out


def load_head(path: str | Path, target: ModelConfig, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu") -> EagleHead:
    """An EagleHead from a head directory in either layout, checked against the target's dimensions
    (call ``head.bind(target_model)`` before use)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFileError(f"EAGLE head {path}: no such directory")
    tensors = read_head_tensors(path)
    if "fc.weight" not in tensors:
        raise ModelFileError(f"{path}: no fc.weight: not an EAGLE head")
    cfg, _ = read_head_config(path, target, tensors["fc.weight"].shape[1])
    if cfg.kind == "eagle" and "fc.bias" in tensors:
        cfg = replace(cfg, fc_bias=True)
    _check_target(path, cfg, target)
    with torch.device("meta"):  # no memory, no init: every tensor is assigned below (a missing one is an error)
        head = EagleHead(cfg)
        if "embed_tokens.weight" in tensors:
            head.embed_tokens = torch.nn.Embedding(*tensors["embed_tokens.weight"].shape,
                                                   _weight=torch.empty(tensors["embed_tokens.weight"].shape))
    if cfg.kind == "eagle3" and "d2t" not in tensors:
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ModelFileError(f"{path}: reduced draft vocabulary without a d2t mapping")
        tensors["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.long)  # identity
    if cfg.kind == "eagle3" and "t2d" not in tensors:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(cfg.draft_vocab_size) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    state = head.state_dict()
    missing = sorted(set(state) - set(tensors))
    if missing:
        raise ModelFileError(f"{path}: head checkpoint lacks {len(missing)} tensor(s), e.g. {missing[0]}")
    for name, dst in state.items():
        if tensors[name].numel() != dst.numel():
            raise ModelFileError(f"{path}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                 f"expected {tuple(dst.shape)}")
    # assign: the read tensors become the head's (a copy of ~100M floats into fresh memory costs ~0.3 s)
    head.load_state_dict({n: tensors[n].reshape(d.shape).to(d.dtype) for n, d in state.items()}, assign=True)
    float_dtype = dtype if dtype.is_floating_point else torch.float32
    return head.to(device=device, dtype=float_dtype).eval().requires_grad_(False)


def _check_target(path: Path, cfg: EagleConfig, target: ModelConfig) -> None:
    if cfg.vocab_size != target.vocab_size:
        raise ModelFileError(f"{path}: head vocabulary {cfg.vocab_size} != the target's {target.vocab_size}")
    if cfg.target_hidden_size != target.hidden_size or (cfg.kind == "eagle" and cfg.hidden_size != target.hidden_size):
        raise ModelFileError(f"{path}: head expects target hidden size {cfg.target_hidden_size}, "
                             f"the target has {target.hidden_size}")
    if any(not 0 <= i < target.num_layers for i in cfg.aux_layers):
        raise ModelFileError(f"{path}: head reads target layers {list(cfg.aux_layers)} but the target has "
                             f"{target.num_layers}")


def _layer_config(cfg: EagleConfig) -> dict:
    rs: RopeScaling = cfg.rope_scaling
    rope = None if rs.kind == "none" else {"rope_type": rs.kind, **{k: v for k, v in vars(rs).items() if k != "kind"}}
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "rope_scaling": rope, "max_position_embeddings": cfg.max_position_embeddings,
            "vocab_size": cfg.vocab_size, "attention_bias": cfg.attention_bias, "tie_word_embeddings": False}


def save_head(head: EagleHead, path: str | Path, layout: str = "hf", dtype: torch.dtype | None = None,
              store: str = "float") -> None:
    """Writes config.json + model.safetensors in the HF (``midlayer.*``) or ``speculators``
    (``layers.0.*``) layout. The shared target embedding is not written (the head binds it).
    store="int8": every matrix as int8 rows + ``<name>_scale`` (INT8_SCHEME; norms stay ``dtype``),
    which load_head reads back; other engines read the float form (store="float")."""
    from safetensors.torch import save_file

    if layout not in ("hf", "speculators"):
        raise ValueError(f"unknown head layout {layout!r} (hf, speculators)")
    if store not in ("float", "int8"):
        raise ValueError(f"unknown head storage {store!r} (float, int8)")
    cfg, path = head.cfg, Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in head.state_dict().items():
        if layout == "speculators" or cfg.kind == "eagle":
            name = name.replace("midlayer.", "layers.0.")
        t = t.detach().cpu()
        if store == "int8" and t.is_floating_point() and t.dim() == 2:
            q, scale = quantize_int8(t.float())
            tensors[name], tensors[name + "_scale"] = q.contiguous(), scale.contiguous()
            continue
        if t.is_floating_point() and dtype is not None:
            t = t.to(dtype)
        tensors[name] = t.contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    layer = _layer_config(cfg)
    dt = str(dtype or head.fc.weight.dtype).removeprefix("torch.")
    if layout == "hf":
        conf = dict(layer, torch_dtype=dt, target_hidden_size=cfg.target_hidden_size)
        if cfg.kind == "eagle3":
            conf.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=cfg.draft_vocab_size,
                        norm_before_residual=cfg.norm_before_residual,
                        eagle_aux_hidden_state_layer_ids=[i + 1 for i in cfg.aux_layers],
                        eagle_config={"eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
                                      "use_aux_hidden_state": True})
        else:
            conf["bias"] = cfg.fc_bias
    else:
        conf = {"architectures": ["Eagle3Speculator" if cfg.kind == "eagle3" else "EagleSpeculator"],
                "speculators_model_type": cfg.kind, "speculators_version": "0.1.0",
                "transformer_layer_config": layer, "draft_vocab_size": cfg.draft_vocab_size,
                "norm_before_residual": cfg.norm_before_residual, "target_hidden_size": cfg.target_hidden_size,
                "eagle_aux_hidden_state_layer_ids": [i + 1 for i in cfg.aux_layers] or None,
                "fusion_bias": cfg.fc_bias, "layernorms": False, "torch_dtype": dt,
                "speculators_config": {"algorithm": cfg.kind, "default_proposal_method": "greedy",
                                       "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                       "verifier": {"name_or_path": cfg.verifier or None,
                                                    "architectures": ["LlamaForCausalLM"]}}}
    if cfg.verifier and layout == "hf":
        conf["verifier"] = cfg.verifier
    if store == "int8":
        conf["quantization_config"] = INT8_SCHEME
    (path / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
