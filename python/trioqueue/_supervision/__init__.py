"""The supervision layer: the :class:`~trioqueue.Queue` and the :class:`~trioqueue.Worker`,
and the parts they build, over a storage.

:mod:`._queue` (the Queue, a producer and admin handle: it delegates to its parts, the
:mod:`._producing` calls and request/response, the :mod:`._flows` job maker and the
:mod:`._registry` reader and admin calls) with its settings (:mod:`._settings`); the
:mod:`._worker` (claims, runs and settles through a :mod:`._consumer` per queue, with the
:mod:`._ledger` of its claims, its :mod:`._leases` keeper and the :mod:`._batch` runner of a
batch handler) and its :mod:`._execution` of one attempt (a sync handler in a thread, or in
the :mod:`._pool` of processes); the event path (:mod:`._listener`: the storage
subscription, opened by need; :mod:`._emitter`: callbacks; :mod:`._streams`;
:mod:`._waiters`: ``enqueue_and_wait`` callers; :mod:`._observers`: instruments); the
:mod:`._reaper` and the :mod:`._scheduler` it runs. Each part gets what it needs at
construction; none reads another's private state.
"""
