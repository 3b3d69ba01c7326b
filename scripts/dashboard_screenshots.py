"""Take the README's dashboard screenshots (docs/dashboard-*.png) with headless Chromium.

    .venv/bin/python scripts/dashboard_screenshots.py [--seconds 90] [--out docs]

Runs a small workload on a FileStorage in a temporary directory (three queues, workers,
failures with tracebacks, a schedule) with the dashboard watching it, then photographs the
main pages. Needs /usr/bin/chromium and /usr/bin/chromedriver and the test extras.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import trio
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from trioqueue import ExecutionContext, FileStorage, Job, Queue
from trioqueue.dashboard import Dashboard

ROOT = Path(__file__).resolve().parent.parent


def relative_paths(ctx: ExecutionContext) -> None:
    """Tracebacks name files relative to the repository: the pictures show no machine's
    directories."""
    if ctx.error is not None:
        ctx.error = dataclasses.replace(ctx.error, traceback=ctx.error.traceback.replace(f'"{ROOT}/', '"'))


class InvoiceError(Exception):
    pass


async def send_email(job: Job[Any]) -> Any:
    await trio.sleep(random.uniform(0.05, 0.4))
    if job.payload["to"].endswith("@bounce.example"):
        raise ConnectionRefusedError(f"SMTP 550: mailbox {job.payload['to']} unavailable")
    return {"sent": True, "message_id": f"<{job.id}@mail.example>"}


async def render_report(job: Job[Any]) -> Any:
    for step in range(4):
        await job.report_progress({"step": step + 1, "of": 4})
        await trio.sleep(random.uniform(0.5, 2.0))
    if job.payload["customer"] % 7 == 0:
        raise InvoiceError(f"customer {job.payload['customer']} has no billing address")
    return {"pages": random.randint(2, 40)}


async def thumbnail(job: Job[Any]) -> Any:
    await trio.sleep(random.uniform(0.01, 0.1))
    return {"width": 320, "height": 240}


async def shoot(base: str, out: Path) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,820", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"))

    def take(path: str, name: str, wait_for: str = "#live.on") -> None:
        driver.get(base + path)
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, wait_for))
        driver.execute_script("return new Promise(r => setTimeout(r, 1200))")  # let the chart draw
        driver.save_screenshot(str(out / f"dashboard-{name}.png"))
        print("saved", out / f"dashboard-{name}.png")

    try:
        await trio.to_thread.run_sync(take, "/", "overview")
        await trio.to_thread.run_sync(take, "/queue?name=reports&state=failed", "failed-jobs")
        failed = await trio.to_thread.run_sync(
            lambda: driver.find_element(By.CSS_SELECTOR, "#jobs a.jid").get_attribute("href")
        )
        await trio.to_thread.run_sync(take, failed.replace(base, ""), "job", "#job-traceback")
        await trio.to_thread.run_sync(take, "/workers", "workers")
        await trio.to_thread.run_sync(take, "/schedules", "schedules")
    finally:
        driver.quit()


async def main(seconds: float, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        queues = [
            Queue(FileStorage(store), name="emails", handler=send_email, concurrency=8, max_attempts=2, retry_delay=0.5,
                  after_execution=relative_paths),
            Queue(FileStorage(store), name="reports", handler=render_report, concurrency=3, max_attempts=1,
                  after_execution=relative_paths),
            Queue(FileStorage(store), name="thumbnails", handler=thumbnail, concurrency=4, after_execution=relative_paths),
        ]
        async with trio.open_nursery() as nursery:
            for q in queues:
                await nursery.start(q.run)
            emails, reports, thumbs = queues
            await reports.schedule("nightly-digest", {"kind": "digest"}, cron="0 3 * * *", tz="Europe/Paris")
            await thumbs.schedule("cleanup", {"older_than_days": 30}, every=900)
            for i in range(3):
                await emails.enqueue(f"warm-{i}", {"to": f"user{i}@example.com"})
            dashboard = Dashboard(FileStorage(store), port=0)
            [base] = await nursery.start(dashboard.run)
            print("dashboard at", base)
            start = trio.current_time()
            n = 0
            while (t := trio.current_time() - start) < seconds:
                rate = 6 + 5 * math.sin(t / 12)
                n += 1
                to = f"user{n}@bounce.example" if n % 9 == 0 else f"user{n}@example.com"
                await emails.enqueue(f"welcome-{n}", {"to": to, "template": "welcome"})
                if n % 3 == 0:
                    await thumbs.enqueue(f"img-{n}", {"src": f"s3://uploads/{n}.jpg"})
                if n % 4 == 0:
                    await reports.enqueue(f"invoice-{n}", {"customer": n // 4, "month": "2026-10"})
                await trio.sleep(1 / rate)
            await thumbs.pause()
            for i in range(12):
                await thumbs.enqueue(f"img-late-{i}", {"src": f"s3://uploads/late-{i}.jpg"})
            await shoot(base, out)
            dashboard.stop()
            for q in queues:
                q.stop()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="workload before the screenshots")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where the PNGs go")
    args = parser.parse_args()
    trio.run(main, args.seconds, args.out)
