//! Lock-free multi-producer multi-consumer FIFO (no Python dependency).
//!
//! A thin wrapper around [`crossbeam_queue::SegQueue`] adding batch
//! operations.

use crossbeam_queue::SegQueue;

/// Unbounded lock-free MPMC FIFO queue.
#[derive(Debug)]
pub struct Mpmc<T> {
    queue: SegQueue<T>,
}

impl<T> Default for Mpmc<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Mpmc<T> {
    pub const fn new() -> Self {
        Mpmc {
            queue: SegQueue::new(),
        }
    }

    /// Appends one item.
    #[inline]
    pub fn push(&self, item: T) {
        self.queue.push(item);
    }

    /// Appends every item of `items`, in order. Items pushed concurrently by
    /// other producers may interleave with them.
    #[inline]
    pub fn push_many<I: IntoIterator<Item = T>>(&self, items: I) {
        for item in items {
            self.queue.push(item);
        }
    }

    /// Removes the oldest item, if any.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        self.queue.pop()
    }

    /// Removes up to `n` items, oldest first.
    pub fn pop_many(&self, n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(n.min(self.queue.len()));
        self.pop_many_into(n, &mut out);
        out
    }

    /// Removes up to `n` items, oldest first, appending them to `out`;
    /// returns how many were moved.
    #[inline]
    pub fn pop_many_into(&self, n: usize, out: &mut Vec<T>) -> usize {
        let mut moved = 0;
        while moved < n {
            match self.queue.pop() {
                Some(item) => {
                    out.push(item);
                    moved += 1;
                }
                None => break,
            }
        }
        moved
    }

    /// Number of items (a snapshot when other threads are active).
    #[inline]
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn fifo_single_thread() {
        let q = Mpmc::new();
        assert!(q.is_empty());
        assert_eq!(q.pop(), None);
        q.push(1);
        q.push_many([2, 3, 4]);
        assert_eq!(q.len(), 4);
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop_many(2), vec![2, 3]);
        assert_eq!(q.pop_many(10), vec![4]);
        assert_eq!(q.pop_many(10), Vec::<i32>::new());
        assert_eq!(q.pop_many(0), Vec::<i32>::new());
        assert!(q.is_empty());
    }

    #[test]
    fn stress_4x4_nothing_lost_or_duplicated() {
        const PRODUCERS: usize = 4;
        const CONSUMERS: usize = 4;
        const PER_PRODUCER: usize = 25_000;
        const TOTAL: usize = PRODUCERS * PER_PRODUCER;

        let q = Arc::new(Mpmc::new());
        let taken = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let base = p * PER_PRODUCER;
                    let mut i = 0;
                    while i < PER_PRODUCER {
                        if i % 3 == 0 {
                            let end = (i + 7).min(PER_PRODUCER);
                            q.push_many((i..end).map(|k| base + k));
                            i = end;
                        } else {
                            q.push(base + i);
                            i += 1;
                        }
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|c| {
                let q = Arc::clone(&q);
                let taken = Arc::clone(&taken);
                thread::spawn(move || {
                    let mut got = Vec::new();
                    // Per-producer order must be preserved as seen by one consumer.
                    let mut last = [None::<usize>; PRODUCERS];
                    while taken.load(Ordering::Relaxed) < TOTAL {
                        let batch = if c % 2 == 0 {
                            q.pop().into_iter().collect()
                        } else {
                            q.pop_many(16)
                        };
                        if batch.is_empty() {
                            thread::yield_now();
                            continue;
                        }
                        taken.fetch_add(batch.len(), Ordering::Relaxed);
                        for v in batch {
                            let slot = last.get_mut(v / PER_PRODUCER).map(|s| s.replace(v));
                            if let Some(Some(prev)) = slot {
                                assert!(prev < v, "FIFO violated: {prev} then {v}");
                            }
                            got.push(v);
                        }
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap_or_else(|_| panic!("producer panicked"));
        }
        let mut all: Vec<usize> = Vec::with_capacity(TOTAL);
        for c in consumers {
            all.extend(c.join().unwrap_or_else(|_| panic!("consumer panicked")));
        }
        assert_eq!(all.len(), TOTAL);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), TOTAL, "duplicates seen");
        assert!(all.iter().enumerate().all(|(i, &v)| i == v), "items lost");
        assert!(q.is_empty());
    }
}
