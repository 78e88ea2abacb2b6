"""``specdecode serve --replicas``: engine replicas on Ray Serve behind one endpoint.

Without Ray: the plain server never imports it, a missing Ray is one line, the in-process ASGI
call aborts a request whose caller left, and /metrics labels each replica's samples. With Ray (the
``test`` extra installs it): two replicas of the real SmolLM2 on a local Ray instance, driven by the
official ``openai`` client: 32 requests at concurrency 8 all answered and identical to the
single-process server, shared prefixes on one replica, a client that leaves aborts its request, and a
replica killed mid-run loses no request that had not started streaming. Every replica gets a quarter
of a CPU and one thread: this machine has two cores."""
import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from specdecode.config import ServerConfig
from specdecode.server.asgi_call import HttpCall, Lifespan, call, get
from specdecode.server.replica_metrics import IngressMetrics, MetricsBoard

TESTS = os.path.dirname(__file__)


def run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=TESTS)


def test_the_plain_server_never_imports_ray():
    r = run_py("""
        import sys
        import specdecode.llm, specdecode.server.background as bg
        from tiny_models import tiny_llm
        tiny = tiny_llm("none")
        specdecode.llm.LLM = lambda engine_config: tiny
        class NoServe:
            def run(self):
                print("would serve")
        bg.make_server = lambda *a, **kw: NoServe()
        from specdecode.cli import main
        assert main(["serve", "--spec-type", "none"]) == 0
        assert "ray" not in sys.modules, "the plain server imported ray"
    """)
    assert r.returncode == 0 and "would serve" in r.stdout, r.stderr


def test_replicas_without_ray_is_one_line():
    r = run_py("""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        from specdecode.cli import main
        sys.exit(main(["serve", "--replicas", "2", "--spec-type", "none"]))
    """)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "pip install 'ray[serve]==2.60.0'" in r.stderr, r.stderr


def test_replica_flags_are_checked():
    from specdecode.cli import main

    assert main(["serve", "--ray-address", "auto"]) == 1
    assert main(["serve", "--replicas", "0"]) == 1


