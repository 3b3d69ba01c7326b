"""The dashboard in a real headless browser: Debian's Chromium driven by Selenium through
chromedriver. A worker Queue and the dashboard share a storage (FileStorage, the suite's
Redis), each with its own storage object as two processes would; the test enqueues jobs
and checks what the browser shows. Every wait is on the DOM (``WebDriverWait``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from trioqueue import Job, JobFailedError, Queue, Storage
from trioqueue.dashboard import Dashboard

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT = 45  # seconds before a DOM wait gives up (a failure deadline, not a timing assertion)
EVIL = "<script>alert('xss')</script><img src=x onerror=alert(1)>"

T = TypeVar("T")



def browser_required(environ: Mapping[str, str]) -> bool:
    """CI (``CI`` set to a true value, as CI services and ``.ci/run`` do) or
    ``TRIOQUEUE_REQUIRE_BROWSER=1`` require the browser tests: there a missing browser
    fails them; elsewhere it skips them with the reason."""
    truthy = {"1", "true", "yes", "on"}
    return any(environ.get(name, "").strip().lower() in truthy for name in ("CI", "TRIOQUEUE_REQUIRE_BROWSER"))


def browser_missing_reason(missing: list[str]) -> str:
    return (
        f"the dashboard's browser tests need Debian's Chromium and chromedriver; missing: {', '.join(missing)} "
        "(apt-get install -y chromium chromium-driver)"
    )


def test_browser_tests_skip_without_a_browser_and_fail_where_required() -> None:
    assert not browser_required({})
    assert not browser_required({"CI": "false", "TRIOQUEUE_REQUIRE_BROWSER": "0"})
    assert browser_required({"CI": "true"})
    assert browser_required({"TRIOQUEUE_REQUIRE_BROWSER": "1"})
    assert "/usr/bin/chromedriver" in browser_missing_reason(["/usr/bin/chromedriver"])


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        reason = browser_missing_reason(missing)
        if browser_required(os.environ):
            pytest.fail(f"{reason} (required: CI or TRIOQUEUE_REQUIRE_BROWSER is set)")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(params=["file", "redis", "postgres"])
def storages(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, Storage]:
    """Two storage objects on the same data: the worker's and the dashboard's."""
    if request.param == "file":
        from trioqueue.storage.file import FileStorage

        return FileStorage(tmp_path / "store"), FileStorage(tmp_path / "store")
    if request.param == "postgres":
        from trioqueue.storage.postgres import PostgresStorage

        pg_url, schema = request.getfixturevalue("postgres_url"), f"t_{uuid.uuid4().hex[:12]}"
        return PostgresStorage(pg_url, schema=schema), PostgresStorage(pg_url, schema=schema)
    from trioqueue.storage.redis import RedisStorage

    url = request.getfixturevalue("redis_url")
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    return RedisStorage(url, prefix=prefix), RedisStorage(url, prefix=prefix)


async def in_browser(fn: Callable[[], T]) -> T:
    """Selenium blocks: run it in a thread while Trio serves the dashboard."""
    return await trio.to_thread.run_sync(fn)


class Page:
    def __init__(self, driver: WebDriver, base: str) -> None:
        self.d = driver
        self.base = base

    def open(self, path: str) -> None:
        self.d.get(self.base + path)
        self.until(lambda d: "on" in d.find_element(By.ID, "live").get_attribute("class"))  # stream connected
        self.d.execute_script("window.__sameDocument = true")

    def same_document(self) -> bool:
        """Nothing reloaded the page since :meth:`open` (so a change came live)."""
        return bool(self.d.execute_script("return window.__sameDocument === true"))

    def until(self, predicate: Callable[[WebDriver], Any]) -> Any:
        # A live page replaces its content when events arrive: an element found a moment
        # ago may be gone (stale); look again.
        ignored = (NoSuchElementException, StaleElementReferenceException)

        def attempt(d: WebDriver) -> Any:
            try:
                return predicate(d)
            except WebDriverException as exc:
                # Chromium sometimes reports a replaced node this way instead of as stale
                if "does not belong to the document" in str(exc):
                    return False
                raise

        return WebDriverWait(self.d, WAIT, ignored_exceptions=ignored).until(attempt)

    def count(self, queue: str, state: str) -> str:
        return self.text(f'[data-count][data-queue="{queue}"][data-state="{state}"]')

    def wait_count(self, queue: str, state: str, value: int) -> None:
        self.until(lambda d: self.count(queue, state) == str(value))

    def text(self, css: str) -> str:
        """The element's text (found again if the page replaced it meanwhile)."""
        return str(self.until(lambda d: d.find_element(By.CSS_SELECTOR, css).text or None))

    def wait_text(self, css: str, fragment: str) -> None:
        self.until(lambda d: any(fragment in e.text for e in d.find_elements(By.CSS_SELECTOR, css)))

    def click(self, css: str) -> None:
        self.until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)

    def no_alert(self) -> bool:
        try:
            self.d.switch_to.alert
        except NoAlertPresentException:
            return True
        return False


