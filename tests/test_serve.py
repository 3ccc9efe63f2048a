"""d3d serve: the official openai client against a server on a free loopback port; greedy answers equal
d3d.generate's token for token; malformed requests get a 4xx naming the field; a client that goes away
mid-stream does not stop the others."""

import http.client
import json
import socket
import threading

import pytest

import d3d
from d3d.serve.scheduler import TextStream
from helpers import bundled_server, suite_env

openai = pytest.importorskip("openai", reason="the openai client is in the test extra")


@pytest.fixture(scope="module")
def server():
    srv, target, tok, drafter = bundled_server()
    yield srv, target, tok, drafter
    srv.drain(timeout=60)


def client(srv):
    host, port = srv.server_address[:2]
    return openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="unused", max_retries=0, timeout=120)


def expected(target, tok, drafter, ids, n):
    stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
    out = d3d.generate(target, ids, max_new_tokens=n, spec="sync", drafter=drafter, stop_ids=stops)
    return out.tokens[0]


def wait_for(cond, seconds=30.0):
    import time

    end = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def stream_events(srv, body: dict, path="/v1/completions"):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=120)
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    res = conn.getresponse()
    assert res.status == 200, res.read()
    return [json.loads(line[6:]) for line in res.read().decode().splitlines() if line.startswith("data: {")]


def test_completions_stream_and_not_equal_generate(server):
    srv, target, tok, drafter = server
    c = client(srv)
    ids = tok.encode("def read_config(path):")
    want = tok.decode(expected(target, tok, drafter, ids, 24), skip_special_tokens=True)
    whole = c.completions.create(model="target-16m", prompt="def read_config(path):", max_tokens=24)
    assert whole.choices[0].text == want and whole.usage.prompt_tokens == len(ids)
    assert whole.usage.completion_tokens == 24 and whole.choices[0].finish_reason == "length"
    parts = [e.choices[0].text for e in c.completions.create(model="target-16m", prompt="def read_config(path):",
                                                              max_tokens=24, stream=True) if e.choices]
    assert "".join(parts) == want and len([p for p in parts if p]) > 1  # it arrived in pieces


def test_chat_stream_and_not_equal_generate(server):
    srv, target, tok, drafter = server
    c = client(srv)
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    want = tok.decode(expected(target, tok, drafter, tok.encode_chat(messages), 20), skip_special_tokens=True)
    whole = c.chat.completions.create(model="target-16m", messages=messages, max_tokens=20)
    assert whole.choices[0].message.content == want and whole.choices[0].message.role == "assistant"
    stream = c.chat.completions.create(model="target-16m", messages=messages, max_tokens=20, stream=True)
    assert "".join(e.choices[0].delta.content or "" for e in stream if e.choices) == want
    assert [m.id for m in c.models.list().data] == ["target-16m"]


def test_stop_strings_end_the_answer_before_them(server):
    srv, target, tok, drafter = server
    c = client(srv)
    full = c.completions.create(model="target-16m", prompt="import os\n", max_tokens=40).choices[0].text
    stop = full[10:13]
    assert stop and stop in full
    cut = c.completions.create(model="target-16m", prompt="import os\n", max_tokens=40, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = c.completions.create(model="target-16m", prompt="import os\n", max_tokens=40, stop=stop, stream=True)
    assert "".join(e.choices[0].text for e in streamed if e.choices) == full[:full.index(stop)]


@pytest.mark.parametrize("body, status, field", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": "gpt-9", "prompt": "x"}).encode(), 404, "model"),
    (json.dumps({"max_tokens": 4}).encode(), 400, "prompt"),
    (json.dumps({"prompt": 3}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": "many"}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x", "max_tokens": 10 ** 9}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "x " * 5000}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "x", "stop": [1]}).encode(), 400, "stop"),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400, "stream"),
])
def test_malformed_requests_get_a_4xx_naming_the_field(server, body, status, field):
    srv = server[0]
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    res = conn.getresponse()
    err = json.loads(res.read())["error"]
    assert res.status == status and err["param"] == field and err["message"]


def test_chat_messages_are_checked(server):
    srv = server[0]
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    for messages, param in (([], "messages"), ([{"role": "robot", "content": "x"}], "messages[0].role"),
                            ([{"role": "user", "content": 5}], "messages[0].content")):
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": messages}).encode())
        res = conn.getresponse()
        assert res.status == 400 and json.loads(res.read())["error"]["param"] == param
    conn.request("GET", "/nowhere")
    res = conn.getresponse()
    assert res.status == 404 and json.loads(res.read())["error"]["message"]


