"""A tree of jobs as the admin CLI (``show``) and the dashboard's job page show it: a
child names its parent, a parent lists its children and their counts by state."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from trioqueue import Child, FileStorage, MemoryStorage, Queue
from trioqueue.cli import main
from trioqueue.dashboard import Dashboard

from dashboard_client import Client

pytestmark = pytest.mark.capability("Trees")

T = TypeVar("T")
QUEUE = "tree"


async def _enqueue_tree(storage: FileStorage | MemoryStorage) -> None:
    async with Queue(storage, name=QUEUE) as q:
        await q.enqueue("report", None, children=[Child("fetch-a"), Child("fetch-b", queue="fetchers")])


def test_show_names_the_parent_and_lists_the_children(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(_enqueue_tree, FileStorage(tmp_path / "store"))
    url = f"file://{tmp_path / 'store'}"
    assert main(["show", "report", "--storage", url, "--name", QUEUE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "waiting_children" and data["parent"] is None
    assert data["children"] == [
        {"queue": QUEUE, "id": "fetch-a", "state": "queued"},
        {"queue": "fetchers", "id": "fetch-b", "state": "queued"},
    ]
    assert main(["show", "report", "--storage", url, "--name", QUEUE]) == 0
    human = capsys.readouterr().out
    assert "children:   2 queued" in human and "fetch-b (fetchers): queued" in human
    assert main(["show", "fetch-b", "--storage", url, "--name", "fetchers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parent"] == {"queue": QUEUE, "id": "report"}
    assert main(["show", "fetch-b", "--storage", url, "--name", "fetchers"]) == 0
    assert f"parent:     report (queue {QUEUE})" in capsys.readouterr().out


async def _in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


async def test_the_job_page_shows_parent_and_children() -> None:
    storage = MemoryStorage()
    await _enqueue_tree(storage)
    async with trio.open_nursery() as nursery:
        dashboard = Dashboard(storage, port=0, names=[QUEUE, "fetchers"])
        [base] = await nursery.start(dashboard.run)
        client = Client(base)
        page = await _in_thread(lambda: client.get(f"/job?queue={QUEUE}&id=report"))
        assert page.status == 200
        assert 'id="job-children"' in page.body and "fetch-a" in page.body and "fetchers" in page.body
        assert "waiting_children" in page.body
        child = await _in_thread(lambda: client.get("/job?queue=fetchers&id=fetch-b"))
        assert child.status == 200 and 'id="job-parent"' in child.body and f"/job?queue={QUEUE}&amp;id=report" in child.body
        nursery.cancel_scope.cancel()



async def _enqueue_dependent(storage: FileStorage | MemoryStorage) -> None:
    async with Queue(storage, name=QUEUE) as q:
        await q.enqueue("load", None, delay=3600)
        await q.enqueue("report", None, children=[Child("fetch-a")], depends_on=["load"])


def test_show_lists_what_a_dependent_waits_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job waiting for its dependencies shows them (apart from its children), so that
    ``waiting_children`` says what it waits for."""
    trio.run(_enqueue_dependent, FileStorage(tmp_path / "store"))
    url = f"file://{tmp_path / 'store'}"
    assert main(["show", "report", "--storage", url, "--name", QUEUE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["children"] == [{"queue": QUEUE, "id": "fetch-a", "state": "queued"}]
    assert data["depends_on"] == [{"queue": QUEUE, "id": "load", "state": "delayed"}]
    assert main(["show", "report", "--storage", url, "--name", QUEUE]) == 0
    human = capsys.readouterr().out
    assert "children:   1 queued" in human and "depends on: 1 delayed" in human and f"load ({QUEUE}): delayed" in human
    assert main(["show", "load", "--storage", url, "--name", QUEUE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["depends_on"] is None


async def test_the_job_page_shows_what_a_dependent_waits_for() -> None:
    storage = MemoryStorage()
    await _enqueue_dependent(storage)
    async with trio.open_nursery() as nursery:
        dashboard = Dashboard(storage, port=0, names=[QUEUE])
        [base] = await nursery.start(dashboard.run)
        client = Client(base)
        page = await _in_thread(lambda: client.get(f"/job?queue={QUEUE}&id=report"))
        assert page.status == 200
        children = page.body.split('id="job-children"')[1].split("</table>")[0]
        depends = page.body.split('id="job-depends-on"')[1].split("</table>")[0]
        assert "fetch-a" in children and "load" not in children
        assert "load" in depends and "fetch-a" not in depends
        nursery.cancel_scope.cancel()
