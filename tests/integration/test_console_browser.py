"""The web console in a real browser (issue 42): headless Chromium (Debian's ``chromium``,
driven by Selenium through Debian's ``chromedriver``; nothing is downloaded) against
``replog console`` and a master and a slave, each a process of its own. It loads the cluster
page, logs in, makes a topic, sends a message and finds it by id, and sees the slave it
SIGKILLs shown unreachable, and that change in the timeline.

Without chromium the test skips, unless ``REPLOG_REQUIRE_BROWSER=1`` (``.ci/run``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_harness import BrokerProcess, brokers, free_port
from browser_harness import PASSWORD, browser, click, text_of  # noqa: F401 - the fixture
from helpers.children import replog_child

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT_S = 20


@pytest.fixture
def console_process(tmp_path: Path) -> Iterator[tuple[str, BrokerProcess, BrokerProcess]]:
    master = BrokerProcess(tmp_path / "m", brokerName="web", brokerRole="SYNC_MASTER")
    slave = BrokerProcess(tmp_path / "s", brokerName="web", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{master.port + 1}")
    password_file = tmp_path / "console.password"
    password_file.write_text(PASSWORD + "\n")
    password_file.chmod(0o600)
    port = free_port(1)
    with brokers(master, slave), \
            replog_child("console", "-s", f"{master.address},{slave.address}", "--listen",
                         f"127.0.0.1:{port}", "--admin-password-file", str(password_file),
                         "--refresh-ms", "500", "--json", ready=f"127.0.0.1:{port}",
                         log=tmp_path / "console.err"):
        yield f"http://127.0.0.1:{port}/", master, slave


def test_the_console_in_a_browser(browser: Any,  # noqa: F811
                                  console_process: tuple[str, BrokerProcess,
                                                         BrokerProcess]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    url, master, slave = console_process
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(url)
    # the cluster page: the group, its master, its slave
    row = 'tr[data-group="web"]'
    wait.until(lambda d: master.address in text_of(d, row) and slave.address in text_of(d, row))
    assert "SYNC_MASTER" in text_of(browser, row)
    # log in; make a topic; send a test message
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
    wait.until(lambda d: d.find_element(By.ID, "who").text == "admin")
    browser.get(url + "#topics")
    browser.find_element(By.ID, "new-topic").send_keys("from-the-browser")
    queues = browser.find_element(By.ID, "new-queues")
    queues.clear()
    queues.send_keys("3")
    browser.find_element(By.CSS_SELECTOR, "#create-topic button").click()
    made = 'tr[data-topic="from-the-browser"]'
    wait.until(lambda d: "3" in text_of(d, made))
    browser.find_element(By.ID, "send-topic").send_keys("from-the-browser")
    browser.find_element(By.ID, "send-keys").send_keys("k-1")
    browser.find_element(By.ID, "send-body").send_keys("hello from chromium")
    browser.find_element(By.CSS_SELECTOR, "#send-form button").click()
    result = browser.find_element(By.ID, "send-result")
    wait.until(lambda _d: "SEND_OK" in result.text)
    msg_id = result.get_attribute("data-msgid")
    # find it by id
    browser.get(url + "#messages")
    browser.find_element(By.ID, "find-msgid").send_keys(msg_id)
    browser.find_element(By.CSS_SELECTOR, "#find-form button").click()
    found = wait.until(ec.presence_of_element_located(
        (By.CSS_SELECTOR, f'div.message[data-msgid="{msg_id}"]')))
    assert "hello from chromium" in found.find_element(By.CSS_SELECTOR, "pre.body").text
    assert "k-1" in found.text
    # every other page loads: a topic's queues, the groups, the security page
    browser.get(url + "#topics")
    wait.until(lambda d: click(d, 'tr[data-topic="from-the-browser"] a'))
    wait.until(lambda d: "1 messages kept" in text_of(d, "#topic-detail"))
    browser.get(url + "#groups")
    wait.until(lambda d: d.find_element(By.ID, "page-groups").is_displayed())
    browser.get(url + "#security")
    wait.until(lambda d: "aclEnable is off" in text_of(d, "#acl-summary"))
    assert not browser.find_element(By.ID, "banner").is_displayed()  # no page failed
    # the slave dies: shown unreachable, and the change is in the timeline
    browser.get(url + "#cluster")
    os.kill(slave.pid, signal.SIGKILL)
    wait.until(lambda d: "unreachable" in text_of(
        d, f'tr[data-group="web"] div[data-address="{slave.address}"]'))
    wait.until(lambda d: f"{slave.address} does not answer" in text_of(d, "#timeline"))
