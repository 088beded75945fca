"""The console in a real browser: Debian's chromium, headless, driven by Selenium through
Debian's chromedriver (nothing downloaded), against a running gateway with traffic.

    console_browser.py --admin URL --data URL --token TOKEN --route NAME --model M \
        --driver PATH --browser PATH --out DIR

Checks, saving a screenshot of every page in DIR: a missing and a wrong token get the
login form, never a blank page; the right one shows the overview with live rates that
move; a flag turned on through the policy page's dry-run panel changes the tier a
request is served on and lands in the audit history, and so does a rollout percentage
set through the same panel; explain answers; a cache is
invalidated; the usage page prices a route's seconds; the LLM page shows an LLM route's
streams, its batch pool's window, its tenants' tokens against their limits and its
tokens' cost; a running batch is cancelled from the offline page and its owner sees it
cancelled; the page is readable at a phone's width. Exits 1 with what failed.
"""
import argparse
import json
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait


def fail(message):
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def call(url, token=None, method="GET", body=None, headers=None):
    request = urllib.request.Request(url, method=method, data=body, headers=headers or {})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.status, dict(r.headers), r.read()


def main():
    p = argparse.ArgumentParser()
    for name in ("admin", "data", "token", "route", "model", "driver", "browser", "out", "candidate", "batch", "llm"):
        p.add_argument(f"--{name}", required=True)
    a = p.parse_args()

    options = webdriver.ChromeOptions()
    options.binary_location = a.browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(a.driver), options=options)
    # The pages redraw every 2 s: an element read as it is replaced is read again.
    wait = WebDriverWait(driver, 20, ignored_exceptions=(StaleElementReferenceException, KeyError, ValueError))
    shot = lambda name: driver.save_screenshot(f"{a.out}/{name}.png")
    try:
        run(a, driver, wait, shot)
    finally:
        driver.quit()
    print("console: every check passed", file=sys.stderr)


def visible(driver, css):
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return bool(found) and found[0].is_displayed()


def log_in(driver, wait, token):
    wait.until(lambda d: visible(d, "#token"))
    box = driver.find_element(By.ID, "token")
    box.clear()
    box.send_keys(token, Keys.ENTER)


