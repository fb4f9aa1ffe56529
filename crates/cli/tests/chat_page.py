"""Drives the chat page of a running `vkdecode serve` in headless Chromium with selenium
(run by crates/cli/tests/chat_page.rs with the test venv's python). The environment
gives PAGE_URL, CHROMIUM and CHROMEDRIVER (paths), and API_KEY when the server has one.
Prints a JSON object of what the page showed; exits non-zero on any failure."""
import json
import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

URL = os.environ["PAGE_URL"]
KEY = os.environ.get("API_KEY")
TIMEOUT = 300


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ["CHROMIUM"]
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--window-size=1200,900"]:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(os.environ["CHROMEDRIVER"]))


def wait(what, cond, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def text_of(el):
    return el.get_property("textContent")


def replies(d, state=None):
    sel = ".message.assistant" + (f'[data-state="{state}"]' if state else "")
    return d.find_elements(By.CSS_SELECTOR, sel)


def wait_replies(d, n):
    """Waits for `n` finished replies with text; returns their bodies and stats lines."""
    done = wait(f"{n} finished replies", lambda: len(replies(d, "done")) >= n and replies(d, "done"))
    assert len(replies(d)) == n, [r.get_attribute("data-state") for r in replies(d)]
    out = []
    for r in done:
        body = text_of(r.find_element(By.CSS_SELECTOR, ".body"))
        meta = text_of(r.find_element(By.CSS_SELECTOR, ".meta"))
        assert body.strip(), "an empty reply"
        assert "tok/s" in meta and "token" in meta, meta
        out.append({"text": body, "meta": meta})
    assert not d.find_element(By.ID, "send").get_property("disabled")
    assert d.find_element(By.ID, "stop").get_property("disabled")
    return out


def console_errors(d, allowed=()):
    """The SEVERE entries of the browser's console since the last call, less those that
    contain one of `allowed`."""
    return [e for e in d.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def chat_requests(d):
    """The bodies and Authorization headers the page POSTed to /v1/chat/completions
    (from the performance log, drained)."""
    out = []
    for entry in d.get_log("performance"):
        m = json.loads(entry["message"])["message"]
        if m["method"] != "Network.requestWillBeSent":
            continue
        req = m["params"]["request"]
        if req["url"].endswith("/v1/chat/completions") and req["method"] == "POST":
            headers = {k.lower(): v for k, v in req["headers"].items()}
            out.append({"body": json.loads(req.get("postData", "null")),
                        "authorization": headers.get("authorization")})
    return out


def set_field(d, id, value):
    el = d.find_element(By.ID, id)
    el.clear()
    el.send_keys(value)


def greedy(d, max_tokens):
    set_field(d, "temperature", "0")
    set_field(d, "max-tokens", str(max_tokens))


def two_turns(d, results):
    """One message sent with Enter, one (of two lines, Shift+Enter) with the button."""
    prompt = d.find_element(By.ID, "prompt")
    prompt.send_keys("What is the capital of France?" + Keys.ENTER)
    first = wait_replies(d, 1)
    assert prompt.get_property("value") == "", "Enter did not empty the box"
    prompt.send_keys("And of Italy?")
    ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    prompt.send_keys("Answer in one word.")
    assert prompt.get_property("value") == "And of Italy?\nAnswer in one word.", \
        repr(prompt.get_property("value"))
    assert len(replies(d)) == 1, "Shift+Enter sent the message"
    d.find_element(By.ID, "send").click()
    both = wait_replies(d, 2)
    users = [text_of(u.find_element(By.CSS_SELECTOR, ".body"))
             for u in d.find_elements(By.CSS_SELECTOR, ".message.user")]
    assert users == ["What is the capital of France?", "And of Italy?\nAnswer in one word."], users
    assert both[0] == first[0]
    results["replies"] = both

    # the whole conversation went with the second request
    sent = chat_requests(d)
    assert len(sent) >= 2, sent
    a, b = sent[-2]["body"], sent[-1]["body"]
    assert a["stream"] is True and a["stream_options"] == {"include_usage": True}, a
    assert a["temperature"] == 0, a
    assert [m["role"] for m in a["messages"]] == ["user"], a
    assert [m["role"] for m in b["messages"]] == ["user", "assistant", "user"], b
    assert b["messages"][1]["content"] == both[0]["text"], b
    return sent


def code_blocks_are_text(d):
    """Model text with HTML and ``` fences: the fences become <pre><code>, the HTML stays
    text (renderText is the page's own function)."""
    got = d.execute_script("""
        const el = document.createElement("div");
        renderText(el, "Run <img src=x onerror=window.pwned=1>:\\n```html\\n<b>bold</b> & <script>x</script>\\n```\\nthen `done`.");
        return {
          html: el.innerHTML,
          code: [...el.querySelectorAll("pre > code")].map((c) => [c.className, c.textContent]),
          tags: [...el.querySelectorAll("*")].map((e) => e.tagName),
        };
    """)
    assert got["tags"] == ["PRE", "CODE"], got
    assert got["code"] == [["language-html", "<b>bold</b> & <script>x</script>"]], got
    assert "<img" not in got["html"] and "&lt;img" in got["html"], got
    assert d.execute_script("return window.pwned === undefined")


def stop_a_long_reply(d):
    greedy(d, 400)
    d.find_element(By.ID, "prompt").send_keys("Write a long story about a dragon." + Keys.ENTER)
    wait("the third reply's first text",
         lambda: len(replies(d)) == 3
         and text_of(replies(d)[2].find_element(By.CSS_SELECTOR, ".body")).strip())
    d.find_element(By.ID, "stop").click()
    r = wait("the stopped reply", lambda: replies(d, "stopped"), timeout=30)[0]
    meta = text_of(r.find_element(By.CSS_SELECTOR, ".meta"))
    assert meta.startswith("stopped") and "tok/s" in meta, meta
    assert not d.find_element(By.ID, "send").get_property("disabled")
    return meta


def without_key(d, results):
    d.get(URL)
    assert "vkdecode" in d.title, d.title
    greedy(d, 24)
    two_turns(d, results)
    code_blocks_are_text(d)
    results["stopped"] = stop_a_long_reply(d)
    errors = console_errors(d)
    assert not errors, errors


def with_key(d, results):
    d.get(URL)
    greedy(d, 24)
    # without the key: the server's 401 shows in the page, the question returns to the box
    prompt = d.find_element(By.ID, "prompt")
    prompt.send_keys("What is the capital of France?" + Keys.ENTER)
    err = wait("the error message", lambda: d.find_elements(By.CSS_SELECTOR, ".message.error"))
    results["error"] = text_of(err[0])
    assert results["error"].startswith("401") and "key" in results["error"].lower(), results["error"]
    assert not replies(d)
    assert d.find_elements(By.CSS_SELECTOR, ".message.user.failed")
    assert prompt.get_property("value") == "What is the capital of France?"
    # the failed request's own console line is the only error
    errors = console_errors(d, allowed=["401"])
    assert not errors, errors
    assert chat_requests(d)[-1]["authorization"] is None

    set_field(d, "api-key", KEY)
    d.find_element(By.ID, "clear").click()
    prompt.clear()
    sent = two_turns(d, results)
    assert all(r["authorization"] == f"Bearer {KEY}" for r in sent), sent
    errors = console_errors(d)
    assert not errors, errors
    # the key is remembered
    d.refresh()
    assert d.find_element(By.ID, "api-key").get_property("value") == KEY


def main():
    d = browser()
    results = {}
    try:
        (with_key if KEY else without_key)(d, results)
    except Exception:
        shot = os.environ.get("SCREENSHOT")
        if shot:
            d.save_screenshot(shot)
        print(d.find_element(By.TAG_NAME, "body").get_property("innerText"), file=sys.stderr)
        raise
    finally:
        d.quit()
    print(json.dumps(results))


main()
