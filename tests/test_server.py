"""The OpenAI-compatible server on tiny random models, driven by the official `openai` client and
raw httpx: formats, errors, auth, disconnects, a bounded load test, shutdown, and bench-serve.
All traffic goes to 127.0.0.1; every request is bounded in tokens and time."""
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from specdecode.bench.prompts import load_prompts
from specdecode.bench.serve import bench_engines
from specdecode.cli import main
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from server_helpers import AUTH, JSON, KEY, MODEL, ChatCharTokenizer, chat, client, hi, slow_steps, tiny_engine, wait_idle


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine()
    with BackgroundServer(create_app(engine, [MODEL, "alias"], api_key=KEY)) as srv:
        srv.engine, srv.worker = engine, srv.server.config.app.state.worker
        yield srv


def test_chat_completion_usage_and_spec(server):
    r = chat(server, "hello", max_tokens=12)
    prompt = ChatCharTokenizer(384).encode("<user>hello<a>")
    assert r.model == MODEL and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and len(r.choices[0].message.content) == 12
    assert r.choices[0].finish_reason == "length"  # CharTokenizer has no EOS
    use = r.usage
    assert (use.prompt_tokens, use.completion_tokens, use.total_tokens) == (len(prompt), 12, len(prompt) + 12)
    spec = r.model_extra["spec"]  # the extra field: standard clients keep it, and ignore it
    assert spec["type"] == "draft" and spec["draft_tokens"] > 0
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["steps"], abs=1e-3)
    assert chat(server, "hello", max_tokens=12).choices[0].message.content == r.choices[0].message.content


def test_chat_streaming_with_usage(server):
    ref = chat(server, "stream me", max_tokens=15).choices[0].message.content
    chunks = list(chat(server, "stream me", max_tokens=15, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].model_extra["spec"]["steps"] > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 15
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_wire_format(server):
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
    assert "usage" not in chunks[0]  # only with stream_options.include_usage
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len("".join(c["choices"][0]["text"] for c in chunks)) == 6


def test_completions(server):
    c = client(server)
    text = c.completions.create(model=MODEL, prompt="abcabc", max_tokens=10, temperature=0).choices[0].text
    ids = ChatCharTokenizer(384).encode("abcabc")
    assert c.completions.create(model="alias", prompt=ids, max_tokens=10, temperature=0).choices[0].text == text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt="abcabc", max_tokens=10, temperature=0, stream=True))
    assert streamed == text
    stopped = c.completions.create(model=MODEL, prompt="abcabc", max_tokens=10, temperature=0, stop=[text[3:5]])
    assert stopped.choices[0].text == text[:text.index(text[3:5])] and stopped.choices[0].finish_reason == "stop"


