"""Starting :mod:`evals.serve` as a process on 127.0.0.1 and asking it over HTTP: what tests/test_serve.py and
bench/serve_bench.py share. Only the standard library: ``urllib`` against the OpenAI-compatible ``/v1/completions``.
The server process is always stopped (its model process exits with it), every request bounded by a timeout."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: python -m evals.serve runs from it


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running(args: list[str], start_timeout: float = 300, log: Path | None = None):
    """``python -m evals.serve <args>`` on a free port of 127.0.0.1, once ``/health`` answers: yields its base URL;
    stopped on exit (SIGTERM, then SIGKILL). A server that exits or does not answer in time: RuntimeError with
    the end of its log."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}
    if log is None:  # a file, not a pipe: a pipe nobody reads fills and stops the server
        handle, name = tempfile.mkstemp(prefix="evals-serve-", suffix=".log")
        os.close(handle)
        log = Path(name)
    out = open(log, "w")  # noqa: SIM115 -- closed below
    command = [sys.executable, "-m", "evals.serve", *args, "--host", HOST, "--port", str(port), "--device", "cpu"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                said = Path(log).read_text()
                raise RuntimeError(f"the server exited ({process.returncode}): {said[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not answer on {url}/health in {start_timeout:.0f} s")
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)
        out.close()


def post(url: str, path: str, body: dict, timeout: float = 300) -> tuple[int, dict]:
    """(status, JSON body) of a POST."""
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def complete(url: str, prompt: str, max_tokens: int, timeout: float = 300, **extra) -> dict:
    """A greedy ``/v1/completions`` (temperature 0): its JSON; an HTTP error raises."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    status, found = post(url, "/v1/completions", body, timeout)
    if status != 200:
        raise RuntimeError(f"/v1/completions answered {status}: {found}")
    return found


def stream(url: str, prompt: str, max_tokens: int, timeout: float = 900) -> tuple[str, float, float, dict]:
    """A greedy streamed ``/v1/completions``: (text, seconds to the first token, seconds from it to the last, the
    usage: prompt and completion tokens) -- prefill and decode timed apart over HTTP."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    started, first, last, parts, usage = time.perf_counter(), None, None, [], {}
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"the stream failed: {chunk['error']}")
            usage = chunk.get("usage") or usage
            text = "".join(c.get("text") or "" for c in chunk.get("choices") or [])
            if text:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                parts.append(text)
    if first is None:
        raise RuntimeError("the stream returned no text")
    return "".join(parts), first - started, last - first, usage
