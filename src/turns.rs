//! The turn pool: a fixed set of worker threads and a bounded FIFO queue.
//!
//! The event loop submits a job and moves on; a worker runs it and sends the
//! [`Done`] back through a channel, then wakes the loop with its [`mio::Waker`], so the
//! loop never blocks on a turn and `/api/health` answers while turns run.

use crate::http::ConnId;
use mio::Waker;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

/// Runs one job; shared by every worker.
pub trait Runner<J, R>: Send + Sync + 'static {
    /// Runs `job` to completion. A panic is caught and reported as [`Outcome::Panicked`].
    fn run(&self, job: &J) -> R;
}

/// How a job ended.
#[derive(Debug)]
pub enum Outcome<R> {
    /// The runner returned.
    Finished(R),
    /// The runner panicked.
    Panicked,
}

/// A finished job, as the loop receives it.
#[derive(Debug)]
pub struct Done<J, R> {
    /// Which connection waits for it.
    pub conn: ConnId,
    /// The job itself, handed back.
    pub job: J,
    /// What the runner produced.
    pub outcome: Outcome<R>,
}

/// Counters for `/api/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Load {
    /// Jobs being run now.
    pub running: usize,
    /// Jobs waiting for a worker.
    pub queued: usize,
    /// Worker count.
    pub max: usize,
}

struct Queue<J> {
    jobs: VecDeque<(ConnId, J)>,
    running: usize,
    closed: bool,
}

struct Shared<J> {
    queue: Mutex<Queue<J>>,
    ready: Condvar,
}

impl<J> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, Queue<J>> {
        // A worker never panics while holding the lock (runner panics are caught
        // outside it), so a poisoned lock still holds consistent data.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The pool. Dropping it does not stop the workers; call [`TurnPool::close`].
pub struct TurnPool<J, R> {
    shared: Arc<Shared<J>>,
    done_rx: Receiver<Done<J, R>>,
    workers: Vec<JoinHandle<()>>,
    max_concurrent: usize,
    max_queued: usize,
}

/// The queue is full; the loop answers 503 `server_busy`.
#[derive(Debug)]
pub struct Busy<J>(pub J);

impl<J: Send + 'static, R: Send + 'static> TurnPool<J, R> {
    /// Starts `max_concurrent` workers (at least one) that run jobs with `runner`.
    ///
    /// # Errors
    /// The OS refused to start a thread.
    pub fn start(
        max_concurrent: usize,
        max_queued: usize,
        runner: Arc<dyn Runner<J, R>>,
        waker: Arc<Waker>,
    ) -> std::io::Result<TurnPool<J, R>> {
        let max_concurrent = max_concurrent.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                running: 0,
                closed: false,
            }),
            ready: Condvar::new(),
        });
        let (done_tx, done_rx) = mpsc::channel();
        let mut workers = Vec::with_capacity(max_concurrent);
        for index in 0..max_concurrent {
            let shared = Arc::clone(&shared);
            let runner = Arc::clone(&runner);
            let waker = Arc::clone(&waker);
            let done_tx: Sender<Done<J, R>> = done_tx.clone();
            let handle = thread::Builder::new()
                .name(format!("turn-{index}"))
                .spawn(move || worker(&shared, runner.as_ref(), &waker, &done_tx))?;
            workers.push(handle);
        }
        Ok(TurnPool {
            shared,
            done_rx,
            workers,
            max_concurrent,
            max_queued,
        })
    }

    /// Queues a job unless `max_concurrent + max_queued` jobs are already admitted.
    ///
    /// # Errors
    /// [`Busy`] (with the job handed back) when the queue is full or the pool is closed.
    pub fn submit(&self, conn: ConnId, job: J) -> Result<(), Busy<J>> {
        let mut queue = self.shared.lock();
        if queue.closed || queue.jobs.len() + queue.running >= self.max_concurrent + self.max_queued
        {
            return Err(Busy(job));
        }
        queue.jobs.push_back((conn, job));
        drop(queue);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Finished jobs, without blocking.
    pub fn finished(&self) -> impl Iterator<Item = Done<J, R>> + '_ {
        self.done_rx.try_iter()
    }

    /// Takes a job that is still waiting (its caller went away) out of the queue, so
    /// it never runs. `None` if it is already running or done.
    pub fn cancel(&self, conn: ConnId) -> Option<J> {
        let mut queue = self.shared.lock();
        let index = queue.jobs.iter().position(|(c, _)| *c == conn)?;
        queue.jobs.remove(index).map(|(_, job)| job)
    }

    /// Current counters.
    pub fn load(&self) -> Load {
        let queue = self.shared.lock();
        Load {
            running: queue.running,
            queued: queue.jobs.len(),
            max: self.max_concurrent,
        }
    }

    /// Closes the queue: no job is admitted any more, and the jobs still waiting are
    /// handed back (the loop answers them `server_busy`). Running jobs go on; workers
    /// exit once their job is done.
    pub fn close(&self) -> Vec<(ConnId, J)> {
        let mut queue = self.shared.lock();
        queue.closed = true;
        let waiting = queue.jobs.drain(..).collect();
        drop(queue);
        self.shared.ready.notify_all();
        waiting
    }

    /// Whether every worker has exited (only after [`TurnPool::close`]).
    pub fn is_idle(&self) -> bool {
        let queue = self.shared.lock();
        queue.running == 0 && queue.jobs.is_empty()
    }

    /// Waits for the workers to exit. Call after [`TurnPool::close`] once
    /// [`TurnPool::is_idle`] holds, or the join blocks until running jobs end.
    pub fn join(self) {
        for worker in self.workers {
            let _ = worker.join();
        }
    }
}