def test_an_in_process_call_answers_and_a_caller_that_leaves_aborts():
    from specdecode.server.app import create_app
    from test_server import tiny_engine

    engine = tiny_engine("none")
    app = create_app(engine, ["tiny"], config=ServerConfig())  # loopback, no key: Host names are checked
    worker = app.state.worker

    async def go():
        life = await Lifespan(app).start()
        assert await get(app, "/health") == (200, b'{"status":"ok"}')  # as a replica's health check asks
        assert (await get(app, "/metrics"))[0] == 200
        hdrs = ((b"host", b"localhost"), (b"content-type", b"application/json"))
        body = json.dumps({"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0}).encode()
        pieces = [p async for p in call(app, HttpCall("POST", "/v1/completions", headers=hdrs, body=body))]
        assert len(pieces) == 1 and pieces[0]["status"] == 200 and not pieces[0]["more"]
        assert len(json.loads(pieces[0]["body"])["choices"][0]["text"]) == 5
        bad = [p async for p in call(app, HttpCall("GET", "/v2/nothing", headers=hdrs))]
        assert bad[0]["status"] == 404 and json.loads(bad[0]["body"])["error"]["code"] == "not_found"
        stream = json.dumps({"model": "tiny", "prompt": "abc", "max_tokens": 300, "stream": True}).encode()
        it = call(app, HttpCall("POST", "/v1/completions", headers=hdrs, body=stream))
        first = await it.__anext__()
        assert first["status"] == 200 and first["more"] and first["body"].startswith(b"data: ")
        await it.aclose()  # the caller leaves mid-stream
        for _ in range(500):
            if worker.aborted == 1 and not engine.running:
                break
            await asyncio.sleep(0.01)
        assert worker.aborted == 1 and not engine.running
        await life.stop()
        assert not worker.alive

    asyncio.run(go())


def test_metrics_are_labelled_by_replica():
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    def exposition(n):
        reg = CollectorRegistry()
        Counter("specdecode_requests", "Requests", ["endpoint"], registry=reg).labels("chat").inc(n)
        return generate_latest(reg).decode()

    board = MetricsBoard()
    board.report("a", exposition(2))
    board.report("b", exposition(3))
    m = IngressMetrics()
    m.retries.inc()
    text = m.render(board.reports()).decode()
    assert 'specdecode_requests_total{endpoint="chat",replica="a"} 2.0' in text
    assert 'specdecode_requests_total{endpoint="chat",replica="b"} 3.0' in text
    assert text.count("# TYPE specdecode_requests_total counter") == 1
    assert "specdecode:replica_retries_total 1.0" in text


# -- two replicas of SmolLM2 on Ray Serve -------------------------------------------------------
KEY = "unused"  # the replicas run as the README starts them: no --api-key, so Host names are checked
PROMPTS = [f"{w}: write one sentence about the number {i}." for i, w in enumerate(
    "Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliet Kilo Lima Mike November Oscar Papa Quebec "
    "Romeo Sierra Tango Uniform Victor Whiskey Xray Yankee Zulu Apple Banana Cherry Damson Elder Fig".split())]
STORY = "Omega: a sentence about the sea. Then write"
FOLLOWER = STORY + " a short poem about it."  # shares the killed stream's prefix, and no other prompt's
SYSTEM = "You answer questions about this long shared context, which every request repeats. " * 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def smollm2_config():
    pytest.importorskip("ray.serve", reason="needs Ray Serve: pip install 'ray[serve]==2.60.0'")
    from specdecode.config import EngineConfig, SpecConfig
    try:
        from specdecode.store import resolve_model
        path = str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    # one sequence per engine: every request is then decoded alone, on either side of the comparison.
    # A context of 4096 and drafts of at most 8 tokens: the looping story the kill test streams must
    # still be generating seconds later, when the replica is killed.
    return EngineConfig(model=path, max_model_len=4096, max_num_seqs=1, threads=1,
                        spec=SpecConfig(spec_type="ngram-simple", ngram_size_m=8))


@pytest.fixture(scope="module")
def reference(smollm2_config):
    """The single-process server's greedy answers."""
    from specdecode.llm import LLM
    from specdecode.server.app import create_app
    from specdecode.server.background import BackgroundServer

    engine = LLM(engine_config=smollm2_config).engine
    with BackgroundServer(create_app(engine, ["smol"], config=ServerConfig())) as srv:
        c = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)
        yield {p: complete(c, p) for p in PROMPTS + [FOLLOWER]}


@pytest.fixture(scope="module")
def replicas(smollm2_config):
    from specdecode.config import ReplicaConfig, ServerConfig
    from specdecode.server.replica_server import ReplicaServer

    rcfg = ReplicaConfig(replicas=2, replica_cpus=0.25)
    server = ServerConfig(port=free_port(), shutdown_timeout=2.0)
    with ReplicaServer(smollm2_config, rcfg, ["smol"], server=server, log_level="warning") as srv:
        yield srv


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def complete(c, prompt, max_tokens=16, stream=False) -> str:
    kw = dict(model="smol", prompt=prompt, max_tokens=max_tokens, temperature=0)
    if stream:
        return "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw))
    return c.completions.create(**kw).choices[0].text


# the server's metrics, by their vLLM-style names or their earlier ones
REQUESTS = ("specdecode:request_success_total", "specdecode_requests_total")
ABORTED = ("specdecode:requests_aborted_total", "specdecode_requests_aborted_total")
PREFIX_HITS = ("specdecode:prefix_cache_hits_total", "specdecode_prefix_cache_hits_total")


def per_replica(srv, names) -> dict[str, float]:
    """Samples named as one of ``names`` summed per replica ("" = the ingress's own, unlabelled)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{srv.url}/metrics", timeout=30)
    assert r.status_code == 200, r.text
    text, out = r.text, {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names:
                out[s.labels.get("replica", "")] = out.get(s.labels.get("replica", ""), 0.0) + s.value
    return out


def wait_for(srv, name, check, timeout=15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:  # replicas report every second
        got = per_replica(srv, name)
        if check(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


@pytest.mark.integration
def test_32_requests_at_concurrency_8_identical_to_the_single_process_server(replicas, reference):
    c = client(replicas)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: complete(c, PROMPTS[i], stream=i % 2 == 1), range(32)))
    assert answers == [reference[p] for p in PROMPTS]
    served = wait_for(replicas, REQUESTS, lambda got: sum(got.values()) >= 32)
    assert sum(served.values()) == 32 and len(served) == 2 and min(served.values()) > 0, served


@pytest.mark.integration
def test_shared_prefixes_land_on_one_replica(replicas):
    c = client(replicas)
    before = per_replica(replicas, REQUESTS)
    hits_before = per_replica(replicas, PREFIX_HITS)
    where = set()
    for q in ("What is it about?", "Summarise it.", "Is it long?", "Name one word in it.", "Who wrote it?"):
        raw = c.chat.completions.with_raw_response.create(
            model="smol", max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        where.add(raw.headers["x-specdecode-replica"])
        assert raw.parse().choices[0].finish_reason == "length"
    assert len(where) == 1
    (replica,) = where
    after = wait_for(replicas, REQUESTS, lambda got: sum(got.values()) >= sum(before.values()) + 5)
    grew = {r: after.get(r, 0) - before.get(r, 0) for r in after}
    assert grew[replica] == 5 and all(v == 0 for r, v in grew.items() if r != replica), grew
    hits = per_replica(replicas, PREFIX_HITS)
    assert hits[replica] - hits_before.get(replica, 0) >= 4 * len(SYSTEM) // 10  # four reuses of the prefix


@pytest.mark.integration
def test_errors_as_the_single_process_server_and_a_client_that_leaves(replicas):
    url = replicas.url
    r = httpx.post(f"{url}/v1/completions", json={"model": "smol", "prompt": "x", "top_p": 5})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{url}/v1/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "error" in r.json()
    for path in ("/v1/models", "/metrics"):  # a page reaching a loopback server through DNS rebinding
        assert httpx.get(f"{url}{path}", headers={"host": "evil.example"}).status_code == 400
    assert httpx.get(f"{url}/v2/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    aborted = per_replica(replicas, ABORTED)
    body = {"model": "smol", "prompt": "Tell a very long story.", "max_tokens": 500, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    after = wait_for(replicas, ABORTED, lambda got: sum(got.values()) > sum(aborted.values()))
    assert sum(after.values()) == sum(aborted.values()) + 1


@pytest.mark.integration
def test_a_killed_replica_loses_no_request_that_had_not_started_streaming(replicas, reference):
    """A stream runs on replica R; a request sharing its prompt's prefix follows it there and waits
    for R's one slot; others go to the other replica. R is killed: the stream ends with an error
    event, and every request that had not started streaming is answered (the waiting one by the other
    replica, sent again), with the single-process server's text."""
    import ray

    c = client(replicas)
    raw = c.completions.with_raw_response.create(model="smol", prompt=STORY + " a long story.", max_tokens=4000,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True})
    victim = raw.headers["x-specdecode-replica"]
    stream = iter(raw.parse())
    next(stream)
    with ThreadPoolExecutor(4) as pool:
        follower = pool.submit(complete, c, FOLLOWER)  # the stream's prefix: queued behind it on R
        time.sleep(0.5)
        others = [pool.submit(complete, c, p) for p in PROMPTS[1:4]]
        time.sleep(1.0)
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("SERVE_REPLICA::") and a["name"].endswith(f"#{victim}")]
        assert len(names) == 1, names
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
        with pytest.raises(openai.APIError, match="went away"):
            for _ in stream:
                pass
        assert follower.result(timeout=120) == reference[FOLLOWER]
        assert [f.result(timeout=120) for f in others] == [reference[p] for p in PROMPTS[1:4]]
    assert per_replica(replicas, ("specdecode:replica_lost_streams_total",)) == {"": 1.0}
    assert per_replica(replicas, ("specdecode:replica_retries_total",))[""] >= 1  # the follower, sent again
