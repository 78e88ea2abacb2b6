"""What a request must pass before it reaches the engine: a bounded queue (429), a queue timeout and
a drain (503), each with Retry-After and an OpenAI-style body; a JSON content type (415); a Host
allow-list for a loopback server without a key (400). Slow steps keep a long request in flight;
every assertion is on what the server answers, never on how long it took."""
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from specdecode.cli import build_parser
from specdecode.config import ServerConfig
from specdecode.errors import InvalidRequestError
from specdecode.server.admission import allowed_hosts, host_name
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.cli import server_config
from server_helpers import MODEL, hi, slow_steps, tiny_engine, wait_idle


def one_slot_server(**cfg):
    engine = tiny_engine("none", max_num_seqs=1)
    srv = BackgroundServer(create_app(engine, [MODEL], config=ServerConfig(**cfg)), grace=0.5)
    srv.engine, srv.worker = engine, srv.server.config.app.state.worker
    return srv


def long_stream(srv):
    """A streamed request that holds the only slot until its client closes it."""
    body = hi(messages=[{"role": "user", "content": "long"}], max_tokens=380, temperature=0, stream=True)
    return httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=60)


def running(stream):
    """Reads up to the first token (it holds the slot then); the caller keeps the line iterator:
    dropping it closes the connection, and the server aborts the request."""
    lines = (x for x in stream.iter_lines() if x)
    for _ in range(2):  # the role chunk, then a token
        next(lines)
    return lines


def refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "\n" not in err["message"]
    assert int(r.headers["retry-after"]) > 0


def until(cond) -> None:
    import time
    for _ in range(2000):
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError("the server never got there")


def test_a_full_queue_refuses_with_429_and_the_queued_request_still_runs():
    with one_slot_server(max_queue=1) as srv, slow_steps(srv.engine), ThreadPoolExecutor(1) as pool:
        with long_stream(srv) as first:
            lines = running(first)
            queued = pool.submit(httpx.post, f"{srv.url}/v1/chat/completions", json=hi(max_tokens=3), timeout=60)
            until(lambda: srv.worker.in_flight == 2)  # one running, one waiting: the queue is full
            refused(httpx.post(f"{srv.url}/v1/chat/completions", json=hi(max_tokens=3)), 429, "queue_full")
            refused(httpx.post(f"{srv.url}/v1/completions", json={"model": MODEL, "prompt": "a", "stream": True}),
                    429, "queue_full")
            del lines
        # the first client went away: the queued request gets the slot and is answered in full
        r = queued.result()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        wait_idle(srv.engine)
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert 'specdecode:request_errors_total{status="429"} 2.0' in metrics


def test_a_request_waiting_past_the_queue_timeout_gets_503():
    with one_slot_server(queue_timeout=0.2) as srv, slow_steps(srv.engine):
        with long_stream(srv) as first:
            lines = running(first)
            refused(httpx.post(f"{srv.url}/v1/chat/completions", json=hi(max_tokens=3), timeout=60),
                    503, "queue_timeout")
            # a streamed request is refused the same way: its response had not started
            with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=hi(stream=True), timeout=60) as r:
                r.read()
                refused(r, 503, "queue_timeout")
            assert next(lines).startswith("data: {")  # the first goes on
        wait_idle(srv.engine)


def test_a_draining_server_refuses_new_and_waiting_requests():
    srv = one_slot_server().start()
    with slow_steps(srv.engine), ThreadPoolExecutor(1) as pool, long_stream(srv) as first:
        lines = running(first)
        queued = pool.submit(httpx.post, f"{srv.url}/v1/chat/completions", json=hi(max_tokens=3), timeout=60)
        until(lambda: srv.worker.in_flight == 2)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()  # as on SIGTERM: 0.5 s of grace, then what still runs is aborted
        until(lambda: srv.worker.draining)
        refused(queued.result(), 503, "shutting_down")  # it never started: a status, not a cut stream
        last = [x for x in lines if x.startswith("data: {")][-1]
        assert '"finish_reason":"abort"' in last
        stopper.join(30)


def test_a_draining_worker_refuses_new_requests():
    with one_slot_server() as srv:
        srv.worker.drain(60)
        refused(httpx.post(f"{srv.url}/v1/chat/completions", json=hi(max_tokens=2)), 503, "shutting_down")


@pytest.fixture(scope="module")
def local_server():
    """Loopback, no API key, the serve command's defaults: the Host allow-list is on."""
    with BackgroundServer(create_app(tiny_engine("none"), [MODEL], config=ServerConfig())) as srv:
        yield srv


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_posts_must_be_json(local_server, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = httpx.post(f"{local_server.url}{path}", content=b'{"model": "tiny", "prompt": "a"}', headers=headers)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", r.text
    ok = httpx.post(f"{local_server.url}/v1/completions", content=b'{"model": "tiny", "prompt": "a", "max_tokens": 2}',
                    headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert ok.status_code == 200


@pytest.mark.parametrize("host,status", [("evil.example", 400), ("evil.example:8000", 400), ("localhost", 200),
                                         ("LOCALHOST:8000", 200), ("127.0.0.1:1", 200), ("[::1]:8000", 200),
                                         ("localhost.evil.example", 400), ("", 400)])
def test_a_loopback_server_without_a_key_answers_only_local_host_names(local_server, host, status):
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions")):
        r = httpx.request(method, f"{local_server.url}{path}", headers={"Host": host},
                          json={"model": MODEL, "prompt": "a", "max_tokens": 1})
        assert r.status_code == status, (method, path, r.text)
        if status == 400:
            assert r.json()["error"]["code"] == "invalid_host"


def test_which_host_names_are_allowed():
    local = {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts(ServerConfig(), None) == local
    assert allowed_hosts(ServerConfig(host="127.0.0.2"), None) == local | {"127.0.0.2"}
    assert allowed_hosts(ServerConfig(), "key") is None  # a key guards it already
    assert allowed_hosts(ServerConfig(host="0.0.0.0"), None) is None  # served to others: their names are unknown
    assert allowed_hosts(ServerConfig(allowed_hosts=("*",)), None) is None
    assert allowed_hosts(ServerConfig(host="0.0.0.0", allowed_hosts=("Api.Example",)), "key") == {"api.example"}
    assert [host_name(h) for h in ("a.b:80", "A.B.", "[::1]:80", "::1", "a.b:x")] == ["a.b", "a.b", "::1", "::1", "a.b:x"]


def test_serve_flags_follow_server_config():
    parse = build_parser().parse_args
    assert server_config(parse(["serve"])) == ServerConfig()
    a = parse(["serve", "--max-queue", "3", "--queue-timeout", "0", "--allowed-hosts", "a.example, b.example",
               "--host", "0.0.0.0", "--port", "9000"])
    assert server_config(a) == ServerConfig(host="0.0.0.0", port=9000, max_queue=3, queue_timeout=0.0,
                                            allowed_hosts=("a.example", "b.example"))
    with pytest.raises(InvalidRequestError, match="--max-queue"):
        server_config(parse(["serve", "--max-queue", "-1"]))
