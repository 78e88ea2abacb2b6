"""A quantized GGUF model's converted weights, saved by one load and read by the next
(loader/weight_cache.py): the same tensors bit for bit, and converted afresh whenever the file, the
format or the entry itself changed."""
import os

import pytest
import torch

from gguf_fixtures import Q, write_gguf
from specdecode.loader.gguf_loader import load_gguf_model
from specdecode.loader.weight_cache import KEEP, WeightCache
from specdecode.models.llama import LlamaModel
from test_gguf_loader import K_MODEL, our_logits
from tiny_models import hf_model


@pytest.fixture
def gguf_path(tmp_path):
    """A Q4_K_M-like file: Q4_K decoder, Q6_K head."""
    path = tmp_path / "m.gguf"
    write_gguf(hf_model("llama", dtype=torch.float64, **K_MODEL), path,
               lambda name: Q.Q6_K if name == "lm_head.weight" else Q.Q4_K)
    return path


def no_conversion(monkeypatch):
    """Makes converting from the file an error: a load must come from the cache."""
    def refuse(self, weights):
        raise AssertionError("converted from the file")
    monkeypatch.setattr(LlamaModel, "load_weights", refuse)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_a_cached_load_holds_the_converted_tensors(tmp_path, gguf_path, monkeypatch, quant):
    cache = WeightCache(gguf_path, tmp_path / "weights")
    converted = load_gguf_model(gguf_path, torch.float32, quant=quant, cache=cache)
    assert len(list((tmp_path / "weights").glob(f"m-{quant}-*.safetensors"))) == 1
    with monkeypatch.context() as m:
        no_conversion(m)
        cached = load_gguf_model(gguf_path, torch.float32, quant=quant, cache=cache)
    a, b = converted.state_dict(), cached.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    ids = torch.tensor([[5, 3, 9, 100, 7]])
    assert torch.equal(our_logits(converted, ids), our_logits(cached, ids))


def test_a_replaced_file_is_converted_again_and_the_least_recently_used_entries_dropped(tmp_path, gguf_path,
                                                                                       monkeypatch):
    cache = WeightCache(gguf_path, tmp_path / "weights")
    entries = []
    calls = []
    real = LlamaModel.load_weights
    monkeypatch.setattr(LlamaModel, "load_weights", lambda self, w: calls.append(1) or real(self, w))
    for i in range(KEEP + 1):  # the file replaced each time: a new entry
        st = os.stat(gguf_path)
        os.utime(gguf_path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
        (new,) = set((tmp_path / "weights").glob("m-int4-*")) - set(entries)
        os.utime(new, ns=(10**18 + i * 10**9,) * 2)  # used in this order, a second apart
        entries.append(new)
    assert len(calls) == KEEP + 1
    assert set((tmp_path / "weights").glob("m-int4-*")) == set(entries[1:])  # the least recently used went


def test_a_broken_entry_is_converted_from_the_file(tmp_path, gguf_path):
    cache = WeightCache(gguf_path, tmp_path / "weights")
    ref = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    (entry,) = (tmp_path / "weights").glob("m-int4-*")
    entry.write_bytes(entry.read_bytes()[:1000])  # cut short
    again = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    assert all(torch.equal(t, again.state_dict()[n]) for n, t in ref.state_dict().items())
    assert entry.stat().st_size > 1000  # saved whole again


def test_the_engine_keeps_converted_weights_only_when_asked(tmp_path, monkeypatch):
    from specdecode import LLM, SamplingParams
    from specdecode.store import resolve_model

    try:
        path = str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {type(e).__name__}")
    monkeypatch.setenv("SPECDECODE_HOME", str(tmp_path / "home"))
    weights = tmp_path / "home" / "weights"
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    opts = dict(spec_type="none", max_model_len=64, max_num_seqs=1)
    off = LLM(path, weight_cache=False, **opts).generate([[5, 6, 7]], params)
    assert not weights.exists()
    LLM(path, **opts).generate([[5, 6, 7]], params)
    assert len(list(weights.glob("smollm2-135m-instruct-int4-*.safetensors"))) == 1
    no_conversion(monkeypatch)
    on = LLM(path, **opts).generate([[5, 6, 7]], params)
    assert on[0].token_ids == off[0].token_ids


def test_a_cached_load_maps_the_entry_copy_on_write(tmp_path, gguf_path, monkeypatch):
    """The cached model's tensors are views of the entry file, each on a 64-byte line, and writing one
    changes the process's copy only: the next load gets the saved bytes."""
    import sys

    cache = WeightCache(gguf_path, tmp_path / "weights")
    converted = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    (entry,) = (tmp_path / "weights").glob("m-int4-*")
    with monkeypatch.context() as m:
        no_conversion(m)
        mapped = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    tensors = list(mapped.state_dict().values())
    assert all(t.device.type == "cpu" and t.data_ptr() % 64 == 0 for t in tensors if t.numel())
    if sys.platform == "linux":  # the mapping that holds the tensors is the entry file
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
        for t in (tensors[0], tensors[-1]):
            line = next(ln for ln in maps if int(ln.split()[0].split("-")[0], 16) <= t.data_ptr()
                        < int(ln.split()[0].split("-")[1], 16))
            assert line.endswith(str(entry))
        from test_host_memory import mapping_of

        assert "hg" in mapping_of(tensors[0].data_ptr())["VmFlags"]  # marked for huge pages
    qweight = mapped.layers[0].mlp.down_proj.qweight
    qweight.fill_(0)  # copy on write: the file keeps its bytes
    again = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    assert torch.equal(again.layers[0].mlp.down_proj.qweight, converted.layers[0].mlp.down_proj.qweight)
    assert not torch.equal(qweight, converted.layers[0].mlp.down_proj.qweight)


def test_an_entry_is_written_in_whole_blocks():
    """Whole BLOCK-sized writes (the last excepted): the page cache then holds the entry in 2 MiB folios,
    which the next load's mapping takes as huge pages."""
    import io

    from specdecode.loader import weight_cache

    class Recorder(io.BytesIO):
        sizes: list = []

        def write(self, b):
            self.sizes.append(len(memoryview(b)))
            return super().write(b)

    pieces = [b"x" * 10, bytes(range(256)) * 9000, memoryview(torch.arange(700_000, dtype=torch.int32).numpy()), b"end"]
    f = Recorder()
    weight_cache._write_blocks(f, iter(pieces))
    assert f.getvalue() == b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    assert all(n == weight_cache.BLOCK for n in f.sizes[:-1]) and 0 < f.sizes[-1] <= weight_cache.BLOCK


def test_an_entry_that_cannot_be_mapped_is_read(tmp_path, gguf_path, monkeypatch):
    """A filesystem without mmap: the entry's bytes are read into allocated tensors, not converted again."""
    import mmap
    import types

    from specdecode.loader import weight_cache

    cache = WeightCache(gguf_path, tmp_path / "weights")
    converted = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)

    def refuse(*args, **kwargs):
        raise OSError(19, "No such device")

    with monkeypatch.context() as m:
        no_conversion(m)
        m.setattr(weight_cache, "mmap", types.SimpleNamespace(mmap=refuse, ACCESS_COPY=mmap.ACCESS_COPY))
        read = load_gguf_model(gguf_path, torch.float32, quant="int4", cache=cache)
    a, b = converted.state_dict(), read.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
