"""The web console's costs (issue 42): how long its pages take to render for a cluster of 3
broker groups with 64 topics, in headless Chromium, and what its polling costs each broker.

* **render**: ``replog console`` (refresh 2 s) over 3 groups in controller mode (one
  ZooKeeper node, one ASYNC_MASTER per group) holding 64 topics of 4 queues each; Chromium
  (Debian's, through Selenium) loads the cluster page until all 3 groups' rows are drawn,
  and the topics page until all 64 topics are; each ``ROUNDS`` times, the median and the
  worst reported (target: under 1 s).
* **polling cost**: each broker's CPU (utime + stime from /proc) over ``WINDOW_S`` without
  a console, then with the console and one open cluster page polling it; the difference per
  broker, as a share of one core (target: under 1%).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
import _support
from cluster import BrokerGroup, cpu_seconds

from common.cli.zookeeper import Ensemble, missing
from common.client import Admin

GROUPS = 3
TOPICS = 64
ROUNDS = 5
WINDOW_S = float(os.environ.get("REPLOG_BENCH_CONSOLE_WINDOW_S", "30"))
REFRESH_MS = 2000
TARGET_RENDER_S = 1.0
TARGET_CPU = 0.01
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def browser() -> object:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)


def load(driver: object, url: str, selector: str, count: int) -> float:
    """Seconds from asking for ``url`` to ``count`` elements of ``selector`` drawn."""
    started = time.perf_counter()
    driver.get(url)  # type: ignore[attr-defined]
    deadline = started + 30
    while time.perf_counter() < deadline:
        n = driver.execute_script(  # type: ignore[attr-defined]
            "return document.querySelectorAll(arguments[0]).length", selector)
        if n >= count:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise RuntimeError(f"{url}: {selector} never reached {count}")


def main() -> int:
    problem = missing()
    if problem or not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        print(f"console benchmark skipped: {problem or 'no chromium / chromedriver'}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="replog-bench-console-"))
    zk = Ensemble(root / "zk", 1, 500)
    groups: list[BrokerGroup] = []
    console: subprocess.Popen[bytes] | None = None
    driver = None
    try:
        zk.start()
        controller = f"{zk.hosts}/bench-console"
        for i in range(GROUPS):
            g = BrokerGroup(root, f"broker-{chr(ord('a') + i)}", controller)
            groups.append(g)
            g.wait_master()
        servers = ",".join(g.address for g in groups)
        with Admin(servers.split(","), timeout_ms=10_000) as admin:
            for t in range(TOPICS):
                admin.create_topic(f"topic-{t:02d}", 4)
        print(f"console benchmark: {GROUPS} groups (controller mode, one ASYNC_MASTER each), "
              f"{TOPICS} topics x 4 queues per group, refresh {REFRESH_MS} ms, "
              f"{os.cpu_count()} CPUs", flush=True)
        time.sleep(3)  # the topics reach ZooKeeper and every broker's view
        # the brokers without a console
        before = [cpu_seconds(g.proc.pid) for g in groups]
        time.sleep(WINDOW_S)
        idle = [cpu_seconds(g.proc.pid) - b for g, b in zip(groups, before, strict=True)]
        port = _support.free_port()
        console = subprocess.Popen(
            [sys.executable, "-m", "common.cli", "console", "-s", servers, "--listen",
             f"127.0.0.1:{port}", "--refresh-ms", str(REFRESH_MS), "--json"],
            stdout=subprocess.PIPE, cwd=_support.REPO, env=_support.broker_env())
        assert console.stdout is not None and str(port) in console.stdout.readline().decode()
        url = f"http://127.0.0.1:{port}/"
        driver = browser()
        cluster_s, topics_s = [], []
        for _ in range(ROUNDS):
            cluster_s.append(load(driver, url + "#cluster", "#groups tbody tr[data-group]",
                                  GROUPS))
            topics_s.append(load(driver, url + "#topics", "#topics tbody tr[data-topic]",
                                 TOPICS))
        driver.get(url + "#cluster")  # one page open, polling, while the brokers are measured
        before = [cpu_seconds(g.proc.pid) for g in groups]
        time.sleep(WINDOW_S)
        polled = [cpu_seconds(g.proc.pid) - b for g, b in zip(groups, before, strict=True)]
        print("render (navigation to the rows drawn), median / worst of "
              f"{ROUNDS}:")
        for name, xs in (("cluster page (3 groups)", cluster_s),
                         (f"topics page ({TOPICS} topics)", topics_s)):
            worst = max(xs)
            print(f"  {name:28s} {statistics.median(xs) * 1000:6.0f} ms / {worst * 1000:6.0f} ms"
                  f"   target < {TARGET_RENDER_S * 1000:.0f} ms: "
                  f"{'met' if worst < TARGET_RENDER_S else 'MISSED'}")
        print(f"each broker's CPU over {WINDOW_S:.0f} s, without the console and with it (one "
              "cluster page open):")
        for g, a, b in zip(groups, idle, polled, strict=True):
            share = (b - a) / WINDOW_S
            print(f"  {g.name}: {a / WINDOW_S * 100:5.2f}% -> {b / WINDOW_S * 100:5.2f}% of a "
                  f"core, the console's share {share * 100:+.2f}%   target < "
                  f"{TARGET_CPU * 100:.0f}%: {'met' if share < TARGET_CPU else 'MISSED'}")
        return 0
    finally:
        if driver is not None:
            driver.quit()  # type: ignore[attr-defined]
        if console is not None:
            _support.stop(console)
        for g in groups:
            _support.stop(g.proc)
        zk.kill()


if __name__ == "__main__":
    sys.exit(main())