def test_a_client_gone_mid_stream_does_not_stop_the_others(server):
    srv, target, tok, drafter = server
    host, port, gone = *srv.server_address[:2], srv.scheduler.abandoned
    body = json.dumps({"prompt": "import os\n", "max_tokens": 1500, "stream": True}).encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:  # the stream began; hang up
            got += sock.recv(4096)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(client(srv).completions.create(
        model="target-16m", prompt="def add(a, b):", max_tokens=12).choices[0].text)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    want = tok.decode(expected(target, tok, drafter, tok.encode("def add(a, b):"), 12), skip_special_tokens=True)
    assert answers == [want] * 3
    wait_for(lambda: srv.scheduler.abandoned == gone + 1)  # the 1500-token generation ended when its client went away


def test_the_d3d_extension_reports_rounds(server):
    srv = server[0]
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\n", "max_tokens": 24, "stream": True,
                                                        "d3d": True}).encode())
    events = [json.loads(line[6:]) for line in conn.getresponse().read().decode().splitlines()
              if line.startswith("data: {")]
    rounds = [e["d3d"] for e in events if e.get("d3d")]
    assert rounds and all({"draft", "accepted", "bonus", "source"} <= set(r) for r in rounds)
    assert events[-1]["usage"]["completion_tokens"] == 24


def test_text_stream_holds_back_what_may_start_a_stop_string():
    class Tok:  # one character per id
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    s = TextStream(Tok(), ["END"])
    assert s.add([ord("a"), ord("b"), ord("E")]) == "ab"  # "E" may begin "END"
    assert s.add([ord("x")]) == "Ex"
    assert s.add([ord("E"), ord("N")]) == "" and not s.stopped
    assert s.add([ord("D"), ord("z")]) == "" and s.stopped and s.flush() == ""


def test_sigterm_finishes_the_request_in_flight_then_exits(tmp_path):
    """The CLI: python -m d3d serve --port 0 says where it listens; SIGTERM during a streamed answer lets
    that answer finish ([DONE]) and the process exit 0."""
    import re
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "d3d", "serve", "--port", "0", "--quiet"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "http://" not in line:
            line = proc.stderr.readline()
            assert line, "the server ended before listening"
        host, port = re.search(r"http://([\d.]+):(\d+)/v1", line).groups()
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "import os\n", "max_tokens": 400,
                                                            "stream": True}).encode())
        res = conn.getresponse()
        assert res.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGTERM)
        rest = res.read().decode()
        assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in rest
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


PROMPTS = ["def add(a, b):", "import os\n", "class Stack:\n", "for i in range(", "# read a file\n", "x = [", "def main():\n",
           "while True:\n"]


def test_concurrent_requests_decode_together_each_equal_to_generate_alone(server):
    """16 clients at once, mixed prompts, lengths, streaming or not, sync, async or ar (``d3d_mode``): every
    answer equals d3d.generate on its prompt alone (fp32), and rounds did decode several together."""
    srv, target, tok, drafter = server
    srv.scheduler.peak = 0  # measured within this test: earlier tests' requests are all answered
    modes = {0: "ar", 1: "async"}
    jobs = [(PROMPTS[i % len(PROMPTS)], 6 + 5 * i, i % 2 == 0, modes.get(i % 5)) for i in range(16)]
    got = [None] * len(jobs)

    def ask(k):
        prompt, n, stream, mode = jobs[k]
        extra = {"d3d_mode": mode} if mode else {}
        if stream:
            got[k] = "".join(e.choices[0].text for e in client(srv).completions.create(
                model="target-16m", prompt=prompt, max_tokens=n, stream=True, extra_body=extra) if e.choices)
        else:
            got[k] = client(srv).completions.create(model="target-16m", prompt=prompt, max_tokens=n,
                                                    extra_body=extra).choices[0].text

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
    for (prompt, n, _, mode), answer in zip(jobs, got):
        want = d3d.generate(target, tok.encode(prompt), max_new_tokens=n, spec=mode or "sync", drafter=drafter,
                            stop_ids=stops).tokens[0]
        assert answer == tok.decode(want, skip_special_tokens=True), (prompt, n, mode)
    assert srv.scheduler.peak > 1


