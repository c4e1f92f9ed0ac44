"""The HTTP server, driven over loopback with the openai client and raw HTTP.

One server process for the whole module (tiny random stack, 2 slots per
pool); the last test stops it with SIGTERM.
"""

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from specdec_jax.serving import EngineRequest
from specdec_jax.serving.recipes import parse_speculation
from tests.serving import common
from tests.serving.tiny_server import CharTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
  port = _free_port()
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen([sys.executable, "-m", "tests.serving.tiny_server",
                           str(port)], cwd=ROOT, env=env)
  url = f"http://127.0.0.1:{port}"
  deadline = time.time() + 180
  while time.time() < deadline:
    try:
      if httpx.get(url + "/health", timeout=2).status_code == 200:
        break
    except httpx.HTTPError:
      time.sleep(0.5)
    assert proc.poll() is None, "the server process died at startup"
  else:
    proc.kill()
    pytest.fail("the server did not come up in 180 s")
  yield proc, url
  if proc.poll() is None:
    proc.kill()
    proc.wait()


def _client(url):
  return openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=300,
                       max_retries=0)


def _engine_request(prompt_ids, body) -> EngineRequest:
  knobs = (("alpha", body["alpha"]),) if "alpha" in body else ()
  return EngineRequest(
      prompt=tuple(prompt_ids), max_tokens=body["max_tokens"],
      speculation=parse_speculation(body.get("speculation", "chain"),
                                    depth=3),
      method=body.get("method", "spec_decode"), knobs=knobs,
      temperature=body.get("temperature", 1.0), seed=body.get("seed", 0))


# (extra fields, temperature, stream): one per strategy; the concurrent test
# reuses these pools (no new compiles).
CASES = [
    ({"speculation": "chain:3"}, 1.0, True),
    ({"speculation": "tree:2,2"}, 0.0, False),
    ({"speculation": "hierarchy:2,4"}, 0.0, True),
    ({"speculation": "chain:2", "method": "token_v3", "alpha": 0.3}, 0.0,
     False),
    ({"speculation": "off"}, 1.0, False),
]


def test_models_health_metrics_chat(server):
  _, url = server
  models = _client(url).models.list()
  assert [m.id for m in models.data] == ["tiny"]
  assert httpx.get(url + "/health").json()["status"] == "ok"
  r = httpx.post(url + "/v1/chat/completions", json={"messages": []})
  assert r.status_code == 404 and "no chat format" in r.json()["error"][
      "message"]
  assert "specdec_requests_total" in httpx.get(url + "/metrics").text


@pytest.mark.parametrize("extra,temperature,stream", CASES,
                         ids=[c[0]["speculation"] for c in CASES])
def test_openai_client_tokens_equal_offline(server, extra, temperature,
                                            stream):
  _, url = server
  client = _client(url)
  body = dict(max_tokens=10, temperature=temperature, seed=5, **extra)
  args = dict(model="tiny", prompt="hello world", max_tokens=10,
              temperature=temperature, seed=5, extra_body=extra)
  if stream:
    ids, text, reason = [], "", None
    for chunk in client.completions.create(stream=True, **args):
      c = chunk.choices[0]
      ids += c.model_extra["token_ids"]
      text += c.text
      reason = c.finish_reason or reason
  else:
    out = client.completions.create(**args)
    ids, text = out.choices[0].model_extra["token_ids"], out.choices[0].text
    reason = out.choices[0].finish_reason
    assert out.usage.completion_tokens == len(ids)
  want = common.offline(_engine_request(CharTokenizer().encode(
      "hello world"), body))
  assert ids == want
  assert text == CharTokenizer().decode(want)
  assert reason == ("length" if len(want) == 10 else "stop")


def test_stop_string_cuts_the_text(server):
  _, url = server
  body = dict(max_tokens=12, temperature=1.0, seed=3, speculation="chain:3")
  want = CharTokenizer().decode(common.offline(_engine_request(
      CharTokenizer().encode("stop here"), body)))
  if len(want) < 4:
    pytest.skip("the tiny model ended too early for a stop string")
  stop = want[2:4]
  for stream in (False, True):
    r = httpx.post(url + "/v1/completions", timeout=300, json=dict(
        prompt="stop here", stop=[stop], **body, stream=stream))
    if stream:
      chunks = [json.loads(x[6:]) for x in r.text.split("\n\n")
                if x.startswith("data: {")]
      text = "".join(c["choices"][0]["text"] for c in chunks)
      reason = chunks[-1]["choices"][0]["finish_reason"]
    else:
      text, reason = (r.json()["choices"][0]["text"],
                      r.json()["choices"][0]["finish_reason"])
    assert text == want[:want.find(stop)] and reason == "stop", stream


