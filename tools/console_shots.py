"""``make console-shots``: screenshots of every page of the web console, written to
docs/console/ (the README links them).

It runs ``replog cluster up --groups 2 --slaves 1`` (two groups in controller mode on a local
ZooKeeper, and their console), puts some traffic on it (topics, messages, a consumer group
behind by a few messages, a dead letter), logs in to the console in headless Chromium
(Debian's, through Selenium) and saves each page. Everything it started is stopped by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.cli.cluster import broker_env
from common.client import Admin, Consumer, Producer
from common.core import ports

OUT = REPO / "docs" / "console"
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PAGES = ("cluster", "topics", "groups", "messages", "security")


def free_base() -> int:
    for _ in range(100):
        base = ports.free_port(3)
        if base + 200 < ports.unassigned_range()[1] and all(ports.is_free(base + off) for off in (
                10, 11, 12, 88, 90, 100, 101, 102, 110, 111, 112)):
            return base
    raise RuntimeError("no free port range")


def traffic(servers: list[str]) -> str:
    """Topics, messages, a lagging group and a dead letter; returns a message id to find."""
    with Admin(servers, timeout_ms=10_000) as admin:
        for topic in ("orders", "payments", "audit"):
            admin.create_topic(topic, 4)
    with Producer(servers) as p:
        first = p.send("orders", json.dumps({"order": 1, "amount": 42.5}).encode(),
                       keys="order-1", tags="created")
        for i in range(2, 200):
            p.send("orders", json.dumps({"order": i}).encode(), keys=f"order-{i}")
        for i in range(50):
            p.send("payments", b"payment %d" % i)
    with Consumer(servers, group="billing") as c:
        for q in c.queues("orders"):
            got = c.pull("orders", q.queue_id, 0, 32, broker_name=q.broker_name).messages
            if got:
                c.commit_offset("orders", q.queue_id, got[-1].queue_offset,
                                broker_name=q.broker_name)
        q = c.queues("orders")[0]
        msg = c.pull("orders", q.queue_id, 0, 1, broker_name=q.broker_name).messages
        if msg:
            c.send_back(msg[0], delay_level=-1)
    return first.msg_id


def main() -> int:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        print("console-shots needs chromium and chromium-driver (apt-get install -y chromium "
              "chromium-driver)", file=sys.stderr)
        return 1
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    base = free_base()
    home = Path(tempfile.mkdtemp(prefix="replog-console-shots-"))
    up = subprocess.Popen(
        [sys.executable, "-m", "common.cli", "cluster", "up", "--dir", str(home / "cluster"),
         "--groups", "2", "--slaves", "1", "--base-port", str(base), "--json"],
        cwd=REPO, stdout=subprocess.PIPE, env=broker_env(), start_new_session=True)
    pids: list[int] = []
    driver = None
    try:
        assert up.stdout is not None
        doc = json.loads(up.stdout.readline())
        pids = [b["pid"] for b in doc["brokers"]] + [z["pid"] for z in doc["zookeeper"]] + \
            [doc["console"]["pid"]]
        servers = [b["address"] for b in doc["brokers"]]
        msg_id = traffic(servers)
        password = Path(doc["console"]["passwordFile"]).read_text().strip()
        url = doc["console"]["url"]
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1400,1000"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
        driver.get(url)
        driver.find_element("id", "password").send_keys(password)
        driver.find_element("css selector", "#login-form button").click()
        time.sleep(6)  # a few rounds: the charts have points
        OUT.mkdir(parents=True, exist_ok=True)
        for page in PAGES:
            driver.get(f"{url}#{page}")
            if page == "messages":
                driver.find_element("id", "find-msgid").send_keys(msg_id)
                driver.find_element("css selector", "#find-form button").click()
            if page == "groups":
                driver.find_element("id", "dlq-group").send_keys("billing")
                driver.find_element("css selector", "#dlq-form button[type=submit]").click()
            time.sleep(2.5)
            path = OUT / f"{page}.png"
            driver.save_screenshot(str(path))
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    finally:
        if driver is not None:
            driver.quit()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait(10)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    sys.exit(main())