def test_32_streaming_clients_some_hanging_up_all_others_complete(server):
    """32 streaming clients of mixed lengths; 6 hang up after their first event: their rows are freed,
    the 26 others get whole answers equal to generate's, and no error."""
    srv, target, tok, drafter = server
    host, port = srv.server_address[:2]
    gone, results, errors = srv.scheduler.abandoned, {}, []

    def hang_up(k):
        body = json.dumps({"prompt": PROMPTS[k % 8], "max_tokens": 1000, "stream": True}).encode()
        with socket.create_connection((host, port), timeout=60) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
            got = b""
            while b"data: " not in got:
                got += sock.recv(4096)

    def complete(k):
        try:
            events = stream_events(srv, {"prompt": PROMPTS[k % 8], "max_tokens": 8 + k % 24, "stream": True})
            results[k] = ("".join(e["choices"][0]["text"] for e in events), events[-1]["usage"]["completion_tokens"])
        except Exception as e:  # noqa: BLE001 - any failure is the test's finding
            errors.append(repr(e))

    threads = [threading.Thread(target=hang_up if k % 5 == 4 and k < 30 else complete, args=(k,)) for k in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(results) == 26
    stops = sorted(set(tok.stop_token_ids()) | set(target.cfg.eos_token_ids))
    for k, (text, n) in results.items():
        want = d3d.generate(target, tok.encode(PROMPTS[k % 8]), max_new_tokens=8 + k % 24, spec="sync",
                            drafter=drafter, stop_ids=stops).tokens[0]
        assert text == tok.decode(want, skip_special_tokens=True) and n == len(want)
    wait_for(lambda: srv.scheduler.abandoned == gone + 6)
    wait_for(srv.scheduler.idle)  # every row freed


def test_round_information_colours_every_token(server):
    """``"d3d": true``: each event's tokens, in order, spell the answer; each has an origin; the drafter's
    accepted tokens and the target's bonuses both occur; tau is the tokens per round."""
    srv = server[0]
    events = stream_events(srv, {"prompt": "import os\n", "max_tokens": 40, "stream": True, "d3d": True})
    infos = [e["d3d"] for e in events if e.get("d3d")]
    text = "".join(e["choices"][0]["text"] for e in events)
    assert "".join(t["text"] for i in infos for t in i["tokens"]) == text
    origins = {t["origin"] for i in infos for t in i["tokens"]}
    assert origins <= {"drafter", "hypothesis", "copy", "datastore", "leaf", "bonus", "step"}
    assert {"bonus", "step"} <= origins and origins & {"drafter", "copy"}
    rounds = [i for i in infos if "round" in i]
    # a round ends with its bonus, or is a plain step (the row price's choice); the last may be cut at max_tokens
    assert all(i["tokens"][-1]["origin"] in ("bonus", "step") for i in rounds[:-1])
    assert all({"draft", "accepted", "rejected", "tau", "source"} <= set(i) for i in rounds)
    assert rounds[-1]["tau"] == pytest.approx(sum(i["accepted"] + 1 for i in rounds) / len(rounds))
    ar = [e["d3d"] for e in stream_events(srv, {"prompt": "import os\n", "max_tokens": 5, "stream": True, "d3d": True,
                                                 "d3d_mode": "ar"}) if e.get("d3d")]
    assert [t["origin"] for i in ar for t in i["tokens"]] == ["step"] * 5


def test_a_draft_models_chains_serve_sync_requests(monkeypatch):
    """A server with a draft model (here the target itself, its chains from the first round): a sync request's
    rounds draft with it ("model" tokens) and answer as generate does; async requests decode without it."""
    from d3d.decode import draft_model

    monkeypatch.setattr(draft_model, "START_ROUNDS", 0)
    srv, target, tok, drafter = bundled_server(draft_model="target")
    try:
        events = stream_events(srv, {"prompt": "import os\n", "max_tokens": 24, "stream": True, "d3d": True})
        origins = [t["origin"] for e in events if e.get("d3d") for t in e["d3d"]["tokens"]]
        assert "model" in origins and "drafter" not in origins  # chains where no copy applies
        text = "".join(e["choices"][0]["text"] for e in events)
        want = expected(target, tok, drafter, tok.encode("import os\n"), 24)
        assert text == tok.decode(want, skip_special_tokens=True)
        events = stream_events(srv, {"prompt": "import os\n", "max_tokens": 24, "stream": True, "d3d": True,
                                     "d3d_mode": "async"})
        assert "model" not in {t["origin"] for e in events if e.get("d3d") for t in e["d3d"]["tokens"]}
    finally:
        srv.drain(timeout=60)


def test_d3d_mode_is_checked(server):
    srv = server[0]
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "d3d_mode": "dflash"}).encode())
    res = conn.getresponse()
    assert res.status == 400 and json.loads(res.read())["error"]["param"] == "d3d_mode"


