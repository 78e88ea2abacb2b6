"""The README's set-up makes the README's commands work: in a fresh virtual environment (no system
packages), `./install.sh` and then the server and its benchmark, which once died with
ModuleNotFoundError (fastapi, httpx) because their dependencies sat in extras.

Slow (a few minutes: torch and the package install into the new environment); CI runs it."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _smollm2() -> str:
    try:
        from specdecode.store import resolve_model
        return str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no registry: optional
        pytest.skip(f"SmolLM2 unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def test_readme_setup_in_a_fresh_venv(tmp_path):
    model = _smollm2()
    src = tmp_path / "src"  # a copy: the editable install must not re-point this checkout's own
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "out", "__pycache__", "*.egg-info", ".pytest_cache"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, bin_ = venv / "bin" / "python", venv / "bin"
    env = {**os.environ, "PYTHON": str(py), "PATH": f"{bin_}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    subprocess.run(["./install.sh"], cwd=src, env=env, check=True, timeout=1500)
    cli = str(bin_ / "specdecode")

    port = _free_port()
    server = subprocess.Popen([cli, "serve", "-m", model, "--port", str(port), "--threads", "1"], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, f"serve exited: {server.stdout.read()[-2000:]}"
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(1)
        name = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=30))["data"][0]["id"]
        req = urllib.request.Request(f"{url}/v1/chat/completions", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": name, "max_tokens": 4, "temperature": 0,
                                                      "messages": [{"role": "user", "content": "Hi"}]}).encode())
        try:
            answer = json.load(urllib.request.urlopen(req, timeout=120))
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{e.code}: {e.read().decode()[:500]}") from None
        assert answer["choices"][0]["message"]["content"] is not None
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text('{"prompt": "Name a color."}\n{"prompt": "Count to three."}\n')
        out = subprocess.run([cli, "bench-serve", "--url", url, "--concurrency", "1", "--requests", "2", "--max-tokens",
                              "4", "--prompts", str(prompts)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    finally:
        server.terminate()
        server.wait(30)
    models = subprocess.run([cli, "models"], env=env, capture_output=True, text=True, timeout=120)
    assert models.returncode == 0 and "smollm2-135m-instruct" in models.stdout