def table_rows(driver, table):
    """The text of every cell of table `table`, row by row, read in one call: the pages
    redraw every 2 s, and a cell read one at a time on a loaded machine is read from a
    table that is already gone."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " (tr) => Array.from(tr.querySelectorAll('td'), (td) => td.innerText.trim()))",
        f"#{table} tbody tr",
    )


def row(driver, table, first):
    """The cells of the row of table `table` whose first cell is `first`, or None."""
    for cells in table_rows(driver, table):
        if cells and cells[0] == first:
            return cells
    return None


def overview_rows(driver):
    return {(cells[0], cells[1]): cells for cells in table_rows(driver, "overview") if len(cells) >= 3}


def run(a, driver, wait, shot):
    # No token: the login form, not a blank page.
    driver.get(f"{a.admin}/admin/ui/")
    wait.until(lambda d: visible(d, "#login-form"))
    shot("login")
    # A wrong token: refused, the form again, saying so.
    log_in(driver, wait, "not-the-token")
    wait.until(lambda d: "refused" in d.find_element(By.ID, "login-why").text)
    if visible(driver, "#page"):
        fail("a wrong token showed a page")
    shot("login_refused")

    # The right token: the overview, with live rates that move.
    log_in(driver, wait, a.token)
    wait.until(lambda d: (a.route, "realtime") in overview_rows(d))
    wait.until(lambda d: float(overview_rows(d)[(a.route, "realtime")][2] or 0) > 0)
    first = driver.find_element(By.ID, "status").text
    wait.until(lambda d: d.find_element(By.ID, "status").text != first)
    replica = driver.find_element(By.ID, "replica").text
    if "replica" not in replica or "policy v" not in replica:
        fail(f"the overview does not say which replica it is: {replica!r}")
    shot("overview")

    # Policy: turn micro_batch on through the dry-run panel, then apply.
    def tier():
        status, headers, _ = call(
            f"{a.data}/v2/models/{a.model}/infer",
            method="POST",
            body=json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode(),
            headers={"content-type": "application/json", "x-tiergate-budget-ms": "2000", "cache-control": "no-cache"},
        )
        return headers.get("x-tiergate-tier") or headers.get("X-Tiergate-Tier")

    def apply_through_dry_run(name, shows, served_on):
        """Waits for the dry-run panel, checks it shows each of `shows`, saves screenshot
        `name`, applies, and waits until the route's requests are served on `served_on`."""
        wait.until(lambda d: visible(d, "#dryrun #apply"))
        panel = driver.find_element(By.ID, "dryrun").text
        missing = [want for want in shows if want not in panel]
        if missing:
            fail(f"the dry-run panel does not show {missing}: {panel!r}")
        driver.execute_script("document.getElementById('dryrun').scrollIntoView()")
        shot(name)
        driver.find_element(By.ID, "apply").click()
        wait.until(lambda d: "applied" in d.find_element(By.ID, "status").text)
        deadline = time.time() + 10
        while tier() != served_on:
            if time.time() > deadline:
                fail(f"after the change the request is still served on {tier()}, not {served_on}")
            time.sleep(0.1)

    if tier() != "realtime":
        fail(f"before the change the request should be real-time, it was {tier()}")
    driver.get(f"{a.admin}/admin/ui/#policy")
    toggle = f"button[data-toggle='{a.route}'][data-flag='micro_batch']"
    wait.until(lambda d: visible(d, toggle))
    driver.find_element(By.CSS_SELECTOR, toggle).click()
    apply_through_dry_run("policy_dry_run", ["Requests served differently", "micro_batch"], "micro_batch")
    _, _, history = call(f"{a.admin}/admin/policy/history", token=a.token)
    history = json.loads(history)
    newest = history["versions"][0]
    if newest["action"] != "patch_route" or newest["version"] != history["current"]:
        fail(f"the audit history's newest entry is not the flag change: {newest}")
    wait.until(lambda d: visible(d, "#history"))
    shot("policy")

    # Batching: the route's batches since micro_batch was turned on, its learned cost.
    driver.get(f"{a.admin}/admin/ui/#batching")
    batching = lambda: row(driver, "batching", a.route)
    wait.until(lambda d: batching() is not None and float(batching()[2]) > 0)
    for table in ("queue", "shares"):
        if not visible(driver, f"#{table}"):
            fail(f"the batching page has no {table} table")
    wait.until(lambda d: a.route in d.find_element(By.ID, "shares").text)
    driver.execute_script("window.scrollTo(0, 0)")
    shot("batching")

    # Backends: every endpoint of the route's real-time pool, its circuit closed.
    driver.get(f"{a.admin}/admin/ui/#backends")
    def circuits():
        return {(cells[0], cells[1]): cells for cells in table_rows(driver, "endpoints") if len(cells) >= 8}
    # Closed, answering (a recent latency), its last active check passed.
    wait.until(lambda d: circuits().get((a.route, "realtime"), [""] * 8)[3] == "closed")
    wait.until(lambda d: float(circuits()[(a.route, "realtime")][6]) > 0)
    wait.until(lambda d: circuits()[(a.route, "realtime")][7].startswith("passed"))
    # The shadow candidates' pools too.
    wait.until(lambda d: circuits().get(("held", "shadow"), [""] * 8)[3] == "closed")
    driver.execute_script("document.getElementById('endpoints').scrollIntoView()")
    shot("backends")

    # Rollouts: a promotion below its gate is refused; above it, the candidate is the pool.
    driver.get(f"{a.admin}/admin/ui/#rollouts")
    def gate(route):
        cells = row(driver, "rollouts", route)
        return cells[6] if cells else None
    deadline = time.time() + 20
    while gate("ro") != "met":
        if time.time() > deadline:
            fail(f"ro's gate was not met: {gate('ro')!r}")
        time.sleep(0.5)
        driver.refresh()
        wait.until(lambda d: visible(d, "#rollouts"))
    if not (gate("held") or "").startswith("unmet"):
        fail(f"held's gate should be unmet: {gate('held')!r}")
    # The report as pictures: agreement and both sides' latency by minute, the
    # differences by output.
    charts = driver.find_elements(By.CSS_SELECTOR, "section.charts[aria-label='held'] figure.chart")
    if len(charts) < 3 or not driver.find_elements(By.CSS_SELECTOR, "section.charts[aria-label='held'] polyline"):
        fail(f"the rollouts page draws no pictures of held's report ({len(charts)} charts)")
    driver.find_element(By.CSS_SELECTOR, "button[data-promote='held']").click()
    wait.until(lambda d: visible(d, "#dryrun #apply"))
    if "Gate: unmet" not in driver.find_element(By.ID, "dryrun").text:
        fail("the promotion's dry run does not show the unmet gate")
    driver.find_element(By.ID, "apply").click()
    wait.until(lambda d: visible(d, "#refused"))
    if "gate" not in driver.find_element(By.ID, "refused").text:
        fail(f"the refusal does not name the gate: {driver.find_element(By.ID, 'refused').text!r}")
    if not visible(driver, "button[data-force='held']"):
        fail("no way to promote past the gate is offered")
    shot("rollouts_refused")
    driver.find_element(By.CSS_SELECTOR, "button[data-promote='ro']").click()
    wait.until(lambda d: "Gate: met" in d.find_element(By.ID, "dryrun").text)
    driver.find_element(By.ID, "apply").click()
    wait.until(lambda d: "applied" in d.find_element(By.ID, "status").text)
    _, _, route = call(f"{a.admin}/admin/routes/ro", token=a.token)
    if a.candidate not in json.dumps(json.loads(route)["spec"]):
        fail("after the promotion the route's pool is not the candidate")
    wait.until(lambda d: visible(d, "#rollouts") and not visible(d, "#dryrun"))
    driver.execute_script("window.scrollTo(0, 0)")
    shot("rollouts")

    # Explain: the tier for a described request.
    driver.get(f"{a.admin}/admin/ui/#explain")
    wait.until(lambda d: visible(d, "#ex-model"))
    driver.find_element(By.ID, "ex-model").send_keys(a.model)
    driver.find_element(By.ID, "ex-budget").send_keys("2000")
    driver.find_element(By.CSS_SELECTOR, "#explain-form button[type=submit]").click()
    wait.until(lambda d: visible(d, "#explained-tier"))
    if driver.find_element(By.ID, "explained-tier").text != "micro_batch":
        fail("explain does not give the tier the policy now says")
    shot("explain")

    # Cache: invalidate the route's cache.
    driver.get(f"{a.admin}/admin/ui/#cache")
    button = f"button[data-invalidate='{a.route}']"
    wait.until(lambda d: visible(d, button))
    driver.find_element(By.CSS_SELECTOR, button).click()
    wait.until(EC.alert_is_present())
    driver.switch_to.alert.accept()
    wait.until(lambda d: f"invalidated {a.route}" in d.find_element(By.ID, "status").text)
    shot("cache")

    # Usage: the route's real-time row, its seconds priced at its pool's cost_per_hour
    # (its batch pool names no price: its row says none).
    driver.get(f"{a.admin}/admin/ui/#usage")
    def priced_usage_row():
        for cells in table_rows(driver, "usage"):
            if cells[:2] == [a.route, "realtime"]:
                return int(cells[2]) > 0 and "USD" in cells[6]
        return False
    try:
        wait.until(lambda d: priced_usage_row())
    except TimeoutException:
        fail(f"the usage page has no priced real-time row for {a.route}: {driver.find_element(By.ID, 'page').text!r}")
    if "s used" not in driver.find_element(By.ID, "usage-total").text:
        fail(f"the usage page has no total: {driver.find_element(By.ID, 'usage-total').text!r}")
    shot("usage")

    # LLM: the chat route's streams (a time to first token on both tiers), its batch
    # pool's window against its limits, its tenant's tokens against its limits, and
    # its tokens' cost with what they saved against the real-time price.
    driver.get(f"{a.admin}/admin/ui/#llm")
    def llm_ready():
        streams = {(c[0], c[1]): c for c in table_rows(driver, "llm") if len(c) >= 8}
        tiers = [streams.get((a.llm, t)) for t in ("realtime", "micro_batch")]
        if not all(t and t[2] != "–" and float(t[2]) > 0 for t in tiers):
            return False
        window = row(driver, "windows", a.llm)
        if not window or "of 4" not in window[1] or "of 4096" not in window[2]:
            return False
        tenant = row(driver, "token-limits", a.llm)
        if not tenant or "of 1000000" not in tenant[2] or "of 50000000" not in tenant[3]:
            return False
        cost = {(c[0], c[1]): c for c in table_rows(driver, "token-cost") if len(c) >= 6}
        batch = cost.get((a.llm, "micro_batch"))
        return bool(batch and "USD" in batch[4] and "USD" in batch[5] and float(batch[5].split()[0]) > 0)
    try:
        wait.until(lambda d: llm_ready())
    except TimeoutException:
        fail(f"the LLM page lacks the chat route's streams, window, limits or cost: {driver.find_element(By.ID, 'page').text!r}")
    driver.execute_script("window.scrollTo(0, 0)")
    shot("llm")

    # Offline: the running batch, its progress; cancelled as its owner would.
    driver.get(f"{a.admin}/admin/ui/#offline")
    batch_row = lambda: row(driver, "batches", a.batch)
    wait.until(lambda d: batch_row() is not None and batch_row()[3] == "in_progress")
    if "queued" not in driver.find_element(By.ID, "jobs").text:
        fail(f"the jobs table does not count the queued jobs: {driver.find_element(By.ID, 'jobs').text!r}")
    button = f"button[data-cancel-batch='{a.batch}']"
    wait.until(lambda d: visible(d, button))
    driver.find_element(By.CSS_SELECTOR, button).click()
    wait.until(EC.alert_is_present())
    driver.switch_to.alert.accept()
    wait.until(lambda d: batch_row() is not None and batch_row()[3] in ("cancelling", "cancelled"))
    _, _, owner = call(f"{a.data}/v1/batches/{a.batch}")
    owner = json.loads(owner)
    if owner["status"] not in ("cancelling", "cancelled"):
        fail(f"the batch's owner sees it {owner['status']} after the console cancelled it")
    if visible(driver, button):
        fail("a cancelled batch still offers to be cancelled")
    wait.until(lambda d: batch_row()[3] == "cancelled")
    driver.execute_script("window.scrollTo(0, 0)")
    shot("offline")

    # A rollout percentage through the same dry run: 0% of the keys to micro-batch sends
    # the route's requests back to real time.
    driver.get(f"{a.admin}/admin/ui/#policy")
    wait.until(lambda d: visible(d, "#setting-form"))
    Select(driver.find_element(By.ID, "set-route")).select_by_visible_text(a.route)
    Select(driver.find_element(By.ID, "set-key")).select_by_value("micro_batch_percent")
    driver.find_element(By.ID, "set-value").send_keys("0")
    driver.find_element(By.CSS_SELECTOR, "#setting-form button[type=submit]").click()
    apply_through_dry_run("policy_setting", ["micro_batch_percent", "realtime"], "realtime")
    wait.until(lambda d: row(d, "settings", a.route) is not None and row(d, "settings", a.route)[1] == "0")

    # Keyboard: the pages are links reached with Tab and opened with Enter.
    driver.get("about:blank")
    driver.get(f"{a.admin}/admin/ui/#cache")
    wait.until(lambda d: visible(d, "#cache"))
    keys = ActionChains(driver)
    for _ in range(2):
        keys.send_keys(Keys.TAB)
    keys.perform()
    focused = driver.switch_to.active_element.get_attribute("href") or ""
    if not focused.endswith("#policy"):
        fail(f"two tabs from the top should reach the Policy link, they reached {focused!r}")
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    wait.until(lambda d: d.execute_script("return location.hash") == "#policy")

    # A phone's width: nothing wider than the screen but the tables, which scroll.
    driver.set_window_size(390, 844)
    driver.get(f"{a.admin}/admin/ui/#overview")
    wait.until(lambda d: (a.route, "realtime") in overview_rows(d) or (a.route, "micro_batch") in overview_rows(d))
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    if overflow > 1:
        fail(f"at a phone's width the page is {overflow} px wider than the screen")
    shot("overview_phone")


if __name__ == "__main__":
    main()
