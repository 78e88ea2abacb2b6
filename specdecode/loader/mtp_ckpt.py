"""MTP heads in checkpoint files: read them from GGUF (``{arch}.nextn_predict_layers`` and ``blk.N.nextn.*``)
or from Hugging Face directories (``num_nextn_predict_layers`` and ``model.layers.{num_hidden_layers + k}.*``),
save them as a small head directory (that same HF layout holding only the MTP layers), and attach them to
a GGUF file so that the file carries its own heads, as checkpoints that ship with them do.

GGUF layout (llama.cpp's): block_count counts the MTP blocks, which come last (N = layers .. layers + k - 1);
each holds the block's ordinary tensors (attn_q, ffn_up, ... under blk.N, q/k rows permuted for llama like
every block) plus blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm[, shared_head_head, embed_tokens]}."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ..errors import ModelFileError
from ..models.config import ModelConfig
from ..models.mtp import MTPConfig, MTPHead, build_mtp_head
from .gguf_file import GGUFFile
from .gguf_loader import dequantize_tensor, hf_name, permuted_heads, read_gguf_config, unpermute_rows

NEXTN_NAMES = {"eh_proj": "eh_proj", "enorm": "enorm", "hnorm": "hnorm", "shared_head_norm": "shared_head.norm",
               "shared_head_head": "shared_head.head", "embed_tokens": "embed_tokens"}  # GGUF -> HF
HEAD_FILE = "mtp.safetensors"


def mtp_layer_count(path: str | Path) -> int:
    """MTP modules a model file or directory declares (0: none). Reads only the header or config.json."""
    path = Path(path)
    if path.is_dir():
        return int(_hf_config(path).get("num_nextn_predict_layers") or 0)
    return read_gguf_config(path).num_nextn_layers


def load_mtp_head(path: str | Path, target_cfg: ModelConfig | None = None, dtype: torch.dtype = torch.float32,
                  device: str | torch.device = "cpu") -> MTPHead:
    """The MTP heads of a GGUF file, an HF model directory or a head directory. ``target_cfg`` gives the
    shapes (a head directory has no full config); default: the file's own config."""
    path = Path(path)
    if path.is_dir():
        hf = _hf_config(path)
        if target_cfg is None:
            from .hf import config_from_hf
            target_cfg = config_from_hf(hf)
        first, k = int(hf["num_hidden_layers"]), int(hf.get("num_nextn_predict_layers") or 0)
        names = _hf_head_names(path, first, k)
        weights = _hf_tensors(path, first, k, dtype)
    else:
        f = GGUFFile(path)
        file_cfg = read_gguf_config(f)
        target_cfg = target_cfg or file_cfg
        first, k = file_cfg.num_layers, file_cfg.num_nextn_layers
        names = {n for n, _ in _gguf_infos(f, first)}
        weights = _gguf_tensors(f, file_cfg, dtype)
    if k == 0:
        raise ModelFileError(f"{path} has no MTP heads")
    cfg = MTPConfig(target_cfg, k, own_head=any(n.endswith("shared_head.head.weight") for n in names),
                    own_embed=any(n.endswith(".embed_tokens.weight") for n in names))
    head = build_mtp_head(cfg, dtype, device)
    head.load_weights(weights)
    return head


# -- GGUF --------------------------------------------------------------------------------------------
def _gguf_infos(f: GGUFFile, first: int):
    """(HF name relative to the MTP stack 'layers.{m}.X', GGUFTensorInfo) of every MTP tensor."""
    for info in f.tensors.values():
        parts = info.name.split(".")
        if parts[0] != "blk" or int(parts[1]) < first:
            continue
        m = int(parts[1]) - first
        if parts[2] == "nextn" and len(parts) == 5 and parts[3] in NEXTN_NAMES:
            yield f"layers.{m}.{NEXTN_NAMES[parts[3]]}.{parts[4]}", info
        elif (hf := hf_name(info.name)) is not None:
            yield f"layers.{m}." + hf.removeprefix(f"model.layers.{parts[1]}."), info