fn worker<J: 'static, R: 'static>(
    shared: &Shared<J>,
    runner: &dyn Runner<J, R>,
    waker: &Waker,
    done_tx: &Sender<Done<J, R>>,
) {
    loop {
        let mut queue = shared.lock();
        let (conn, job) = loop {
            if let Some(next) = queue.jobs.pop_front() {
                break next;
            }
            if queue.closed {
                return;
            }
            queue = shared
                .ready
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        };
        queue.running += 1;
        drop(queue);
        let outcome = match panic::catch_unwind(AssertUnwindSafe(|| runner.run(&job))) {
            Ok(result) => Outcome::Finished(result),
            Err(_) => Outcome::Panicked,
        };
        // Send before decrementing `running`, so the loop never sees a job that is
        // neither running nor finished.
        let sent = done_tx.send(Done { conn, job, outcome });
        let _ = waker.wake();
        shared.lock().running -= 1;
        if sent.is_err() {
            return; // the pool is gone
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll, Token};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    struct Slow {
        started: AtomicUsize,
        gate: Mutex<bool>,
        open: Condvar,
    }

    impl Runner<u32, u32> for Slow {
        fn run(&self, job: &u32) -> u32 {
            self.started.fetch_add(1, Ordering::SeqCst);
            let mut open = self.gate.lock().unwrap();
            while !*open {
                open = self.open.wait(open).unwrap();
            }
            drop(open);
            if *job == 13 {
                panic!("unlucky job");
            }
            job * 2
        }
    }

    fn conn(n: u64) -> ConnId {
        // ConnId's fields are private to http; tests get distinct ids this way.
        crate::http::test_conn_id(n)
    }

    #[test]
    fn bounded_queue_fifo_and_panics() {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let runner = Arc::new(Slow {
            started: AtomicUsize::new(0),
            gate: Mutex::new(false),
            open: Condvar::new(),
        });
        let pool: TurnPool<u32, u32> = TurnPool::start(2, 2, runner.clone(), waker).unwrap();
        for i in 0..4 {
            pool.submit(conn(i), [1, 2, 13, 4][i as usize]).unwrap();
        }
        // 2 running + 2 queued: the fifth is refused.
        let Busy(job) = pool.submit(conn(9), 5).unwrap_err();
        assert_eq!(job, 5);
        while runner.started.load(Ordering::SeqCst) < 2 {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            pool.load(),
            Load {
                running: 2,
                queued: 2,
                max: 2
            }
        );
        *runner.gate.lock().unwrap() = true;
        runner.open.notify_all();
        let mut done = Vec::new();
        let mut events = Events::with_capacity(8);
        let mut poll = poll;
        while done.len() < 4 {
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .unwrap();
            done.extend(pool.finished());
        }
        let panicked: Vec<u32> = done
            .iter()
            .filter(|d| matches!(d.outcome, Outcome::Panicked))
            .map(|d| d.job)
            .collect();
        assert_eq!(panicked, vec![13]);
        let mut results: Vec<u32> = done
            .iter()
            .filter_map(|d| match d.outcome {
                Outcome::Finished(r) => Some(r),
                Outcome::Panicked => None,
            })
            .collect();
        results.sort_unstable();
        assert_eq!(results, vec![2, 4, 8]);
        assert!(pool.close().is_empty());
        assert!(pool.submit(conn(10), 1).is_err());
        pool.join();
    }

    #[test]
    fn close_hands_back_queued_jobs() {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let runner = Arc::new(Slow {
            started: AtomicUsize::new(0),
            gate: Mutex::new(false),
            open: Condvar::new(),
        });
        let pool: TurnPool<u32, u32> = TurnPool::start(1, 3, runner.clone(), waker).unwrap();
        for i in 0..3 {
            pool.submit(conn(i), i as u32).unwrap();
        }
        while runner.started.load(Ordering::SeqCst) < 1 {
            thread::sleep(Duration::from_millis(5));
        }
        let handed_back: Vec<u32> = pool.close().into_iter().map(|(_, j)| j).collect();
        assert_eq!(handed_back, vec![1, 2]);
        *runner.gate.lock().unwrap() = true;
        runner.open.notify_all();
        while !pool.is_idle() {
            thread::sleep(Duration::from_millis(5));
        }
        pool.join();
    }
}