async def test_dashboard_in_a_real_browser(browser: WebDriver, storages: tuple[Storage, Storage]) -> None:
    worker_storage, dashboard_storage = storages
    fixed = trio.Event()

    async def handler(job: Job[Any]) -> Any:
        payload = job.payload
        if payload.get("flaky") and not fixed.is_set():
            raise RuntimeError("flaky failure")
        if "fail" in payload:
            raise ValueError(payload["fail"])
        return {"echo": payload, "fixed": fixed.is_set()}

    queue: Queue[Any, Any] = Queue(worker_storage, name="web", handler=handler, max_attempts=1, block_timeout=0.5)
    async with queue, trio.open_nursery() as nursery:
        await queue.enqueue_and_wait("warm-up", {"n": 0}, timeout=WAIT)
        dashboard = Dashboard(dashboard_storage, port=0)  # finds the queue in the storage
        [base] = await nursery.start(dashboard.run)
        page = Page(browser, base)

        # -- the overview: counts change live, pause/resume from the browser ------------
        await in_browser(lambda: page.open("/"))
        assert await in_browser(lambda: page.count("web", "completed")) == "1"
        await in_browser(lambda: page.click('tr[data-queue-row="web"] button[data-action="pause"]'))
        await in_browser(lambda: page.until(lambda d: page.text("#notice").startswith("Paused")))
        assert await queue.is_paused()
        await in_browser(lambda: page.open("/"))
        for i in range(3):
            await queue.enqueue(f"ok-{i}", {"n": i})
        await in_browser(lambda: page.wait_count("web", "queued", 3))
        await queue.resume()  # by another client: the page follows live
        await in_browser(lambda: page.wait_count("web", "completed", 4))
        await in_browser(lambda: page.wait_count("web", "queued", 0))
        await in_browser(lambda: page.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '[data-paused="web"]:not(.hidden)')))
        await queue.enqueue("flaky", {"flaky": True})
        await in_browser(lambda: page.wait_count("web", "failed", 1))
        assert await in_browser(page.same_document)  # all of it without a reload

        # -- the failed job: listed, found by id, its traceback shown -----------------------
        await in_browser(lambda: page.open("/queue?name=web&state=failed"))
        row = await in_browser(lambda: page.text('tr[data-job="flaky"]'))
        assert "RuntimeError: flaky failure" in row

        def search() -> None:
            box = browser.find_element(By.CSS_SELECTOR, "form.search input[name=id]")
            box.send_keys("flaky")
            box.submit()
            page.until(lambda d: d.find_elements(By.ID, "job-traceback"))

        await in_browser(search)
        traceback = await in_browser(lambda: page.text("#job-traceback"))
        assert "Traceback (most recent call last)" in traceback
        assert 'raise RuntimeError("flaky failure")' in traceback
        assert "RuntimeError: flaky failure" in traceback

        # -- retry re-runs it: the page follows it to completed -----------------------------
        fixed.set()
        await in_browser(lambda: page.click('button[data-action="retry"]'))
        await in_browser(lambda: page.wait_text("#job-state", "completed"))
        assert '"fixed": true' in await in_browser(lambda: page.text("#job-result"))
        status = await queue.get_status("flaky")
        assert status is not None and status.state == "completed" and status.attempts == 1

        # -- a <script> payload is shown as text and never runs ------------------------------
        await queue.enqueue_and_wait("xss", {"html": EVIL}, timeout=WAIT)
        with pytest.raises(JobFailedError):
            await queue.enqueue_and_wait("xss-error", {"fail": EVIL}, timeout=WAIT)
        for job_id, css in (("xss", "#job-result"), ("xss-error", "#job-payload"), ("xss-error", "#job-error")):
            await in_browser(lambda: page.open(f"/job?queue=web&id={job_id}"))
            assert EVIL in await in_browser(lambda: page.text(css))
            injected = await in_browser(
                lambda: browser.execute_script("return document.querySelectorAll('#content script, #content img').length")
            )
            assert injected == 0
            assert await in_browser(page.no_alert)
        await in_browser(lambda: page.open("/queue?name=web&state=completed"))
        assert "<script>alert('xss')</script>" in await in_browser(lambda: page.text('tr[data-job="xss"]'))
        assert await in_browser(page.no_alert)

        dashboard.stop()


async def test_the_queue_page_shows_groups_and_pauses_one(browser: WebDriver, storages: tuple[Storage, Storage]) -> None:
    """Groups (fair queuing) on the queue page: each group's queued and running jobs, and
    a pause/resume button per group that stops and restarts the claiming of its jobs."""
    producer_storage, dashboard_storage = storages
    async with Queue(producer_storage, name="shop") as producer, trio.open_nursery() as nursery:
        await producer.enqueue_many([(f"a{i}", i) for i in range(3)], group="acme")
        await producer.enqueue("z0", 0, group="zeta")
        await producer.enqueue("plain", 0)
        dashboard = Dashboard(dashboard_storage, port=0)
        [base] = await nursery.start(dashboard.run)
        page = Page(browser, base)
        await in_browser(lambda: page.open("/queue?name=shop&state=queued"))
        assert (await in_browser(lambda: page.text('tr[data-group="acme"]'))).split()[:3] == ["acme", "3", "0"]
        assert (await in_browser(lambda: page.text('tr[data-group="zeta"]'))).split()[:3] == ["zeta", "1", "0"]

        await in_browser(lambda: page.click('tr[data-group="acme"] button[data-action="pause_group"]'))
        await in_browser(lambda: page.until(lambda d: page.text("#notice").startswith("Group paused")))
        await in_browser(lambda: page.until(lambda d: d.find_elements(By.CSS_SELECTOR, '[data-group-paused="acme"]')))
        assert await producer.paused_groups() == ["acme"]

        await in_browser(lambda: page.click('tr[data-group="acme"] button[data-action="resume_group"]'))
        await in_browser(lambda: page.until(lambda d: page.text("#notice").startswith("Group resumed")))
        assert await producer.paused_groups() == []
        dashboard.stop()
