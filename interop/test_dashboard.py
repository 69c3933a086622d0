"""The web dashboard in a real browser: Debian's chromium, headless, driven by Selenium
through Debian's chromedriver (``.ci/run`` installs both).  The tests log in, see a queue
made over AMQP with its depth, publish a test message from the page and get it back,
close a connection from the page and see the client disconnected, see an MQTT client,
export the definitions, use the MQTT client page (MQTT.js over the WebSocket listener) with
paho TCP clients on the other side, and check that no page logs a console error.  Screenshots of
every page go to ``interop/artifacts/screenshots/`` (not committed).

FerryMQ-only: the page is FerryMQ's."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pika
import pytest

from brokers import Broker, free_port, free_ports
from mqttclient import V5, connect_props

pytestmark = [pytest.mark.amqp, pytest.mark.ferrymq_only(reason="FerryMQ's dashboard")]

HERE = Path(__file__).resolve().parent
SHOTS = HERE / "artifacts" / "screenshots"
PAGES = ["overview", "connections", "queues", "exchanges", "mqtt", "admin", "definitions", "lookup", "websocket"]


def _binary(*names: str) -> str | None:
    for n in names:
        found = shutil.which(n) or (n if os.path.exists(n) else None)
        if found:
            return found
    return None


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    chromium = _binary("chromium", "/usr/bin/chromium", "chromium-browser")
    driver_bin = _binary("chromedriver", "/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
    if not chromium or not driver_bin:
        if os.environ.get("INTEROP_REQUIRE_BROWSER") == "1":
            pytest.fail("chromium / chromedriver not found (.ci/run installs Debian's chromium and chromium-driver)")
        pytest.skip("chromium / chromedriver not installed")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(executable_path=driver_bin), options=opts)
    d.set_page_load_timeout(30)
    yield d
    d.quit()


def http_base(broker) -> str:
    host, port = broker.listeners["http"]
    return f"http://{host}:{port}/"


def wait_for(what: str, check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # the element is not there yet
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


def errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def shot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def log_in(driver, broker):
    from selenium.webdriver.common.by import By

    driver.get(http_base(broker))
    driver.find_element(By.ID, "username").send_keys("guest")
    driver.find_element(By.ID, "password").send_keys("guest")
    driver.find_element(By.ID, "login-button").click()
    wait_for("the navigation after login", lambda: driver.find_element(By.ID, "nav").is_displayed())
    assert "guest" in driver.find_element(By.ID, "who").text


def go(driver, page: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f'#nav a[href="#{page}"]').click()
    # The page marks itself ready once its calls answered and it rendered; before that the
    # previous page's elements may still be there and be replaced under the test.
    wait_for(f"the {page} page", lambda: driver.find_element(By.ID, "main").get_attribute("data-ready") == page)


def test_a_wrong_password_is_refused_on_the_page(broker, browser):
    from selenium.webdriver.common.by import By

    browser.get(http_base(broker))
    browser.find_element(By.ID, "username").send_keys("guest")
    browser.find_element(By.ID, "password").send_keys("nope")
    browser.find_element(By.ID, "login-button").click()
    text = wait_for("the refusal", lambda: browser.find_element(By.ID, "login-error").text)
    assert "Login failed" in text
    assert not browser.find_element(By.ID, "nav").is_displayed()


def test_the_dashboard_shows_queues_publishes_gets_closes_and_exports(broker, browser, amqp, mqtt, topic):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    conn = amqp()
    ch = conn.channel()
    ch.queue_declare("dash-q", durable=True)
    for i in range(3):
        ch.basic_publish("", "dash-q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    device = mqtt(client_id="dash-device")
    device.subscribe(f"{topic}/#", qos=1)

    log_in(browser, broker)
    wait_for("the overview counts the queue",
             lambda: browser.find_element(By.CSS_SELECTOR, "#stat-queues .value").text == "1")
    shot(browser, "overview")

    go(browser, "queues")
    row = wait_for("the queue row", lambda: browser.find_element(By.CSS_SELECTOR, '#queues-table tr[data-name="dash-q"]'))
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1] == "dash-q" and cells[4] == "3", cells
    shot(browser, "queues")

    row.find_element(By.LINK_TEXT, "dash-q").click()
    wait_for("the queue page", lambda: "dash-q" in browser.find_element(By.ID, "page-title").text)
    browser.find_element(By.ID, "publish-payload").send_keys("from the page")
    browser.find_element(By.ID, "publish-button").click()
    wait_for("published", lambda: browser.find_element(By.ID, "queue-status").text == "published")
    assert ch.queue_declare("dash-q", passive=True).method.message_count == 4, "a pika client sees it"
    count = browser.find_element(By.CSS_SELECTOR, '#get-form input[name="count"]')
    count.clear()
    count.send_keys("10")
    Select(browser.find_element(By.CSS_SELECTOR, '#get-form select[name="ackmode"]')).select_by_value("ack_requeue_true")
    browser.find_element(By.ID, "get-button").click()
    payloads = wait_for("the messages got", lambda: [r.find_elements(By.TAG_NAME, "td")[0].text for r in
                                                     browser.find_elements(By.CSS_SELECTOR, "#got-table tbody tr")])
    assert payloads == ["m0", "m1", "m2", "from the page"], payloads
    shot(browser, "queue")

    go(browser, "mqtt")
    wait_for("the MQTT client", lambda: browser.find_element(By.CSS_SELECTOR, '#clients-table tr[data-name="dash-device"]'))
    shot(browser, "mqtt")

    go(browser, "connections")
    rows = wait_for("the AMQP connection", lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "#connections-table tbody tr")
                                                   if "AMQP 0-9-1" in r.text])
    assert len(rows) == 1, [r.text for r in rows]
    shot(browser, "connections")
    rows[0].find_element(By.CSS_SELECTOR, "button[data-close]").click()
    wait_for("the close is confirmed", lambda: browser.find_element(By.ID, "connections-status").text.startswith("closed"))
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    assert closed.value.reply_code == 320
    assert "Closed from the FerryMQ dashboard" in closed.value.reply_text

    go(browser, "definitions")
    browser.find_element(By.ID, "export-button").click()
    text = wait_for("the export", lambda: browser.find_element(By.ID, "definitions-json").get_attribute("value"))
    assert '"dash-q"' in text and '"rabbit_version"' in text
    download = browser.find_element(By.ID, "definitions-download")
    # The connections page's refresh after the close (300 ms) must not render this page again
    # under the user: the exported text and its link stay where they are.
    time.sleep(0.6)
    assert download.is_displayed()
    assert browser.find_element(By.ID, "definitions-json").get_attribute("value") == text
    shot(browser, "definitions")

    for page in PAGES:
        go(browser, page)
        # The page marks itself ready once its calls answered and it rendered.
        wait_for(f"the {page} page to finish", lambda: browser.find_element(By.ID, "main").get_attribute("data-ready") == page)
        assert not browser.find_elements(By.CSS_SELECTOR, "[role=alert]"), f"{page}: an error on the page"
        shot(browser, page)
    assert errors(browser) == [], "console errors"


def test_the_mqtt_client_page_subscribes_and_publishes_over_websocket(broker, browser, mqtt):
    """The MQTT client page: MQTT.js (vendored) over the WebSocket listener named in
    /api/overview (http/web-mqtt), logged in as the dashboard user; paho TCP clients on the
    other side."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def fill(element_id: str, text: str) -> None:
        e = browser.find_element(By.ID, element_id)
        e.clear()
        e.send_keys(text)

    def rows():
        return [[td.text for td in r.find_elements(By.TAG_NAME, "td")]
                for r in browser.find_elements(By.CSS_SELECTOR, "#ws-messages tbody tr")]

    device = mqtt(client_id="dash-paho")
    device.publish("dash/r", b"retained before", qos=1, retain=True)
    log_in(browser, broker)
    go(browser, "websocket")
    assert browser.find_element(By.ID, "ws-url").get_attribute("value") == f"ws://127.0.0.1:{broker.listeners['ws'][1]}/mqtt"
    browser.find_element(By.ID, "ws-connect").click()
    wait_for("the page's MQTT connection", lambda: browser.find_element(By.ID, "ws-status").text.startswith("connected"))

    fill("ws-filter", "dash/#")
    Select(browser.find_element(By.ID, "ws-subscribe-qos")).select_by_value("1")
    browser.find_element(By.ID, "ws-subscribe").click()
    wait_for("the SUBACK", lambda: browser.find_element(By.ID, "ws-status").text == "subscribed to dash/# (QoS 1)")
    assert browser.find_element(By.CSS_SELECTOR, '#ws-subscriptions li[data-name="dash/#"]')
    retained = wait_for("the retained message", lambda: [r for r in rows() if r[0] == "dash/r"])
    assert retained[0][1:4] == ["retained before", "1", "yes"], retained

    device.publish("dash/x", "from paho ✓".encode(), qos=1)
    got = wait_for("paho's message on the page", lambda: [r for r in rows() if r[0] == "dash/x"])
    assert got[0][1:4] == ["from paho ✓", "1", "no"], got
    assert rows()[0][0] == "dash/x", "newest first"

    listener = mqtt(client_id="dash-listener")
    listener.subscribe("dash/y", qos=2)
    fill("ws-topic", "dash/y")
    fill("ws-payload", "from the page")
    Select(browser.find_element(By.ID, "ws-publish-qos")).select_by_value("2")
    browser.find_element(By.ID, "ws-publish").click()
    m = listener.get()
    assert (m.topic, m.payload, m.qos, m.retain) == ("dash/y", b"from the page", 2, False)
    wait_for("the PUBCOMP", lambda: browser.find_element(By.ID, "ws-status").text == "published to dash/y")
    # The page's own message comes back to it through its dash/# subscription.
    wait_for("the page's message echoed", lambda: [r for r in rows() if r[0] == "dash/y"])
    shot(browser, "mqtt-client")

    browser.find_element(By.ID, "ws-disconnect").click()
    wait_for("disconnected", lambda: browser.find_element(By.ID, "ws-status").text == "disconnected")
    assert not browser.find_elements(By.CSS_SELECTOR, "[role=alert]")
    assert errors(browser) == [], "console errors"


