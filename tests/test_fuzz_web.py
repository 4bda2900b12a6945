"""Hypothesis-driven requests to the web API through FastAPI's TestClient (issue 16, item 5).

Bodies are built from the request models' own fields (new options are fuzzed without editing this
file) plus unknown keys, with values that broke the API before: NaN and Infinity literals, 1e400,
5000-digit integers, lone surrogate escapes, deep nesting, control characters, wrong types, and
bodies that are not JSON at all. The contract: never a 5xx, every error body is strict JSON (no
NaN), and a 500 (a bug) leaves a keep-alive connection usable.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from ftplan.web.app import create_app  # noqa: E402
from ftplan.web.schemas import EstimateRequest, ExportRequest, FitRequest, SearchRequest  # noqa: E402

REQUESTS = 260
FUZZ = settings(max_examples=REQUESTS, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
ENDPOINTS = {"estimate": EstimateRequest, "recommend": SearchRequest, "compare": SearchRequest,
             "fit": FitRequest, "export": ExportRequest}
#: raw JSON fragments (not all are valid JSON: that is the point)
RAW = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 5000, '"\\ud800"', '"a\\u0000b"', '"a\\rb"',
       '"' + "x" * 300 + '"', "[" * 200 + "]" * 200, '{"a":' * 100 + "1" + "}" * 100, "true", "null", "0", "-1",
       "1e308", "0.5", '"20M"', '"inf"', '"nan"', '"1e400"', '""', "[]", "{}", '["\\ud800"]', '"llama-3.2-1b"',
       '"h100-sxm"', '["h100-sxm"]', '"all-linear"', '"lora"', '"zero3"', "65536", "16777216", '"\\u202e"']


def _int_or_float(draw_values):
    return st.one_of(st.integers(-2**70, 2**70).map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr))


@st.composite
def bodies(draw, model_cls):
    fields = sorted(model_cls.model_fields)
    body: dict[str, str] = {}
    if draw(st.integers(0, 9)) < 8:
        body["model"] = json.dumps(draw(st.sampled_from(["llama-3.2-1b", "qwen3-30b-a3b", "mixtral-8x7b"])))
    if model_cls in (SearchRequest, ExportRequest):
        body["tokens"] = '"20M"'
    if model_cls is FitRequest:
        body["gpu"] = '["h100-sxm"]'
    for key in draw(st.lists(st.sampled_from(fields + ["bogus", "config"]), max_size=5)):
        body[key] = draw(st.sampled_from(RAW) | _int_or_float(None)
                         | st.text(max_size=8).map(lambda t: json.dumps(t)))
    if "config" in body and draw(st.booleans()):
        body.pop("model", None)
        body["config"] = draw(st.sampled_from([
            '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1000000000, "num_attention_heads": 4,'
            ' "intermediate_size": 128, "vocab_size": 100}',
            '{"model_type": ["llama"]}', '{"model_type": "llama", "head_dim": "64"}',
            '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,'
            ' "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": "false"}',
            '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,'
            ' "intermediate_size": 128, "vocab_size": 100}']))
    text = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in body.items()) + "}"
    mangle = draw(st.integers(0, 19))
    if mangle == 0:
        text = text[: draw(st.integers(0, len(text)))]  # truncated
    elif mangle == 1:
        text = draw(st.sampled_from(RAW))  # not an object
    return text


def _strict(text: str):
    def no_constant(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=no_constant)


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app(), raise_server_exceptions=False)


@FUZZ
@given(data=st.data())
def test_fuzz_web_api(client, data):
    endpoint = data.draw(st.sampled_from(sorted(ENDPOINTS)), label="endpoint")
    text = data.draw(bodies(ENDPOINTS[endpoint]), label="body")
    r = client.post(f"/api/{endpoint}", content=text.encode("utf-8", "surrogatepass"),
                    headers={"content-type": "application/json"})
    assert r.status_code < 500, (endpoint, text[:500], r.status_code, r.text[:500])
    if r.status_code != 200 or endpoint != "export":
        doc = _strict(r.text)  # strict JSON: an echoed NaN would not parse
        if r.status_code == 422:
            assert doc["message"] and all(isinstance(e["msg"], str) for e in doc["detail"])


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(providers=st.sampled_from(["", "aws", "\u202e", "a" * 300, ",", "x"]),
       pricing=st.sampled_from(["any", "spot", "x", "", "on-demand,spot"]),
       age=st.sampled_from(["0", "-1", "1e400", "nan", "9" * 50, "120", "abc"]),
       sort=st.sampled_from(["price", "x", "", "age"]))
def test_fuzz_offers_query(client, providers, pricing, age, sort):
    r = client.get("/api/offers", params={"providers": providers, "pricing": pricing, "max_age_days": age,
                                          "sort": sort})
    assert r.status_code < 500 and _strict(r.text) is not None


@pytest.mark.parametrize("text, words", [
    ('{"model": "llama-3.2-1b", "epochs": NaN}', "NaN is not a JSON number"),
    ('{"model": "llama-3.2-1b", "seq_len": 1e400}', "out of range"),
    ('{"model": "llama-3.2-1b", "seq_len": ' + "9" * 5000 + "}", "thousands of digits"),
    ('{"model": "\\ud800"}', "invalid Unicode"),
    ('{"model": "llama-3.2-1b", "a": ' + "[" * 5000 + "]" * 5000 + "}", "nested"),
    ('{"model": "llama-3.2-1b", "epochs": 1e308}', "epochs"),
    ('{"model": "llama-3.2-1b", "tokens": "1e400"}', "tokens"),
    ('{"model": "llama-3.2-1b", "lora_dropout": "nan", "method": "lora"}', "lora_dropout"),
    ('{"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1000000000, '
     '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}}', "num_hidden_layers"),
])
def test_web_regressions_are_422(client, text, words):
    r = client.post("/api/estimate", content=text.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text[:300]
    assert words in _strict(r.text)["message"], r.text[:500]


def test_export_rejects_control_characters_in_dataset(client):
    r = client.post("/api/export", json={"model": "llama-3.2-1b", "tokens": "20M", "dataset": "a\rnum_nodes: 9"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset"]


# ---------------------------------------------------------------------------------------------
# a 500 does not poison the keep-alive connection (real uvicorn, one raw socket)
# ---------------------------------------------------------------------------------------------
def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        rest += chunk
    return status, headers, rest[:n]


def test_a_500_keeps_the_connection_alive():
    uvicorn = pytest.importorskip("uvicorn")
    app = create_app()

    @app.get("/api/_boom", include_in_schema=False)
    def boom():
        raise RuntimeError("a bug")

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            for path, want in (("/api/_boom", 500), ("/api/health", 200), ("/api/_boom", 500), ("/api/health", 200)):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                status, headers, body = _read_response(sock)
                assert status == want and headers.get("connection", "").lower() != "close", (path, status, headers)
                doc = _strict(body.decode())
                if want == 500:
                    assert "internal error" in doc["message"]
    finally:
        server.should_exit = True
        thread.join(timeout=20)
