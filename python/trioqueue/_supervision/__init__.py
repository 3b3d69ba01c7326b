"""The supervision layer: the :class:`~trioqueue.Queue` and its parts, over a storage.

:mod:`._queue` (the Queue: producer API, request/response, the run) with its registry
and administration calls (:mod:`._registry`); the worker (:mod:`._consumer`, which
claims, runs and settles in batches) and its :mod:`._execution` of one attempt (a sync
handler in a thread, or in the :mod:`._pool` of processes); the
event path (:mod:`._listener`: the storage subscription, opened by need; :mod:`._emitter`:
callbacks; :mod:`._streams`; :mod:`._waiters`: ``enqueue_and_wait`` callers;
:mod:`._observers`: instruments); the :mod:`._reaper` and the :mod:`._scheduler` it runs.
Each part gets what it needs at construction; none reads another's private state.
"""