def _raw(url, body, stream=False):
  with httpx.Client(timeout=300) as c:
    if not stream:
      r = c.post(url + "/v1/completions", json=body)
      assert r.status_code == 200, r.text
      return r.json()["choices"][0]["token_ids"]
    ids = []
    with c.stream("POST", url + "/v1/completions",
                  json={**body, "stream": True}) as r:
      for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
          ids += json.loads(line[6:])["choices"][0]["token_ids"]
    return ids


def test_32_concurrent_mixed_clients(server):
  _, url = server
  jobs = []
  for i in range(32):
    extra, temperature, _ = CASES[i % len(CASES)]
    prompt = [2] + [3 + (i * 7 + j) % 60 for j in range(1 + i % 6)]
    jobs.append((dict(prompt=prompt, max_tokens=3 + i % 10,
                      temperature=temperature, seed=i, **extra), i % 2 == 0))
  with concurrent.futures.ThreadPoolExecutor(32) as ex:
    got = list(ex.map(lambda j: _raw(url, *j), jobs))
  want = common.offline([_engine_request(b["prompt"], b) for b, _ in jobs])
  assert got == want


BAD = [
    (b"", "body is empty"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"max_tokens": 3}).encode(), "prompt is required"),
    (json.dumps({"prompt": [3, 999]}).encode(), "outside the vocabulary"),
    (json.dumps({"prompt": "a" * 40}).encode(), "shorten"),
    (json.dumps({"prompt": "ab", "max_tokens": -1}).encode(), "max_tokens"),
    (json.dumps({"prompt": "ab", "method": "nope"}).encode(),
     "unknown method"),
    (json.dumps({"prompt": "ab", "method": "token_v3", "alpha": 7}).encode(),
     "alpha"),
    (json.dumps({"prompt": "ab", "method": "lossy_greedy",
                 "temperature": 1.0}).encode(), "greedy-only"),
    (json.dumps({"prompt": "ab", "speculation": "auto"}).encode(),
     "not available"),
    (json.dumps({"prompt": "ab", "n": 2}).encode(), "n=2"),
    (json.dumps({"prompt": "ab", "tempreature": 1}).encode(),
     "unknown field"),
]


def test_malformed_requests_get_400_and_server_keeps_serving(server):
  _, url = server
  for raw, msg in BAD:
    r = httpx.post(url + "/v1/completions", content=raw,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, (raw, r.text)
    assert msg in r.json()["error"]["message"], (raw, r.text)
  body = dict(prompt=[2, 5, 6], max_tokens=4, temperature=0.0,
              speculation="chain:3")
  assert _raw(url, body) == common.offline(_engine_request([2, 5, 6], body))


def test_disconnect_frees_the_slot(server):
  _, url = server
  body = dict(prompt=[2, 9], max_tokens=12, temperature=1.0,
              speculation="chain:3", stream=True)
  with httpx.Client(timeout=60) as c:
    with c.stream("POST", url + "/v1/completions", json=body) as r:
      next(r.iter_lines())  # the first chunk, then hang up
  deadline = time.time() + 30
  while time.time() < deadline:
    h = httpx.get(url + "/health").json()
    if h["running"] == 0 and h["waiting"] == 0:
      break
    time.sleep(0.2)
  assert h["running"] == 0 and h["waiting"] == 0
  metrics = httpx.get(url + "/metrics").text
  assert 'specdec_requests_total{outcome="ok"}' in metrics


def test_sigterm_exits_cleanly(server):
  proc, url = server
  body = dict(prompt=[2, 9, 4], max_tokens=12, temperature=1.0,
              speculation="chain:3", stream=True)
  with httpx.Client(timeout=60) as c:
    with c.stream("POST", url + "/v1/completions", json=body) as r:
      lines = r.iter_lines()
      next(lines)
      proc.send_signal(signal.SIGTERM)
      rest = list(lines)  # the stream ends (finished or cancelled)
  assert rest is not None
  assert proc.wait(timeout=60) == 0