def api_get(broker, path: str):
    """(status, JSON) of a management API GET as guest."""
    req = urllib.request.Request(http_base(broker) + "api" + path)
    req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def cells(row) -> list[str]:
    from selenium.webdriver.common.by import By

    return [td.text for td in row.find_elements(By.TAG_NAME, "td")]


def test_a_session_that_never_expires_shows_never(broker, browser, mqtt):
    """Issue 30: the MQTT page showed 4294967295 as the expiry of a session that never
    expires (MQTT 5's 0xFFFFFFFF)."""
    from selenium.webdriver.common.by import By

    mqtt(version=V5, client_id="dash-forever", clean=False,
         properties=connect_props(SessionExpiryInterval=0xFFFFFFFF))
    mqtt(version=V5, client_id="dash-hour", clean=False, properties=connect_props(SessionExpiryInterval=3600))
    log_in(browser, broker)
    go(browser, "mqtt")
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#clients-table thead th")]
    at = next(i for i, h in enumerate(header) if "expiry" in h)
    forever = wait_for("the client", lambda: browser.find_element(By.CSS_SELECTOR, '#clients-table tr[data-name="dash-forever"]'))
    assert cells(forever)[at] == "never", cells(forever)
    hour = browser.find_element(By.CSS_SELECTOR, '#clients-table tr[data-name="dash-hour"]')
    assert cells(hour)[at] == "3,600 s", cells(hour)
    session = browser.find_element(By.CSS_SELECTOR, '#sessions-table tr[data-name="dash-forever"]')
    assert "never" in cells(session), cells(session)
    assert "4294967295" not in browser.find_element(By.ID, "main").text
    assert errors(browser) == [], "console errors"