def _gguf_tensors(f: GGUFFile, cfg: ModelConfig, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    for name, info in _gguf_infos(f, cfg.num_layers):
        t = dequantize_tensor(info, f.raw(info), dtype)
        heads = permuted_heads(cfg, info.name)
        yield name, (unpermute_rows(t, heads) if heads else t)


# -- Hugging Face directories ------------------------------------------------------------------------
def _hf_config(path: Path) -> dict:
    f = path / "config.json"
    if not f.is_file():
        raise ModelFileError(f"{path}: not a model or head directory (no config.json)")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{f}: unreadable config ({e})") from None


def _hf_keys(path: Path, first: int, k: int) -> Iterator[tuple[Path, str, str]]:
    """(file, checkpoint name, 'layers.{m}.X') for the MTP tensors, without reading any tensor data."""
    from safetensors import safe_open

    prefixes = {f"model.layers.{first + m}.": m for m in range(k)}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as st:
            for name in st.keys():
                for pre, m in prefixes.items():
                    if name.startswith(pre):
                        yield file, name, f"layers.{m}." + name.removeprefix(pre)


def _hf_head_names(path: Path, first: int, k: int) -> set[str]:
    return {rel for _, _, rel in _hf_keys(path, first, k)}


def _hf_tensors(path: Path, first: int, k: int, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file, name, rel in _hf_keys(path, first, k):
        with safe_open(str(file), framework="pt") as st:
            yield rel, st.get_tensor(name).to(dtype)


def save_head_dir(head: MTPHead, out_dir: str | Path, info: dict | None = None,
                  dtype: torch.dtype = torch.float16) -> Path:
    """Writes the heads alone in the HF layout: mtp.safetensors (model.layers.{L + m}.*) + config.json
    (num_hidden_layers, num_nextn_predict_layers, hidden_size and ``info``, e.g. the base model)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    c = head.cfg.model
    tensors = {f"model.layers.{c.num_layers + int(n.split('.')[1])}." + n.split(".", 2)[2]:
               t.to(dtype if t.ndim > 1 else torch.promote_types(dtype, torch.float32)).contiguous()
               for n, t in head.hf_tensors()}  # norms at least float32, as GGUF keeps them
    save_file(tensors, str(out / HEAD_FILE))
    cfg = {"num_hidden_layers": c.num_layers, "num_nextn_predict_layers": head.cfg.num_modules,
           "hidden_size": c.hidden_size, "vocab_size": c.vocab_size, **(info or {})}
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


# -- writing a GGUF with heads -----------------------------------------------------------------------
def _permute_rows(x: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: the inverse of gguf_loader.unpermute_rows."""
    return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _gguf_name(rel: str, first: int) -> str:
    """'layers.0.self_attn.q_proj.weight' -> 'blk.{first}.attn_q.weight'; 'layers.0.eh_proj.weight' ->
    'blk.{first}.nextn.eh_proj.weight'."""
    from .gguf_loader import _LAYER_NAMES

    _, m, rest = rel.split(".", 2)
    stem, suffix = rest.rsplit(".", 1)
    n = first + int(m)
    for g, h in NEXTN_NAMES.items():
        if stem == h:
            return f"blk.{n}.nextn.{g}.{suffix}"
    for g, h in _LAYER_NAMES.items():
        if stem == h:
            return f"blk.{n}.{g}.{suffix}"
    raise ModelFileError(f"MTP tensor {rel} has no GGUF name")


def attach_mtp(src_gguf: str | Path, head: MTPHead | str | Path, out_gguf: str | Path, progress: bool = False) -> Path:
    """Writes ``out_gguf`` = every tensor and metadata entry of ``src_gguf`` (streamed, never dequantized)
    + the heads' tensors (matrices F16, norms F32), with block_count and nextn_predict_layers updated."""
    import gguf
    from tqdm import tqdm

    src, out = Path(src_gguf), Path(out_gguf)
    cfg = read_gguf_config(src)
    if cfg.num_nextn_layers:
        raise ModelFileError(f"{src} already carries {cfg.num_nextn_layers} MTP head(s)")
    if not isinstance(head, MTPHead):
        head = load_mtp_head(head, cfg)
    if out.resolve() == src.resolve():
        raise ModelFileError("attach-mtp: --out must differ from the source model file")
    reader = gguf.GGUFReader(str(src))
    arch = cfg.arch
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        value = field.contents()
        if field.name == gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch):
            value += head.cfg.num_modules
        if field.name == gguf.Keys.General.ALIGNMENT:
            writer.data_alignment = int(value)
        writer.add_key_value(field.name, value, vtype,
                             sub_type=field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    writer.add_nextn_predict_layers(head.cfg.num_modules)
    extra = []
    for rel, t in head.hf_tensors():
        name = _gguf_name(rel, cfg.num_layers)
        a = t.float().cpu().numpy()
        if (heads := permuted_heads(cfg, name)) is not None:
            a = _permute_rows(a, heads)
        extra.append((name, a.astype(np.float16 if a.ndim > 1 else np.float32)))
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    for name, a in extra:
        writer.add_tensor_info(name, a.shape, a.dtype, a.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    with tqdm(total=len(reader.tensors) + len(extra), desc="attach-mtp", unit="tensor", disable=not progress) as bar:
        for t in reader.tensors:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
            bar.update()
        for _, a in extra:
            writer.write_tensor_data(a)
            bar.update()
    writer.close()
    return out
