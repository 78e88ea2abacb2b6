"""One request whose step raises ends alone: the engine fails that sequence, the batch goes on, and
the others' output is what they give alone (nothing committed twice). Faults are injected into one
request (a poisoned seed) in the two phases of a step: before anything is committed (its random
numbers, drawn while the batch is accepted) and halfway through its own commit."""
import json
import logging
import threading

import httpx
import pytest

from specdecode import SamplingParams
from specdecode.engine.sequence import Sequence
from specdecode.sampling import RandomStream
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from server_helpers import MODEL, chat, hi, slow_steps, tiny_engine, wait_idle
from tiny_models import tiny_llm

POISON = 666  # the seed of the request whose steps raise


def poison(monkeypatch, phase: str) -> None:
    if phase == "accept":  # raises while the batch's tokens are chosen: nothing is committed yet
        real_u = RandomStream.u

        def u(self, *a, **kw):
            if self.seed == POISON:
                raise RuntimeError("poisoned request")
            return real_u(self, *a, **kw)
        monkeypatch.setattr(RandomStream, "u", u)
    else:  # raises after committing part of its own tokens: the sequences before it are committed
        real_append = Sequence.append

        def append(self, tokens, logprobs=None):
            if self.params.seed == POISON:
                real_append(self, tokens[:1], logprobs)
                raise RuntimeError("poisoned request")
            return real_append(self, tokens, logprobs)
        monkeypatch.setattr(Sequence, "append", append)


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=24, ignore_eos=True)
POISONED = SamplingParams(temperature=1.0, seed=POISON, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("phase", ["accept", "commit"])
def test_a_failing_sequence_ends_alone_and_the_batch_goes_on(monkeypatch, phase):
    llm = tiny_llm("ngram", max_num_seqs=3)
    eng = llm.engine
    greedy_prompt, seeded_prompt = [5, 6, 7, 5, 6, 7, 5, 6], [9, 8, 7, 9, 8, 7, 9]
    ref_greedy = llm.generate(greedy_prompt, GREEDY)[0].token_ids
    ref_seeded = llm.generate(seeded_prompt, SEEDED)[0].token_ids
    poison(monkeypatch, phase)
    # admission order is batch order: the poisoned request sits between its two bystanders
    a = eng.add_request(greedy_prompt, GREEDY)
    p = eng.add_request([40, 41, 42, 43], POISONED)
    b = eng.add_request(seeded_prompt, SEEDED)
    failed, streamed = [], {id(a): "", id(b): ""}
    while eng.has_work():
        for o in eng.step():
            if o.error is not None:
                failed.append(o.seq)
            elif id(o.seq) in streamed:
                streamed[id(o.seq)] += o.delta
    assert len(failed) == 1 and failed[0] is p and p.finish_reason == "error"
    assert a.output_ids == ref_greedy and b.output_ids == ref_seeded
    assert (streamed[id(a)], streamed[id(b)]) == (a.text, b.text)  # no text lost to the failed step
    assert a.finish_reason == b.finish_reason == "length"
    assert eng.kv.free_slots == eng.kv.num_slots
    assert not any(t[:4] == [40, 41, 42, 43] for t in eng.prefix_cache.cached.values())  # its KV is not reused
    assert llm.generate(greedy_prompt, GREEDY)[0].token_ids == ref_greedy  # and the engine serves on


def test_a_prompt_chunk_that_fails_in_a_verify_forward_ends_alone(monkeypatch):
    """With --max-prefill-tokens a new prompt's chunks ride in the decoders' verify forward: when that
    forward raises, the decoders are stepped alone and the chunk runs in a forward of its own, so the
    prompt whose data raises fails alone and the decoder's output is what it gives alone."""
    llm = tiny_llm("ngram", max_num_seqs=2, max_prefill_tokens=4)
    eng = llm.engine
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    ref = llm.generate(prompt, GREEDY)[0].token_ids
    real = eng.runner.forward

    def forward(slots, tokens, *a, **kw):
        if any(300 in t for t in tokens):
            raise RuntimeError("poisoned prompt")
        return real(slots, tokens, *a, **kw)
    monkeypatch.setattr(eng.runner, "forward", forward)
    a = eng.add_request(prompt, GREEDY)
    eng.step()  # nothing else decodes: a prefills whole and takes its first step
    p = eng.add_request([1, 2, 3, 300, 4, 5, 6, 7, 8, 9], GREEDY)
    failed = []
    while eng.has_work():
        failed += [o.seq for o in eng.step() if o.error is not None]
    assert failed == [p] and p.finish_reason == "error"
    assert a.output_ids == ref and a.finish_reason == "length"


def test_the_python_api_raises_a_failed_requests_error_after_the_others_finish(monkeypatch):
    llm = tiny_llm("none", max_num_seqs=2)
    poison(monkeypatch, "accept")
    with pytest.raises(RuntimeError, match="poisoned"):
        llm.generate([[1, 2, 3], [4, 5, 6]], POISONED)
    with pytest.raises(RuntimeError, match="poisoned"):
        list(llm.stream([1, 2, 3], POISONED))
    assert not llm.engine.has_work() and llm.engine.kv.free_slots == llm.engine.kv.num_slots


def test_server_bystanders_finish_while_a_poisoned_request_fails(monkeypatch, caplog):
    """A streamed and a plain greedy request run while a poisoned one (plain, then streamed) fails
    in their batch: it gets a 500 (or an error chunk), they get exactly their solo output."""
    engine = tiny_engine()
    with BackgroundServer(create_app(engine, [MODEL])) as srv:
        url = f"{srv.url}/v1/chat/completions"
        ref_stream = chat(srv, "stream bystander", max_tokens=120).choices[0].message.content
        ref_plain = chat(srv, "plain bystander", max_tokens=60).choices[0].message.content
        poison(monkeypatch, "accept")
        caplog.set_level(logging.WARNING, "specdecode")
        bad = hi(temperature=1.0, seed=POISON, max_tokens=20)
        plain = {}
        with slow_steps(engine), httpx.stream("POST", url, timeout=60, json=hi(
                messages=[{"role": "user", "content": "stream bystander"}], max_tokens=120, temperature=0,
                stream=True)) as s:
            lines = s.iter_lines()
            streamed = [next(lines) for _ in range(2)]  # the role chunk and a first token: it is running
            t = threading.Thread(target=lambda: plain.update(r=chat(srv, "plain bystander", max_tokens=60)))
            t.start()
            r = httpx.post(url, json=bad, timeout=60)
            assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
            assert "poisoned" not in r.text
            with httpx.stream("POST", url, json=bad | {"stream": True}, timeout=60) as rs:
                body = "".join(rs.iter_text())
            assert "generation failed" in body and "poisoned" not in body and body.endswith("data: [DONE]\n\n")
            streamed += list(lines)
            t.join(60)
        chunks = [json.loads(x[6:]) for x in streamed if x.startswith("data: {")]
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ref_stream
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert plain["r"].choices[0].message.content == ref_plain
        assert any("batched step" in rec.getMessage() for rec in caplog.records)  # it did fail in a batch
        wait_idle(engine)
        assert httpx.get(f"{srv.url}/health").json() == {"status": "ok"}