def test_logprobs_chat_and_completions(server):
    """OpenAI's logprobs objects, one entry per generated token (each CharTokenizer token is one character
    of the text), the same figures streamed or not, under speculation (the server drafts 4 tokens)."""
    r = chat(server, "log me", max_tokens=12, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(e.token for e in content) == r.choices[0].message.content and len(content) == 12
    for e in content:
        assert e.bytes == list(e.token.encode()) and e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob  # greedy
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    assert r.model_extra["spec"]["accepted_tokens"] > 0  # some tokens came from drafts
    chunks = list(chat(server, "log me", max_tokens=12, logprobs=True, top_logprobs=2, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert chat(server, "log me", max_tokens=3).choices[0].logprobs is None
    c = client(server).completions.create(model=MODEL, prompt="abcabc", max_tokens=8, temperature=0, logprobs=1)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and lp.text_offset == list(range(8))
    assert len(lp.token_logprobs) == 8 and [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]


def test_penalties_reach_the_engine(server):
    plain = chat(server, "aaaa", max_tokens=24).choices[0].message.content
    penalized = chat(server, "aaaa", max_tokens=24, frequency_penalty=2.0, presence_penalty=1.0,
                     extra_body={"repetition_penalty": 1.5}).choices[0].message.content
    assert len(penalized) == 24 and penalized != plain
    assert len(set(penalized)) > len(set(plain))  # fewer repeats


def test_models_health_metrics(server):
    assert [m.id for m in client(server).models.list()] == [MODEL, "alias"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    chat(server, "for the metrics", max_tokens=3)
    m = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    for name in ("specdecode:request_success_total{", "specdecode:spec_decode_num_accepted_tokens_total",
                 "specdecode:kv_slots_free", "specdecode:time_to_first_token_seconds_bucket",
                 "specdecode:prefix_cache_hits_total", "specdecode:request_queue_time_seconds_bucket",
                 "specdecode:prompt_store_hits_total", "specdecode:prompt_store_bytes"):
        assert name in m.text
    gated = server.engine.planner.gated_steps
    server.engine.planner.gated_steps = gated + 5  # the gate's count reaches /metrics as it is
    m = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert f"specdecode:spec_decode_gated_steps_total {float(gated + 5)}" in m.text
    server.engine.planner.gated_steps = gated


def test_api_key(server):
    for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/chat/completions")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, f"{server.url}{path}", headers=headers, json={})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


LONG = "x" * 400  # the tiny model's context is 400 tokens
BAD = [("chat", "{not json"), ("chat", "[1, 2]"), ("chat", '{"model": "tiny"}'), ("chat", hi(messages="hi")),
       ("chat", hi(temperature="hot")), ("chat", hi(max_tokens="5")), ("chat", hi(model="gpt-4")),
       ("chat", hi(temperature=-0.5)), ("chat", hi(top_p=0)), ("chat", hi(top_p=1.5)), ("chat", hi(max_tokens=0)),
       ("chat", hi(n=2)), ("chat", hi(stream_options={})), ("chat", hi(messages=[])),
       ("chat", hi(messages=[{"role": "user", "content": [{"type": "image_url"}]}])),
       ("chat", hi(messages=[{"role": "user", "content": LONG}])), ("completions", {"model": MODEL, "prompt": LONG}),
       ("completions", {"model": MODEL, "prompt": "abc", "max_tokens": 398}),
       ("completions", {"model": MODEL, "prompt": ""}), ("completions", {"model": MODEL, "prompt": [1, 2, 100000]}),
       ("completions", {"model": MODEL, "prompt": ["a", "b"]}),
       ("completions", {"model": MODEL, "prompt": "abc", "min_p": 2}),
       ("chat", hi(top_logprobs=2)), ("chat", hi(logprobs=True, top_logprobs=21)),
       ("chat", hi(presence_penalty=2.5)), ("chat", hi(repetition_penalty=0)), ("chat", hi(frequency_penalty="1")),
       ("completions", {"model": MODEL, "prompt": "abc", "logprobs": 21})]


@pytest.mark.parametrize("endpoint,body", BAD)
def test_bad_requests_are_400(server, endpoint, body):
    # a raw body is sent as JSON all the same: the server refuses any other content type (415)
    kw = {"content": body, "headers": AUTH | JSON} if isinstance(body, str) else {"json": body, "headers": AUTH}
    r = httpx.post(f"{server.url}/v1/{'chat/' if endpoint == 'chat' else ''}completions", **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and "\n" not in err["message"]


def test_unknown_route_and_method(server):
    assert httpx.get(f"{server.url}/v2/nothing", headers=AUTH).json()["error"]["code"] == "not_found"
    assert httpx.get(f"{server.url}/v1/chat/completions", headers=AUTH).status_code == 405
    assert chat(server, "still serving", max_tokens=2).choices[0].finish_reason == "length"


def test_disconnect_frees_slot(server):
    engine = server.engine
    ref = chat(server, "bystander", max_tokens=30).choices[0].message.content
    with ThreadPoolExecutor(1) as pool, slow_steps(engine):
        bystander = pool.submit(chat, server, "bystander", 30)
        body = hi(messages=[{"role": "user", "content": "long"}], max_tokens=380, stream=True)
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            seq = next(s for s in engine.running if len(s.prompt_ids) == len("<user>long<a>"))
        wait_idle(engine)  # the aborted stream left, and the bystander finished
        assert seq.finish_reason == "abort" and len(seq.output_ids) < 380
        assert bystander.result().choices[0].message.content == ref


def test_non_streaming_disconnect_aborts(server):
    aborted = server.worker.aborted
    body = hi(messages=[{"role": "user", "content": "long"}], max_tokens=380)
    with slow_steps(server.engine), pytest.raises(httpx.ReadTimeout):  # the client gives up, closes the connection
        httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=httpx.Timeout(10, read=0.3))
    wait_idle(server.engine)
    assert server.worker.aborted == aborted + 1


PROMPTS = [f"q{i}:" + "abcdefgh"[: i % 8] * (1 + 7 * (i % 3)) for i in range(12)]


def test_load_outputs_identical_to_alone(server):
    """16 requests, 4 at a time on 3 slots (so some queue), streamed and not, 4 clients disconnecting:
    every completed output equals the same request served alone."""
    alone = {p: chat(server, p, max_tokens=24).choices[0].message.content for p in PROMPTS}
    aborted = server.worker.aborted

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        if i % 4 == 3:  # disconnect after the first chunks of a long request
            with chat(server, p, max_tokens=300, stream=True) as s:
                it = iter(s)
                for _ in range(3):
                    next(it)
            return None
        if i % 2:
            return p, "".join(c.choices[0].delta.content or "" for c in chat(server, p, max_tokens=24, stream=True))
        return p, chat(server, p, max_tokens=24).choices[0].message.content

    with ThreadPoolExecutor(4) as pool, slow_steps(server.engine, 0.002):
        results = list(pool.map(one, range(16)))
    done = [r for r in results if r is not None]
    assert len(done) == 12
    for p, text in done:
        assert text == alone[p], p
    wait_idle(server.engine)
    assert server.worker.aborted == aborted + 4


def test_step_failure_is_500_and_server_recovers(server):
    engine, real = server.engine, server.engine.step

    def fail_once():
        engine.step = real
        raise RuntimeError("simulated device error")

    engine.step = fail_once  # the worker's next step fails, once
    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=30,
                   json={"model": MODEL, "prompt": "abc", "max_tokens": 4})
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
    wait_idle(engine)
    assert chat(server, "after the failure", max_tokens=3).usage.completion_tokens == 3


def test_shutdown_finishes_short_requests_and_aborts_long_ones():
    """As on SIGINT/SIGTERM: no new connections; in-flight requests get the grace period to finish,
    then are aborted with a proper ending (finish_reason "abort", then [DONE])."""
    engine = tiny_engine("none")
    srv = BackgroundServer(create_app(engine, [MODEL]), grace=1.0).start()
    worker = srv.server.config.app.state.worker
    url = f"{srv.url}/v1/chat/completions"
    short, long = (httpx.stream("POST", url, json=hi(max_tokens=n, stream=True, temperature=0), timeout=30)
                   for n in (20, 380))
    with slow_steps(engine, 0.02), short as r1, long as r2:
        lines = [r1.iter_lines(), r2.iter_lines()]
        for it in lines:
            next(it)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        ends = [[json.loads(x[6:]) for x in it if x.startswith("data: {")][-1]["choices"][0]["finish_reason"]
                for it in lines]
        stopper.join(30)
    assert ends == ["length", "abort"]
    assert not stopper.is_alive() and not worker.alive and not engine.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.url}/health")


def test_a_stopped_server_lets_go_of_its_engine():
    """FastAPI keeps every route's function in a module-level cache, so an app's routes outlive it: a
    process serving engine after engine (bench-serve's levels) kept every one of them, KV cache and all,
    until its routes stopped reaching the engine but through the worker, which drops it on stopping."""
    import gc
    import weakref

    engine = tiny_engine("none")
    with BackgroundServer(create_app(engine, [MODEL])) as srv:
        assert chat(srv, "hi", max_tokens=3).choices[0].message.content
        worker = srv.server.config.app.state.worker
    assert worker.engine is None and srv.server.config.app.state.metrics.render()  # scraping still answers
    ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None


def test_reset_prefix_cache_route(server):
    chat(server, "cache this prompt", max_tokens=3)
    wait_idle(server.engine)
    assert any(server.engine.prefix_cache.cached.values())
    assert httpx.post(f"{server.url}/reset_prefix_cache").status_code == 401
    r = httpx.post(f"{server.url}/reset_prefix_cache", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"reset": True}
    assert not server.engine.prefix_cache.cached and len(server.engine.prefix_cache.store) == 0
    assert chat(server, "and the server goes on", max_tokens=3).choices[0].message.content


def test_bench_serve(server, tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:4]))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    resets = []
    real = server.engine.reset_prefix_cache
    monkeypatch.setattr(server.engine, "reset_prefix_cache", lambda: resets.append(1) or real())
    args = ["bench-serve", "--url", server.url, "--api-key", KEY, "--prompts", str(prompts), "--concurrency", "1,2",
            "--requests", "2", "--max-tokens", "6"]
    assert main(args + ["--json-out", str(out), "--plot", str(png)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["host"] is None  # a server at --url: its machine is not this process's to describe
    level = data["results"][MODEL]["2"]
    assert level["requests"] == 4 and level["output_tokens_per_s"] > 0 and level["tau"] >= 1.0
    assert len(data["records"]) == 2 + 4 and png.stat().st_size > 0
    assert len(resets) == 2  # each level starts with nothing cached
    assert main(args + ["--warm-levels"]) == 0 and len(resets) == 2
    assert main(args + ["--rounds", "2", "--json-out", str(out)]) == 0 and len(resets) == 2 + 4
    data = json.loads(out.read_text())
    assert data["results"][MODEL]["2"]["rounds"] == 2 and len(data["records"]) == 2 * (2 + 4)
    conv = tmp_path / "c.jsonl"  # two-turn conversations: an answer goes back in its next turn's history
    conv.write_text("\n".join(json.dumps({"turns": [p, "and then?"]}) for p in PROMPTS[:2]))
    sent = []
    add = server.engine.add_request
    monkeypatch.setattr(server.engine, "add_request", lambda ids, params: sent.append(add(ids, params)) or sent[-1])
    assert main(["bench-serve", "--url", server.url, "--api-key", KEY, "--prompts", str(conv), "--concurrency", "1",
                 "--requests", "2", "--max-tokens", "6", "--turns", "all", "--json-out", str(out)]) == 0
    monkeypatch.setattr(server.engine, "add_request", add)
    assert [r["turn"] for r in json.loads(out.read_text())["records"]] == [0, 0, 1, 1]  # turn by turn
    first, second = sent[-4:-2], sent[-2:]  # (after the warm-up request)
    for a, b in zip(first, second):
        n = len(a.output_ids)
        assert n > 0 and any(b.prompt_ids[i:i + n] == a.output_ids for i in range(len(b.prompt_ids)))
    seen = []  # the sampling filters reach the engine with every request
    add = server.engine.add_request
    monkeypatch.setattr(server.engine, "add_request", lambda ids, params: seen.append(params) or add(ids, params))
    assert main(args + ["--temperature", "0.8", "--top-p", "0.9", "--top-k", "5", "--min-p", "0.01"]) == 0
    assert seen and {(p.temperature, p.top_p, p.top_k, p.min_p) for p in seen} == {(0.8, 0.9, 5, 0.01)}
    built = []

    def factory(spec_type):
        return lambda: built.append(spec_type) or tiny_engine(spec_type)
    results, records = bench_engines([("none", factory("none")), ("draft", factory("draft"))],
                                     load_prompts(prompts), [1, 2], 2, {"max_tokens": 6, "temperature": 0})
    assert set(results) == {"none", "draft"} and list(results["draft"]) == [1, 2] and results["draft"][2]["tau"] > 1.0
    assert {r["completion_tokens"] for r in records} == {6}
    assert built == ["none", "none", "draft", "draft"]  # a fresh engine for every level
    built.clear()
    bench_engines([("none", factory("none"))], load_prompts(prompts), [1, 2], 2, {"max_tokens": 6}, warm_levels=True)
    assert built == ["none"]
    built.clear()  # rounds: configurations in turns, ABBA, a level's figures combined over them
    results, records = bench_engines([("none", factory("none")), ("draft", factory("draft"))],
                                     load_prompts(prompts), [2], 2, {"max_tokens": 6, "temperature": 0}, rounds=2)
    assert built == ["none", "draft", "draft", "none"] and {r["round"] for r in records} == {1, 2}
    level = results["draft"][2]
    runs = level["output_tokens_per_s_runs"]
    assert level["rounds"] == 2 and len(runs) == 2 and min(runs) <= level["output_tokens_per_s"] <= max(runs)
    pair = [d / n for d, n in zip(runs, results["none"][2]["output_tokens_per_s_runs"])]
    assert level["vs_first_range"] == [round(min(pair), 3), round(max(pair), 3)]
    assert results["none"][2]["vs_first"] == 1.0


def test_bench_serve_reads_events_whose_text_holds_unicode_line_separators():
    """Generated text may hold U+2028, U+2029 or U+0085, which JSON leaves unescaped: the client splits
    the event stream at CR / LF only (str.splitlines, as httpx's aiter_lines, would cut the event)."""
    import asyncio

    from specdecode.bench.serve import _sse_lines

    event = "data: " + json.dumps({"choices": [{"delta": {"content": "a\u2028b\x85c\u2029"}}]}, ensure_ascii=False)

    class Response:
        async def aiter_text(self):
            for part in (event[:20], event[20:] + "\r", "\n\ndata: [DONE]\n\n"):
                yield part

    async def read():
        return [line async for line in _sse_lines(Response())]

    lines = [x for x in asyncio.run(read()) if x]
    assert lines == [event, "data: [DONE]"]
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == "a\u2028b\x85c\u2029"


def test_bench_serve_rounds_combine_by_medians_and_paired_ratios():
    from specdecode.bench.serve_report import combine_rounds, format_table

    def level(tps, ttft):
        return {"requests": 4, "request_throughput": tps / 10, "output_tokens_per_s": tps, "ttft_p50_ms": ttft,
                "ttft_p99_ms": ttft, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0, "itl_max_ms": 2.0, "tpot_p50_ms": 1.0,
                "tpot_p99_ms": 1.0,
                "duration_s": 1.0, "tau": 1.0, "acceptance_rate": 0.0}
    # the machine drifts: round 2 is slower for both, so the paired ratios stay near 0.9
    runs = {"none": {8: [level(100, 5), level(80, 7), level(102, 6)]},
            "auto": {8: [level(90, 6), level(72, 9), level(93, 6)]}}
    out = combine_rounds(runs)
    assert out["auto"][8]["output_tokens_per_s"] == 90 and out["auto"][8]["ttft_p50_ms"] == 6
    assert out["auto"][8]["vs_first"] == 0.9 and out["auto"][8]["vs_first_range"] == [0.9, 0.912]
    table = format_table(out)
    assert "0.90x (0.90-0.91)" in table and "(72.0-93.0)" in table
    assert combine_rounds({"none": {1: [level(30, 5)]}}) == {"none": {1: level(30, 5)}}  # one round: as it was


def test_bench_serve_scaling_pairs_each_level_with_the_lowest_of_its_round():
    """'scaling': a level's tok/s over the same configuration's at its lowest level; with several rounds
    the median (range) of each round's own ratio, which the machine's drift between rounds leaves alone."""
    from specdecode.bench.serve_report import combine_rounds, format_table

    def level(tps):
        return {"requests": 4, "request_throughput": tps / 10, "output_tokens_per_s": tps, "ttft_p50_ms": 1.0,
                "ttft_p99_ms": 1.0, "itl_p50_ms": 1.0, "itl_p99_ms": 1.0, "itl_max_ms": 2.0, "tpot_p50_ms": 1.0,
                "tpot_p99_ms": 1.0, "duration_s": 1.0, "tau": 1.0, "acceptance_rate": 0.0}
    # the machine drifts between rounds: the median of the rounds' own ratios (4.0) is not the ratio of
    # the levels' medians (90 / 25 = 3.6)
    runs = {"none": {1: [level(25), level(20), level(26)], 8: [level(100), level(84), level(90)]}}
    out = combine_rounds(runs)
    assert out["none"][8]["scaling"] == 4.0 and out["none"][8]["scaling_range"] == [3.462, 4.2]
    assert out["none"][1]["scaling"] == 1.0
    assert "4.00x (3.46-4.20)" in format_table(out)
    one = format_table({"none": {1: level(20), 8: level(70)}})  # one round: the plain ratio
    assert "3.50x" in one and "scaling" in one


def test_bench_serve_level_summary_reports_the_longest_inter_token_wait():
    """A level's summary: p50 / p99 of the inter-token gaps over all requests, and the longest one (a
    prefill that stalls decoding requests shows there first)."""
    from specdecode.bench.serve_report import format_table, summarize_level

    records = [{"completion_tokens": 11, "itl_s": [0.05] * 9 + [0.4], "e2e_s": 1.0, "ttft_s": 0.1, "spec": {}},
               {"completion_tokens": 3, "itl_s": [0.05, 0.06], "e2e_s": 0.3, "ttft_s": 0.2, "spec": {}}]
    s = summarize_level(records, 2.0)
    assert s["itl_p50_ms"] == 50.0 and s["itl_max_ms"] == 400.0 and s["itl_p99_ms"] < 400.0
    assert "itlmax" in format_table({"none": {2: s}}) and " 400.0 " in format_table({"none": {2: s}})


def test_limits_on_bodies_and_stop_strings(server):
    """A body over the cap is refused before it is read whole (413), stop strings are capped at
    OpenAI's four; both are OpenAI-style errors, and the server goes on serving."""
    from specdecode.server.app import MAX_BODY_BYTES

    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": MODEL, "prompt": "x" * (MAX_BODY_BYTES + 10), "max_tokens": 2})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    for stop in (["a", "b", "c", "d", "e"], ["x" * 2000]):
        r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, json=hi(stop=stop) | {"prompt": "abc"})
        assert r.status_code == 400 and "stop" in r.json()["error"]["message"]
    assert chat(server, "still here", max_tokens=2, stop=["a", "b", "c", "d"]).choices[0].message is not None


def test_a_prompt_far_over_the_context_is_refused_before_tokenizing(server, monkeypatch):
    """A token covers at most max_piece_chars characters: a prompt with more than 4 x that x the
    context in characters is refused (400) without being templated or tokenized."""
    tok = server.engine.tokenizer
    calls = []
    monkeypatch.setattr(type(tok), "encode", lambda self, *a, **k: calls.append(1) or [0])
    over = "y" * (4 * server.engine.max_model_len * tok.max_piece_chars + 1)
    for path, body in (("chat/completions", hi() | {"messages": [{"role": "user", "content": over}]}),
                       ("completions", {"model": MODEL, "prompt": over, "max_tokens": 2})):
        r = httpx.post(f"{server.url}/v1/{path}", headers=AUTH, json=body, timeout=60)
        assert r.status_code == 400 and "far more than a context" in r.json()["error"]["message"]
    assert not calls
    monkeypatch.undo()
    assert chat(server, "still here", max_tokens=2).choices[0].message is not None


def test_a_failed_stream_does_not_echo_internal_detail(server):
    """A stream's response starts once the request runs: a step failing after that ends the stream
    with an error chunk, one failing before it is a plain 500; neither tells the internal detail."""
    engine, real = server.engine, server.engine.step
    for steps_before_failure in (1, 0):
        calls = []

        def fail_once():
            calls.append(1)
            if len(calls) > steps_before_failure:
                engine.step = real
                raise RuntimeError("Overflow when unpacking long long")
            return real()

        engine.step = fail_once
        with httpx.stream("POST", f"{server.url}/v1/completions", headers=AUTH, timeout=30,
                          json={"model": MODEL, "prompt": "abc", "max_tokens": 40, "stream": True}) as r:
            body = "".join(r.iter_text())
        if steps_before_failure:
            assert r.status_code == 200
            assert "generation failed" in body and "Overflow" not in body
        else:
            assert r.status_code == 500 and json.loads(body)["error"]["type"] == "internal_error"
            assert "Overflow" not in body
        wait_idle(engine)