def test_the_page_is_served(server):
    srv = server[0]
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    conn.request("GET", "/")
    res = conn.getresponse()
    page = res.read().decode()
    assert res.status == 200 and res.headers["Content-Type"].startswith("text/html")
    assert "/v1/completions" in page and "d3d_mode" in page and "<script" in page and "http" not in page.split(
        "<script")[0].lower().replace("http-equiv", "")  # nothing fetched from elsewhere: no CDN


def browser():
    """Headless Chromium under Selenium, or a skip that says what is missing."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("no headless browser here: install Debian's chromium and chromium-driver (.ci/run does, as root)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,1400"):
        opts.add_argument(arg)
    from selenium.webdriver.chrome.service import Service

    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def test_the_page_in_a_real_browser(server):
    """The page in headless Chromium: type a prompt, press Generate, find tokens coloured by origin and a
    tau; press "Same prompt with ar" and find the outputs identical. D3D_PAGE_SCREENSHOT=FILE saves a
    screenshot (docs/results/serve/page.png was made so)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    srv = server[0]
    b = browser()
    try:
        b.get("http://%s:%d/" % srv.server_address[:2])
        box = b.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys("def fibonacci(n):")
        b.find_element(By.ID, "go").click()
        WebDriverWait(b, 120).until(lambda d: d.find_element(By.ID, "stats").get_attribute("data-done") == "1")
        stats = b.find_element(By.ID, "stats").text
        assert "τ" in stats and "tok/s" in stats, stats
        classes = {e.get_attribute("class") for e in b.find_elements(By.CSS_SELECTOR, "#out span.tok")}
        assert "tok bonus" in classes and classes & {"tok drafter", "tok copy"}, classes
        b.find_element(By.ID, "ar").click()
        WebDriverWait(b, 120).until(lambda d: "identical" in d.find_element(By.ID, "compare").text
                                    or "differ" in d.find_element(By.ID, "compare").text)
        assert "identical output" in b.find_element(By.ID, "compare").text
        if suite_env("D3D_PAGE_SCREENSHOT"):
            b.save_screenshot(suite_env("D3D_PAGE_SCREENSHOT"))
    finally:
        b.quit()


def test_a_decoding_error_is_a_500_naming_it_and_the_server_goes_on(server, monkeypatch):
    from d3d.decode.speculative import SpeculativeDecoder

    srv = server[0]
    admit = SpeculativeDecoder.admit

    def failing(self, seqs):
        if any(s.max_new == 77 for s in seqs):
            raise RuntimeError("boom")
        return admit(self, seqs)

    monkeypatch.setattr(SpeculativeDecoder, "admit", failing)
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "x = 1", "max_tokens": 77}).encode())
    res = conn.getresponse()
    err = json.loads(res.read())["error"]
    assert res.status == 500 and "RuntimeError: boom" in err["message"] and err["type"] == "server_error"
    answer = client(srv).completions.create(model="target-16m", prompt="x = 1", max_tokens=5)
    assert answer.choices[0].finish_reason in ("length", "stop") and answer.usage.completion_tokens >= 1


def test_requests_of_many_temperatures_decode_in_one_group(server):
    """Seven temperatures at once (and a greedy request): one decoder holds them all (per-row sampling),
    every request completes."""
    srv = server[0]
    answers, errors = [], []
    srv.scheduler.peak = 0

    def ask(t):
        try:
            answers.append(client(srv).completions.create(model="target-16m", prompt="import os\n", max_tokens=30,
                                                          temperature=t, seed=1).usage.completion_tokens)
        except Exception as e:  # noqa: BLE001 - any failure is the test's finding
            errors.append(repr(e))

    threads = [threading.Thread(target=ask, args=(0.3 + 0.1 * k if k < 7 else 0.0,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and len(answers) == 8 and all(n >= 1 for n in answers)
    assert srv.scheduler.peak > 1  # rows of different temperatures decoded in one round