def test_the_rate_chart_draws_no_caption_across_its_lines(broker, browser):
    """Issue 30: the rate chart's caption was drawn on the chart, across its lines. The
    chart is drawn with a peak at the top (the page's own drawing function, fed two
    samples) while every text drawn on a canvas is recorded: none is, and the scale and
    legend are in the caption under the chart."""
    from selenium.webdriver.common.by import By

    log_in(browser, broker)
    wait_for("the overview", lambda: browser.find_element(By.ID, "main").get_attribute("data-ready") == "overview")
    drawn = browser.execute_script("""
        const texts = [];
        const fillText = CanvasRenderingContext2D.prototype.fillText;
        CanvasRenderingContext2D.prototype.fillText = function (...a) { texts.push(a[0]); return fillText.apply(this, a); };
        const chart = document.getElementById("rates"), caption = document.getElementById("rates-caption");
        try {
            state.rates = [{ t: 1, publish: 2, deliver: 1 }, { t: 2, publish: 10, deliver: 4 }];
            drawRates(chart, caption);
        } finally {
            CanvasRenderingContext2D.prototype.fillText = fillText;
        }
        return { texts, caption: caption && caption.textContent,
                 below: !!caption && caption.getBoundingClientRect().top >= chart.getBoundingClientRect().bottom };
    """)
    assert drawn["texts"] == [], f"text drawn on the chart: {drawn}"
    assert drawn["caption"] == "max 10.0/s — publish, deliver", drawn
    assert drawn["below"], f"the caption is under the chart: {drawn}"
    assert errors(browser) == [], "console errors"


