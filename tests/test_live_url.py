"""``kvtier bench live --url``'s client half, without vLLM: a real HTTP server
(the standard library's) that speaks the part of vLLM's OpenAI server the
benchmark uses: ``/v1/models``, ``/version``, ``/metrics`` (with kvtier's
counters and ``vllm:cache_config_info``) and streamed ``/v1/completions``
with ``return_token_ids``, ``cache_salt`` and ``usage.prompt_tokens_details``.
Its prefix cache is keyed by (salt, block-aligned prefix), as vLLM's block
hashes are, and its output is a pure function of the prompt (greedy).

The live test (tests/live/test_live_url.py) runs the same command against
a real ``vllm serve`` with kvtier's connector."""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvtier.bench.live.http_engine import HttpEngine, ServerError
from kvtier.bench.live.server_metrics import block_size, counters_delta, kvtier_counters
from kvtier.bench.sim.trace import make_session, write_trace
from kvtier.cli.main import main

BLOCK = 16


class VllmLike(ThreadingHTTPServer):
    """A server on 127.0.0.1 answering as vLLM's OpenAI server does.  ``mode``:
    ``ok``; ``no_details`` (no ``prompt_tokens_details``, as vLLM without
    ``--enable-prompt-tokens-details``); ``reject`` (HTTP 400 with vLLM's error
    body); ``slow`` (first byte after 3 s); ``stream_error`` (an error event
    after the first token); ``no_kvtier`` (``/metrics`` without kvtier);
    ``no_ids`` (text but no ``token_ids``, as a server without ``return_token_ids``)."""
    daemon_threads = True

    def __init__(self, mode: str = "ok", max_model_len: int = 4096) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode, self.max_model_len = mode, max_model_len
        self.cache: set[tuple] = set()
        self.requests: list[dict] = []
        self.counters = {"stored": 0, "loaded": 0, "decisions": 0}
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> "VllmLike":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):   # a client that stops reading is no error here
            super().handle_error(request, client_address)

    def complete(self, body: dict) -> tuple[list[int], int]:
        """The greedy output and the cached prompt tokens; the prompt's full blocks are cached after it."""
        prompt, salt = body["prompt"], body.get("cache_salt")
        with self.lock:
            self.requests.append(body)
            full = len(prompt) // BLOCK
            hit = 0
            while hit < full and (salt, tuple(prompt[:(hit + 1) * BLOCK])) in self.cache:
                hit += 1
            for b in range(hit, full):
                self.cache.add((salt, tuple(prompt[:(b + 1) * BLOCK])))
            self.counters["loaded"] += hit
            self.counters["stored"] += full - hit
            self.counters["decisions"] += 1 if body.get("kv_transfer_params") else 0
        h = sum((i + 1) * t for i, t in enumerate(prompt))
        return [3 + (h + 7 * i) % 997 for i in range(body["max_tokens"])], hit * BLOCK

    def metrics(self) -> str:
        return _metrics_text(self.counters if self.mode != "no_kvtier" else None)


