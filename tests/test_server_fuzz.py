"""A fuzz pass over the API, as a hostile or broken client would send it: malformed JSON, wrong
types, huge numbers, empty and 1 MB fields, invalid UTF-8. Every one gets a 4xx with a one-line
OpenAI-style error body, and the server goes on serving (/health, then a real request)."""
import json
import random

import httpx
import pytest

from specdecode.config import ServerConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from server_helpers import JSON, MODEL, tiny_engine, wait_idle

MB = "x" * 2**20


def chat(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kw}


def comp(**kw):
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw}


MALFORMED = [b"", b"{", b'{"model": "tiny",', b"nul", b"[" * 100_000 + b"]" * 100_000, b'"a string"', b"123", b"null",
             b"true", b"{}", b"[]", b'{"model": "tiny"} trailing', b"{'model': 'tiny'}", b'{"model": NaN}']
HUGE_LITERALS = [b'{"model": "tiny", "prompt": "a", "%s": 1%s}' % (f, b"0" * 5000)
                 for f in (b"max_tokens", b"seed", b"temperature")]
HUGE_LITERALS += [b'{"model": "tiny", "prompt": [1%s]}' % (b"9" * 5000), b'{"model": "tiny", "max_tokens": 1e999}']
INVALID_UTF8 = [b"\xff\xfe\xfd", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff"}]}',
                b'{"model": "tiny", "prompt": "\xc0\xaf"}', b'{"model": "tiny", "prompt": "\xed\xa0\x80"}',
                b'{"model": "tiny", "prompt": "\\ud800"}', '{"model": "tiny", "prompt": "é"}'.encode("latin-1")]
WRONG_TYPES = [chat(model=1), chat(model=None), chat(messages={}), chat(messages="hi"), chat(messages=[1]),
               chat(messages=[{"role": 1, "content": "a"}]), chat(messages=[{"content": "a"}]),
               chat(messages=[{"role": "user", "content": 5}]), chat(messages=[{"role": "user", "content": [1]}]),
               chat(max_tokens=1.5), chat(max_tokens=True), chat(max_tokens="3"), chat(temperature="0"),
               chat(temperature=None, top_p="1"), chat(stream="yes"), chat(stop=5), chat(stop=[1]),
               chat(stop_token_ids=["a"]), chat(seed="1"), chat(seed=1.5), chat(n="2"), chat(stream_options=1),
               chat(logprobs="x"), chat(top_k=2.5), chat(ignore_eos="no"), comp(prompt=5), comp(prompt={}),
               comp(prompt=[[1, "a"]]), comp(prompt=[1.5]), comp(prompt=None), comp(echo="yes")]
HUGE = [chat(max_tokens=10**30), chat(max_tokens=2**63), chat(max_tokens=10**6), chat(max_completion_tokens=2**31),
        chat(top_k=2**70), chat(seed=2**64), chat(seed=-2**64), chat(temperature=1e400), chat(temperature=-1e308),
        chat(top_p=1e308), chat(min_p=-1e-300), chat(stop_token_ids=[2**40]), chat(stop_token_ids=[-1]),
        comp(prompt=[2**62]), comp(prompt=[-1]), chat(n=2**70), chat(max_tokens=-(2**63))]
EMPTY = [chat(messages=[]), comp(prompt=""), comp(prompt=[]), comp(prompt=[[]]), chat(model=""), chat(stop=[""]),
         chat(messages=[{"role": "user", "content": [{"type": "text"}]}])]
BIG = [chat(messages=[{"role": "user", "content": MB}]), comp(prompt=MB), comp(prompt=list(range(100)) * 5000),
       chat(messages=[{"role": "user", "content": "a"}] * 50_000), chat(model=MB), chat(stop=[MB]),
       comp(prompt=[MB]), chat(messages=[{"role": "user", "content": [{"type": "text", "text": MB}]}])]
UNKNOWN_AND_BAD = [chat(frobnicate=1, temperature=-1), comp(n=3, extra={"deep": [1, 2]}),
                   chat(messages=[{"role": "user", "content": "a", "extra": {}}], max_tokens=0)]


def _cases():
    for body in MALFORMED + HUGE_LITERALS + INVALID_UTF8:
        yield "chat/completions", body
        yield "completions", body
    for body in WRONG_TYPES + HUGE + EMPTY + BIG + UNKNOWN_AND_BAD:
        yield ("chat/completions" if "messages" in body else "completions"), json.dumps(body).encode()
    rng = random.Random(0)  # random byte damage to a valid body
    valid = json.dumps(chat(temperature=0.5, stop=["x"])).encode()
    for _ in range(40):
        b = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if bytes(b) != valid:
            DAMAGED.add(bytes(b))
            yield "chat/completions", bytes(b)


DAMAGED: set[bytes] = set()
CASES = list(_cases())


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine("ngram")
    with BackgroundServer(create_app(engine, [MODEL], config=ServerConfig())) as srv:
        srv.engine = engine
        yield srv


def is_client_error(r: httpx.Response) -> bool:
    if not 400 <= r.status_code < 500:
        return False
    err = r.json()["error"]
    return (400 <= r.status_code < 500 and isinstance(err["message"], str) and 0 < len(err["message"]) < 300
            and "\n" not in err["message"] and isinstance(err["type"], str))


def test_every_malformed_request_is_a_4xx_with_an_openai_error(server):
    failures = []
    with httpx.Client(base_url=f"{server.url}/v1", headers=JSON, timeout=60) as c:
        for path, body in CASES:
            r = c.post(path, content=body)
            # random damage can leave a valid request (a changed letter in a message): that one is answered
            if not (is_client_error(r) or (r.status_code == 200 and r.json()["choices"])):
                failures.append((path, body[:80], r.status_code, r.text[:200]))
            elif r.status_code == 200 and body not in DAMAGED:
                failures.append((path, body[:80], "answered"))
        assert not failures, failures
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        ok = c.post("chat/completions", json=chat(max_tokens=3, temperature=0))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    wait_idle(server.engine)


def test_unknown_fields_on_a_valid_request_are_ignored(server):
    """As vLLM does, so that clients sending extensions (best_of, logit_bias, user...) still work."""
    r = httpx.post(f"{server.url}/v1/chat/completions", json=chat(user="u", frobnicate={"a": [1]}, best_of=1))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_garbage_on_every_route_and_method(server):
    rng = random.Random(1)
    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", "/v1", "/v1/models", "/metrics", "/health", "/v1/chat/completions", "/v1/completions",
                     "/v1/../health", "/%00", "/v1/chat/completions?stream=true"):
            r = httpx.request(method, f"{server.url}{path}", content=bytes(rng.randrange(256) for _ in range(64)),
                              headers=JSON)
            assert r.status_code < 500, (method, path, r.status_code)
            if r.status_code >= 400:
                assert is_client_error(r), (method, path, r.text)
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