def test_permissions_are_set_and_cleared_from_the_admin_page(broker, browser):
    """Issue 30: the README (now docs/operations.md) says permissions can be added on the
    Admin page; the page had no way to. A user made on the page gets permissions in `/`
    from the page (PUT /api/permissions/%2F/{user}), which the API then answers, and loses
    them again."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def fill(form: str, name: str, text: str) -> None:
        e = browser.find_element(By.CSS_SELECTOR, f'#{form} [name="{name}"]')
        e.clear()
        e.send_keys(text)

    log_in(browser, broker)
    go(browser, "admin")
    fill("add-user", "name", "dash-user")
    fill("add-user", "password", "dash-pw")
    browser.find_element(By.CSS_SELECTOR, "#add-user button").click()
    wait_for("the user", lambda: browser.find_element(By.CSS_SELECTOR, '#users-table tr[data-name="dash-user"]'))
    wait_for("the page again", lambda: browser.find_element(By.ID, "main").get_attribute("data-ready") == "admin")
    Select(browser.find_element(By.CSS_SELECTOR, '#add-permission [name="user"]')).select_by_visible_text("dash-user")
    Select(browser.find_element(By.CSS_SELECTOR, '#add-permission [name="vhost"]')).select_by_visible_text("/")
    fill("add-permission", "configure", "^dash-")
    fill("add-permission", "write", "^(dash-.*|amq\\.topic)$")
    fill("add-permission", "read", ".*")
    browser.find_element(By.CSS_SELECTOR, "#add-permission button[type=submit]").click()
    row = wait_for("the permissions row", lambda: browser.find_element(By.CSS_SELECTOR, '#permissions-table tr[data-name="//dash-user"]'))
    assert cells(row)[:5] == ["dash-user", "/", "^dash-", "^(dash-.*|amq\\.topic)$", ".*"], cells(row)
    status, perms = api_get(broker, "/permissions/%2F/dash-user")
    assert status == 200 and perms["configure"] == "^dash-", (status, perms)
    shot(browser, "admin-permissions")

    row.find_element(By.CSS_SELECTOR, "button[data-clear]").click()
    wait_for("the row gone", lambda: not browser.find_elements(By.CSS_SELECTOR, '#permissions-table tr[data-name="//dash-user"]'))
    assert api_get(broker, "/permissions/%2F/dash-user")[0] == 404
    assert not browser.find_elements(By.CSS_SELECTOR, "[role=alert]")
    assert errors(browser) == [], "console errors"


def test_the_mqtt_page_names_a_bridge_the_rules_let_do_nothing(request, tmp_path, browser):
    """Issue 30: a bridge whose local side an acl_file lets do nothing showed `running` and
    lost everything. The MQTT page lists the bridges with what /api/ferrymq/bridges says:
    its state, the refused counts and the warning of each topic line."""
    from selenium.webdriver.common.by import By

    acl = tmp_path / "acl"
    acl.write_text("user device\ntopic readwrite #\n")
    conf = tmp_path / "ferrymq.toml"
    conf.write_text(
        f'[auth]\nmosquitto_acl_file = "{acl}"\n\n'
        f'[[bridge.mqtt]]\nconnection = "old"\naddress = "127.0.0.1:{free_port()}"\n'
        'topic = ["# both 1"]\nrestart_timeout = [5]\n')
    b = Broker("ferrymq", tmp_path / "broker", config=conf)
    request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, None)]
    b.start()
    try:
        log_in(browser, b)
        go(browser, "mqtt")
        row = wait_for("the bridge", lambda: browser.find_element(By.CSS_SELECTOR, '#bridges-table tr[data-name="old"]'))
        warnings = [w.text for w in row.find_elements(By.CSS_SELECTOR, "td .error")]
        assert len(warnings) == 2, warnings
        assert any("may publish none of these topics" in w for w in warnings), warnings
        assert any("may receive none of these topics" in w for w in warnings), warnings
        assert all("anonymous" in w for w in warnings), warnings
        shot(browser, "mqtt-bridges")
        assert errors(browser) == [], "console errors"
    finally:
        b.stop()


def test_a_cluster_member_lists_every_member_on_the_overview(request, tmp_path, browser):
    """Issue 26: the dashboard shows the nodes. Three members on loopback form a cluster;
    the overview of one lists all three, running, one of them the metadata group's leader."""
    from selenium.webdriver.common.by import By

    peers = free_ports(3)
    members = []
    for i in range(3):
        others = ", ".join(f'"n{j}@127.0.0.1:{peers[j]}"' for j in range(3) if j != i)
        conf = tmp_path / f"n{i}.toml"
        conf.write_text(
            f'[cluster]\nnode_name = "n{i}"\nlisten = "127.0.0.1:{peers[i]}"\n'
            f'peers = [{others}]\nsecret = "interop-cluster-secret-0123456789"\n')
        b = Broker("ferrymq", tmp_path / f"n{i}", config=conf)
        request.node._interop_brokers = getattr(request.node, "_interop_brokers", []) + [(b, None)]
        members.append(b)
    for b in members:
        b.start()
    try:
        log_in(browser, members[0])
        go(browser, "overview")

        def listed():
            rows = browser.find_elements(By.CSS_SELECTOR, "#cluster-table tbody tr")
            texts = {r.get_attribute("data-name"): r.text for r in rows}
            if set(texts) != {"n0", "n1", "n2"}:
                return None
            if not all("yes" in t for t in texts.values()) or not any("leader" in t for t in texts.values()):
                return None
            return texts

        texts = wait_for("three members listed, running, one of them leader", listed, timeout=40)
        assert "(this node)" in texts["n0"], texts
        shot(browser, "overview-cluster")
        assert errors(browser) == [], "console errors"
    finally:
        for b in members:
            b.stop()
