"""The chat page in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`) loads the
page of a running `titan serve`, sends a message, and waits for the streamed answer to appear in the page.

Usage: test_chat_page.py URL MESSAGE [SCREENSHOT.png]
Exits non-zero (with the page's text) if no answer appears within 120 s.
"""

import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

url, message = sys.argv[1], sys.argv[2].replace("\\n", "\n")
shot = sys.argv[3] if len(sys.argv) > 3 else None

opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,760"]:
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
try:
    driver.get(url)
    # Settings as a user enters them: greedy, and an answer short enough to see whole.
    for field, value in [("temperature", "0"), ("max_tokens", "60")]:
        driver.find_element(By.ID, field).send_keys(value)
    prompt = driver.find_element(By.ID, "prompt")
    # Enter sends; a line break inside the message is Shift+Enter, as a user types it.
    for i, line in enumerate(message.split("\n")):
        if i:
            prompt.send_keys(Keys.SHIFT, Keys.ENTER)
        prompt.send_keys(line)
    driver.find_element(By.ID, "send").click()
    answers = lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "#messages .assistant") if e.text.strip()]
    # The answer streams in: first some text, then more of it, then the speed line once it has finished.
    WebDriverWait(driver, 120).until(lambda d: answers(d))
    first = answers(driver)[-1]
    WebDriverWait(driver, 120).until(lambda d: "tokens/s" in d.find_element(By.ID, "speed").text and d.find_element(By.ID, "stop").get_attribute("disabled"))
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
except Exception:
    print(driver.find_element(By.TAG_NAME, "body").text)
    raise
finally:
    driver.quit()
