"""The chat page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`) loads the
page of a running `titan serve`, sends a message, and waits for the streamed answer to appear in the page.
Then: the Markdown renderer on fixed text (the demo model writes verse, not Markdown), the Copy buttons
(pasted back into the text box), Regenerate (the answer is replaced by the server's answer to the conversation
without it) and Stop (the stream ends early, and the server stops generating).

Usage: test_chat_page.py URL MESSAGE [SCREENSHOT.png]
Exits non-zero (with the page's text) if a check fails or no answer appears within 120 s.
"""

import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

url, message = sys.argv[1], sys.argv[2].replace("\\n", "\n")
shot = sys.argv[3] if len(sys.argv) > 3 else None

MARKDOWN = """# Plan

Some **bold**, *italic* and `<code>` text.

```python
print("<b>not bold</b>")
```

- one
- two

| a | b |
|---|--:|
| 1 | 2 |

<script>window.injected = true</script><img src=x onerror="window.injected = true">
[safe](https://example.com/x_y) and [unsafe](javascript:alert(1))"""


def server(path, body=None):
    """A request to the server itself, outside the browser: the reference for what the page shows."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as res:
        return res.read().decode()


def metric(name):
    for line in server("/metrics").splitlines():
        if line.startswith(f"titan_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no titan_{name} in /metrics")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"ok: {what}")


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,760"]:
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
wait = WebDriverWait(driver, 120, poll_frequency=0.02)


def field(id, value):
    el = driver.find_element(By.ID, id)
    el.clear()
    el.send_keys(value)


def type_message(text):
    prompt = driver.find_element(By.ID, "prompt")
    # Enter sends; a line break inside the message is Shift+Enter, as a user types it.
    for i, line in enumerate(text.split("\n")):
        if i:
            prompt.send_keys(Keys.SHIFT, Keys.ENTER)
        prompt.send_keys(line)


def finished(d):
    return d.find_element(By.ID, "stop").get_attribute("disabled") and "tokens/s" in d.find_element(By.ID, "speed").text


def pasted_after(click):
    """What the clipboard holds after clicking `click`, read back as a user would: pasted into the text box."""
    click.click()
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(Keys.CONTROL, "v")
    text = prompt.get_attribute("value")
    prompt.clear()
    return text


def assistant_turns():
    return driver.find_elements(By.CSS_SELECTOR, "#messages .turn.assistant")


def last_answer():
    return driver.execute_script("return conversation[conversation.length - 1].content")


try:
    driver.get(url)
    # Settings as a user enters them: greedy, and an answer short enough to see whole.
    for id, value in [("temperature", "0"), ("max_tokens", "60")]:
        field(id, value)
    type_message(message)
    driver.find_element(By.ID, "send").click()
    answers = lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#messages .assistant .bubble") if e.text.strip()]
    # The answer streams in: first some text, then more of it, then the speed line once it has finished.
    wait.until(lambda d: answers(d))
    first = answers(driver)[-1]
    wait.until(finished)
    final = answers(driver)[-1]
    speed = driver.find_element(By.ID, "speed").text
    print(f"first text seen: {first[:60]!r}")
    print(f"answer: {final!r}")
    print(f"speed: {speed!r}")
    if len(final) <= len(first) and final == first:
        print("note: the whole answer arrived before the first look (a fast model); it is in the page")
    if shot:
        time.sleep(0.3)
        driver.save_screenshot(shot)
        print(f"screenshot: {shot}")

    # Copy gives the answer's raw text: the server's own answer to the same request, asked outside the page.
    ask = {"messages": [{"role": "user", "content": message}], "temperature": 0, "max_tokens": 60}
    expected = json.loads(server("/v1/chat/completions", ask))["choices"][0]["message"]["content"]
    copy = assistant_turns()[-1].find_element(By.CSS_SELECTOR, ".actions .copy")
    check(pasted_after(copy) == expected, "Copy puts the answer's raw text on the clipboard")

    # The Markdown renderer, in a bubble of the page, on fixed text.
    driver.execute_script(
        "const turn = addTurn('assistant', ''); turn.id = 'markdown'; setAnswer(turn.querySelector('.bubble'), arguments[0]);",
        MARKDOWN,
    )
    md = driver.find_element(By.CSS_SELECTOR, "#markdown .bubble")
    check(md.find_element(By.TAG_NAME, "h1").text == "Plan", "a heading")
    check(md.find_element(By.TAG_NAME, "strong").text == "bold" and md.find_element(By.TAG_NAME, "em").text == "italic", "bold and italic")
    check(md.find_element(By.CSS_SELECTOR, "p > code").text == "<code>", "inline code, its HTML shown as text")
    block = md.find_element(By.CSS_SELECTOR, ".code pre > code")
    check(block.text == 'print("<b>not bold</b>")' and not block.find_elements(By.TAG_NAME, "b"), "a fenced block as <pre><code>, its HTML as text")
    check(md.find_element(By.CSS_SELECTOR, ".code-head").text.startswith("python"), "the block's language label")
    check([li.text for li in md.find_elements(By.CSS_SELECTOR, "ul > li")] == ["one", "two"], "a list")
    check([td.text for td in md.find_elements(By.CSS_SELECTOR, "table td")] == ["1", "2"], "a table")
    check(
        not md.find_elements(By.CSS_SELECTOR, "script, img") and not driver.execute_script("return window.injected === true")
        and "<script>window.injected = true</script>" in md.text,
        "HTML in the model's text is shown as text, not markup",
    )
    links = md.find_elements(By.TAG_NAME, "a")
    check(
        [(a.get_attribute("href"), a.get_attribute("rel")) for a in links] == [("https://example.com/x_y", "noopener noreferrer")]
        and "[unsafe](javascript:alert(1))" in md.text,
        "an https link with rel=noopener; a javascript: link stays text",
    )
    check(pasted_after(md.find_element(By.CSS_SELECTOR, ".copy-code")) == 'print("<b>not bold</b>")', "a code block's Copy button")
    # Mid-stream, a fence not closed yet is already a code block, its text escaped.
    check(
        driver.execute_script("return renderMarkdown(arguments[0])", "Here:\n```js\nlet a = '<i>';\n[x](http")
        == '<p>Here:</p>\n<div class="code"><div class="code-head"><span>js</span><button type="button" class="copy-code">Copy</button></div>'
        '<pre><code class="language-js">let a = &#39;&lt;i&gt;&#39;;\n[x](http</code></pre></div>',
        "an unfinished answer: an open fence is a code block already",
    )
    driver.execute_script("document.getElementById('markdown').remove()")

    # Regenerate: sampled with a seed this time. The answer that replaces the last one is the server's answer to
    # the conversation without it (the same request asked outside the page), and it is the only answer shown.
    field("temperature", "1")
    field("seed", "7")
    regenerate = [b for b in driver.find_elements(By.CSS_SELECTOR, ".regenerate") if b.is_displayed()]
    check(len(regenerate) == 1, "one Regenerate button, on the last answer")
    old = assistant_turns()[-1]
    regenerate[0].click()
    wait.until(lambda d: finished(d) and assistant_turns()[-1] != old)
    expected = json.loads(server("/v1/chat/completions", {**ask, "temperature": 1, "seed": 7}))["choices"][0]["message"]["content"]
    check(len(assistant_turns()) == 1 and assistant_turns()[0] != old, "Regenerate replaces the answer in the page")
    check(
        last_answer() == expected and driver.execute_script("return conversation.length") == 2,
        f"the new answer is the server's to the conversation without the old one ({expected[:40]!r}…)",
    )

    # Stop: in a new chat, an answer that left alone runs to max_tokens (a seed found by asking the server
    # outside the page), stopped as soon as its text starts to come. The stream ends, the answer so far stays,
    # and the server stops generating: the request does not complete, the tokens stop short of max_tokens.
    driver.find_element(By.ID, "new-chat").click()
    long = {"messages": [{"role": "user", "content": "Stop me."}], "temperature": 1, "max_tokens": 480}
    seed = next(s for s in range(1, 50) if json.loads(server("/v1/chat/completions", {**long, "seed": s}))["choices"][0]["finish_reason"] == "length")
    field("max_tokens", "480")
    field("seed", str(seed))
    stop = driver.find_element(By.ID, "stop")
    type_message("Stop me.")
    for attempt in range(5):
        completed, generated = metric("requests_completed_total"), metric("generated_tokens_total")
        if attempt == 0:
            driver.find_element(By.ID, "send").click()
        else:
            print("note: the whole answer came before Stop did (a fast machine); asking again")
            next(b for b in driver.find_elements(By.CSS_SELECTOR, ".regenerate") if b.is_displayed()).click()
        # One script call per look: the demo model is fast, and the click has to land while it streams.
        WebDriverWait(driver, 120, poll_frequency=0.005).until(
            lambda d: d.execute_script("const b = document.querySelector('.assistant.streaming .bubble'); return !b || b.textContent !== ''"))
        stop.click()
        wait.until(finished)
        if "stopped" in assistant_turns()[-1].find_element(By.CSS_SELECTOR, ".stats").text:
            break
    stats = assistant_turns()[-1].find_element(By.CSS_SELECTOR, ".stats").text
    check("stopped" in stats and not driver.find_element(By.ID, "send").get_attribute("disabled"), f"Stop ends the stream ({stats!r})")
    check(driver.execute_script("return conversation.length") == 2 and last_answer(), "the stopped answer stays in the conversation")
    # Left alone, the 480 tokens take well under a second at the demo model's speed.
    time.sleep(1)
    made = metric("generated_tokens_total") - generated
    check(metric("requests_completed_total") == completed and made < 480, f"the server stopped after {made:.0f} of 480 tokens (seed {seed})")
except Exception:
    print(driver.find_element(By.TAG_NAME, "body").text)
    raise
finally:
    driver.quit()