def _metrics_text(c: dict | None) -> str:
    """vLLM's exposition: its cache config, and kvtier's counters ``c`` (None: no kvtier connector)."""
    lines = ['vllm:cache_config_info{block_size="%d",engine="0",enable_prefix_caching="True"} 1.0' % BLOCK]
    if c is not None:
        lines += ["# TYPE vllm:kvtier_blocks_loaded_total counter",
                  f'vllm:kvtier_blocks_loaded_total{{engine="0",model_name="tiny",tier="host"}} {c["loaded"]}.0',
                  'vllm:kvtier_blocks_loaded_created{engine="0",model_name="tiny",tier="host"} 1.7e9',
                  f'vllm:kvtier_blocks_stored_total{{engine="0",model_name="tiny",tier="host"}} {c["stored"]}.0',
                  f'vllm:kvtier_decisions_total{{action="retain",engine="0",model_name="tiny"}} {c["decisions"]}.0',
                  'vllm:kvtier_contained_errors_total{engine="0",model_name="tiny"} 0.0']
    return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: VllmLike

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": "tiny", "object": "model", "max_model_len": self.server.max_model_len}]}).encode())
        elif self.path == "/version":
            self._send(200, b'{"version": "0.32.0"}')
        elif self.path == "/metrics":
            self._send(200, self.server.metrics().encode(), "text/plain")
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self.server.mode
        if mode == "reject":
            self._send(400, json.dumps({"error": {"message": "This model's maximum context length is 64 tokens",
                                                  "type": "BadRequestError", "param": None, "code": 400}}).encode())
            return
        if mode == "slow":
            time.sleep(3)
        tokens, cached = self.server.complete(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def event(doc: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            self.wfile.flush()

        for i, t in enumerate(tokens):
            ids = [t] if body.get("return_token_ids") and mode != "no_ids" else None
            event({"id": "cmpl-1", "object": "text_completion", "model": "tiny",
                   "choices": [{"index": 0, "text": f" t{t}", "token_ids": ids,
                                "finish_reason": "length" if i == len(tokens) - 1 else None}]})
            if mode == "stream_error":
                event({"error": {"message": "engine core died", "type": "InternalServerError", "code": 500}})
                return
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(tokens),
                 "total_tokens": len(body["prompt"]) + len(tokens)}
        if mode != "no_details":
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        event({"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")


def _trace(tmp_path, sessions: int = 2):
    path = tmp_path / "t.jsonl"
    write_trace(path, [make_session(f"a{i}", 0.1 * i, [(200, 4, "pytest", 0.05), (40, 4, "bash", 0.05),
                                                       (40, 4, None, None)]) for i in range(sessions)])
    return path


def _bench(tmp_path, url: str, *extra: str) -> list[str]:
    return ["bench", "live", "--url", url, "--trace", str(_trace(tmp_path)), "--sessions", "2", "--turns", "3",
            "--max-context", "400", "--arrival-spread", "0.1", *extra]


def test_bench_live_url_reports_one_configuration_over_repeats(tmp_path, capsys):
    with VllmLike() as srv:
        assert main(_bench(tmp_path, srv.url, "--repeat", "2", "--url-name", "mine", "--json",
                           "--plots", str(tmp_path / "plots"))) == 0
        requests = list(srv.requests)
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["configs"]) == ["mine"] and doc["repeat"] == 2 and doc["paired"] == {} and doc["sweep"] == []
    e = doc["engine"]
    assert e["url"] == srv.url and e["model"] == "tiny" and e["vllm"] == "0.32.0" and e["in_process"] is False
    assert e["block_tokens"] == BLOCK and e["block_tokens_from"] == "server" and e["kvtier_metrics"] is True
    row = doc["configs"]["mine"]
    for k in ("resume_ttft_p50_s", "resume_ttft_p99_s", "jct_mean_s"):
        assert row[k] > 0 and math.isfinite(row[k]) and row[k + "_se"] >= 0
    assert row["resumes"] == 4 and row["misses"] == 0 and row["outputs_equal"] is True
    # kvtier's counters: the growth of /metrics over each repeat (2 sessions x 3 turns a repeat, all hinted)
    assert row["served_chunks_by_tier"]["host"] > 0 and row["stored_chunks_by_tier"]["host"] > 0
    assert row["decisions"] == {"retain": 6.0} and row["errors"]["contained_errors"] == 0
    assert [p.endswith("ttft_cdf.png") for p in doc["plots"]] == [True]
    # what went over the wire: greedy, streamed, token ids back, kvtier's hints in the body
    turns = [r for r in requests if len(r["prompt"]) > 1]
    assert len(turns) == 12
    assert all(r["temperature"] == 0 and r["stream"] and r["return_token_ids"] and r["ignore_eos"] for r in turns)
    assert all(r["kv_transfer_params"]["kvtier"]["tool"] in ("pytest", "bash", "final") for r in turns)
    # the same prompts in both repeats, each repeat under its own cache salt
    salts = [sorted({r["cache_salt"] for r in turns[i * 6:(i + 1) * 6]}) for i in range(2)]
    assert len(salts[0]) == len(salts[1]) == 1 and salts[0] != salts[1]
    assert sorted(map(tuple, (r["prompt"] for r in turns[:6]))) == sorted(map(tuple, (r["prompt"] for r in turns[6:])))


def test_table_output_and_a_server_without_kvtier(tmp_path, capsys):
    with VllmLike("no_kvtier") as srv:
        assert main(_bench(tmp_path, srv.url)) == 0
    out = capsys.readouterr().out
    assert "url" in out and "no kvtier counters" in out and "0.32.0" in out
    with VllmLike("no_kvtier") as srv:
        assert main(_bench(tmp_path, srv.url, "--json")) == 0
    row = json.loads(capsys.readouterr().out)["configs"]["url"]
    assert row["served_chunks_by_tier"] == {} and "decisions" not in row and row["outputs_equal"] is None


@pytest.mark.parametrize("mode, extra, message", [
    ("no_details", (), "--enable-prompt-tokens-details"),
    ("reject", (), "HTTP 400: This model's maximum context length is 64 tokens"),
    ("slow", ("--url-timeout", "0.5"), "no answer within 0.5 s"),
    ("stream_error", (), "engine core died"),
    ("no_ids", (), "does not return the output's token ids (return_token_ids)"),
])
def test_server_failures_are_one_line_errors(tmp_path, capsys, mode, extra, message):
    with VllmLike(mode) as srv:
        assert main(_bench(tmp_path, srv.url, "--json", *extra)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("kvtier bench live: error: --url: ") and message in err


def test_nothing_listening_and_bad_urls(tmp_path, capsys):
    with VllmLike() as srv:
        url = srv.url                       # a port that was ours a moment ago, now closed
    assert main(_bench(tmp_path, url)) == 2
    assert "connection refused (is `vllm serve` running there?)" in capsys.readouterr().err
    assert main(_bench(tmp_path, "localhost:8000")) == 2
    assert "is not an http:// or https:// URL" in capsys.readouterr().err


def test_a_workload_longer_than_the_servers_context_is_refused_before_any_request(tmp_path, capsys):
    with VllmLike(max_model_len=128) as srv:
        assert main(_bench(tmp_path, srv.url)) == 2
        assert srv.requests == []
    assert "exceeds the server's max_model_len (128): lower --max-context" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (("--url", "http://x", "--configs", "lru"), "--configs does not apply with --url"),
    (("--url", "http://x", "--sweep-host", "0.1", "--nvme-gbps", "1"),
     "--sweep-host, --nvme-gbps do not apply with --url"),
    (("--url-name", "a",), "--url-name applies only with --url"),
    (("--vocab", "10", "--block-tokens", "16"), "--vocab, --block-tokens apply only with --url"),
])
def test_flags_of_the_other_mode_are_refused(capsys, args, message):
    assert main(["bench", "live", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_engine_contract_and_the_v1_suffix(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY"):      # a proxy of the environment is never used
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with VllmLike() as srv:
        eng = HttpEngine(srv.url + "/v1/", cache_salt="s")
        r1 = eng.generate(list(range(3, 3 + 40)), max_tokens=5, kv_transfer_params={"kvtier": {"tool": "x"}})
        r2 = eng.generate(list(range(3, 3 + 40)), max_tokens=5)
        other = HttpEngine(srv.url, cache_salt="t").generate(list(range(3, 3 + 40)), max_tokens=5)
    assert len(r1.tokens) == 5 and r1.tokens == r2.tokens == other.tokens
    assert (r1.prompt_tokens, r1.cached_tokens, r2.cached_tokens, other.cached_tokens) == (40, 0, 32, 0)
    assert 0 < r1.ttft_s <= r1.total_s


def test_metrics_parsing():
    text = _metrics_text({"stored": 5, "loaded": 2, "decisions": 3})
    c = kvtier_counters(text + 'vllm:kvtier_blocks_loaded_total{engine="1",model_name="tiny",tier="host"} 1.0\n')
    assert c["loaded_by_tier"] == {"host": 3.0} and c["stored_by_tier"] == {"host": 5.0}   # summed over engines
    assert c["decisions"] == {"retain": 3.0} and c["contained_errors"] == 0.0
    assert block_size(text) == BLOCK and block_size("vllm:other 1\n") is None
    assert kvtier_counters("vllm:num_requests_running 0\n") is None
    d = counters_delta(c, {"loaded_by_tier": {"host": 1.0}, "decisions": {}, "contained_errors": 0.0})
    assert d["loaded_by_tier"] == {"host": 2.0} and d["stored_by_tier"] == {"host": 5.0}
    with pytest.raises(ServerError):
        HttpEngine("ftp://x")
