"""FileStorage: a persistent, single-node backend on a plain directory, without a server.

Layout (every queue name, job id and worker id is encoded with
:func:`~trioqueue.storage.file._fsutil.encode_name`: never a raw file name)::

    <directory>/
      locks/                  leader locks: one JSON file per lock name, ``.flock`` guards them
      q/<queue>/
        lock                  flock(2) of the queue's critical sections; holds the two
                              sequence counters (next FIFO number, next front number) and,
                              after them, the generation (see "Caches" below)
        tmp/                  temp names: segments being written, re-points in progress
                              (``.tmp-<pid>-*``; a small directory is cheaper to add to),
                              and empty files made ahead for segments (``.spare-<pid>-*``)
        events                append-only event log (JSON lines), rotated when large
        jobs/<id>             the job registry: a hard link to the segment holding the
                              job's current record (state, attempts, lease, TTLs, envelope,
                              result/error); re-pointed atomically (link to temp + rename)
        ready/<seq>-<id>      the ready list, FIFO by the 16-hex-digit sequence number
                              (released jobs get numbers below all others): the lane of
                              the default priority (5); ``ready/p<n>/<seq>-<id>`` are the
                              lanes of the other priorities (0 first); a claim lists them
                              in order, each listing cached until it is used up
        proc/<worker>/<id>    a worker's processing list (the lease is in the record)
        delayed/<ms>-<id>     retries waiting until ``ms``
        expiry/<ms>-s<seg>    a link to a segment with expiring records; ``ms`` is the
                              earliest expiry still to handle (the cleaner's index)
        workers/<worker>      heartbeat files; mtime is the expiry
        names/<worker>        original id of a hashed (very long) worker name
        quarantine/           unreadable files moved aside

**Segments.** Creating an inode costs ~0.5 ms here while a link or rename costs ~20 us, so
no step creates an inode per job: each batch (an enqueue call, or the concurrent enqueue
calls of one Trio run coalesced into one group; a claim; a settlement; a heartbeat; a
reaper pass...) writes *one* segment file holding all its records, with an index by
encoded id and a CRC (see ``_fsutil``), and every name of a job is a hard link to a
segment: ``jobs/<id>``, and the markers in ``ready/``, ``delayed/`` and ``proc/`` (their
content is never read: only their names count). A segment is never written after its first
link, so readers (other processes too, without the lock) only ever see complete data;
processes cache parsed segments by their random id. The file system frees a segment when
its last link goes: no garbage collection.

**Data before names.** Every step flushes a new segment's data (``fdatasync``, in its
locked section) before any name links to it: a flush of ``jobs/`` made later by any step commits the file
system's journal, names included, and a name must never survive a power cut without the
data it names (``tests/backends/file/test_file_power_loss.py`` checks every crash state
of a run). Acknowledged steps (enqueues, settlements...) then flush the directory of the
names that must survive (``jobs/``) before they return.

**Write order** (all under the queue's ``flock``; the temp names are ``tmp/.tmp-<pid>-*``
(``jobs/.tmp-*`` in the older layout), removed at start when their process is dead):

- enqueue: segment (temp name) -> ``jobs/<id>`` links -> ``ready/`` links -> temp name
  unlinked -> counters. An id this process has no record of is linked without reading
  ``jobs/<id>`` first: if the link finds one, it is read then (a duplicate, or replaced
  if cancelled or expired), and its record in the segment stays unlinked. The segment's data is flushed before the first link; the group commit fsyncs
  ``jobs/`` and ``ready/`` before the call returns (acknowledged = on disk). Crash before
  a ``jobs/`` link: the job does not exist (it was not acknowledged). After it but before
  its ``ready/`` link: start-up repair re-links the marker under its original name.
- claim: ``rename(ready/<seq>-<id>, proc/<worker>/<id>)`` *is* the claim (atomic, so two
  consumers never both get a job); then one segment of processing records (attempts + 1,
  worker, lease) re-points ``jobs/<id>``. Crash between: the record still says queued with
  its old marker name: ``recover_stalled`` renames the entry back to ``ready/`` (the
  attempt did not happen).
- settle: segment -> ``expiry/`` link -> ``jobs/<id>`` re-pointed -> ``delayed/`` links of
  retries -> events -> proc entries unlinked; group commit (segment, ``jobs/``,
  ``delayed/``, ``expiry/``). Crash before a re-point: the job is still processing and the
  reaper recovers it (the settlement was not acknowledged). After it: the reaper finds the
  proc entry of a settled record, writes the settlement's event again (``completed``,
  ``failed``, ``cancelled``, ``failing``, ``rate_limited``: a waiter of
  ``enqueue_and_wait`` never misses its job's end) and drops the entry; a failing record
  without its ``delayed/`` link gets it back at start. A crash after the events but
  before the unlinks announces the settlement twice (events are at-least-once). The
  reaper and ``start`` (cancelled claims) also write their events before dropping proc
  entries.
- release / reaper requeue / retry promotion: the records are re-pointed first (queued,
  naming their new ready marker), then the marker is renamed into ``ready/``. Crash
  between: a queued record whose entry is still in ``proc/`` is moved back by the reaper
  ("claim interrupted"); one whose ``delayed/`` entry was not moved is restored at start.
- heartbeat: one segment with the extended leases re-points the running jobs' records.

**Caches** (per process, per queue; all validated under the lock). Every locked section
that changes records or ready markers first bumps the *generation*, a counter in the
``lock`` file after the two sequence counters; each section starts by reading the
counters and the generation, and a generation other than the one this process left means
another process wrote: the caches below are dropped. This process maps those 24 bytes
(``mmap``): no system call, and no inotify ``IN_MODIFY`` waking the event subscribers
(who watch the queue directory) at every claim; the older code's ``pread``/``pwrite`` of
the counters see the same page cache.

- The record cache holds copies of the (non-terminal) records this process wrote itself,
  at most 32768 records / 16 MiB. A hit is used only if ``jobs/<id>`` still names the
  segment the record was written to (same inode, size and mtime: one ``stat`` instead of
  open/read/parse), and handed out as a copy (callers mutate what they get).
- Lanes of the ready list (and ``delayed/``) a claim found empty are not listed again
  until the generation moves, this process adds a marker there, a blocked ``dequeue`` is
  woken by inotify, or 50 ms pass.

Processes of the code before the generation existed (a rolling upgrade) bump none: their
record changes re-point ``jobs/<id>`` to a new segment, which the inode/size/mtime check
sees (the new segment exists before the old one can be freed, so it cannot take the old
one's inode while the cache entry names it, unless the job is re-pointed twice more
with the inode reused and size and mtime equal: treat mixed versions as a short upgrade
window); their new markers are seen within 50 ms, or at once by a blocked ``dequeue``.
They read the first 16 bytes of ``lock`` and never look into ``tmp/``.

Corrupt segments (bad magic/CRC/index) are quarantined name by name as they are met,
with an ``error`` event; a damaged segment affects every job whose current record is in
it. Blocking ``dequeue`` and ``subscribe`` wake on inotify notifications, with a slow
re-scan as a safety net. No ``syncfs``: only the group's few segment files and the touched
directories are flushed.

FileStorage needs Linux: its blocking calls wait on inotify. Elsewhere importing it raises
an ImportError that says so (MemoryStorage, RedisStorage and PostgresStorage run there).
"""

import sys

if sys.platform != "linux":
    raise ImportError(
        f"FileStorage needs Linux (it waits on inotify), not {sys.platform}: "
        "use MemoryStorage, RedisStorage or PostgresStorage here"
    )

from ._storage import FileStorage

__all__ = ["FileStorage"]
