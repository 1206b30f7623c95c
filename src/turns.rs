//! The turn pool: a fixed set of worker threads and a bounded FIFO queue of keyed jobs.
//!
//! The caller submits jobs under keys (the server uses the turn's own id), then
//! dispatches them at once, and moves on. Every job submitted ends in exactly one
//! [`Done`], left for [`TurnPool::finished`] and announced by the wake-up callback (the
//! server's wakes its event loop): a worker leaves it when the job ran (or panicked),
//! [`TurnPool::cancel`] when it takes the job out of the queue. Wake-ups are coalesced: none is made while one made since the last
//! [`TurnPool::finished`] is pending, since that call's next one takes every [`Done`]
//! sent before. Likewise a worker is signalled only if one is waiting for work (a busy
//! one looks at the queue before it waits), and one at a time: the one signalled
//! signals the next when it takes a job and more wait. So a batch of quick jobs (echo
//! turns) costs one or two thread wake-ups, not one each, and slow ones still start
//! side by side. The caller never blocks on a job. The pool knows nothing of what a job
//! or a key is.

use crate::protocol::TurnLoad;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

/// Runs one job; shared by every worker. A panic is caught and reported as
/// [`Outcome::Panicked`].
type Runner<J, R> = Arc<dyn Fn(&J) -> R + Send + Sync>;

/// Called after a [`Done`] is left (unless a call is pending), so the caller knows to
/// look.
type Wake = Arc<dyn Fn() + Send + Sync>;

/// How a job ended.
#[derive(Debug)]
pub enum Outcome<R> {
    /// The runner returned.
    Finished(R),
    /// The runner panicked.
    Panicked,
    /// [`TurnPool::cancel`] took the job out of the queue: it never ran.
    Withdrawn,
}

/// A finished job, as the caller receives it.
#[derive(Debug)]
pub struct Done<K, R> {
    /// The key the job was submitted under.
    pub key: K,
    /// What the runner produced.
    pub outcome: Outcome<R>,
}

struct Queue<K, J, R> {
    jobs: VecDeque<(K, J)>,
    /// What [`TurnPool::finished`] takes next.
    done: Vec<Done<K, R>>,
    running: usize,
    /// Workers waiting on `ready` for a job.
    idle: usize,
    /// A worker was signalled and has not woken yet.
    signalled: bool,
    closed: bool,
}

struct Shared<K, J, R> {
    queue: Mutex<Queue<K, J, R>>,
    ready: Condvar,
    /// A wake-up was made that no [`TurnPool::finished`] has answered yet.
    wake_pending: AtomicBool,
}

impl<K, J, R> Shared<K, J, R> {
    fn lock(&self) -> MutexGuard<'_, Queue<K, J, R>> {
        // A worker never panics while holding the lock (runner panics are caught
        // outside it), so a poisoned lock still holds consistent data.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes a waiting worker for the jobs in `queue`, unless one is already on its way.
    fn signal(&self, mut queue: MutexGuard<'_, Queue<K, J, R>>) {
        let signal = !queue.jobs.is_empty() && queue.idle > 0 && !queue.signalled;
        queue.signalled |= signal;
        drop(queue);
        if signal {
            self.ready.notify_one();
        }
    }
}

/// The pool. Dropping it closes it (see [`TurnPool::close`]) and, if no job is running,
/// waits for its workers to exit; a worker still running a job exits after it.
pub struct TurnPool<K, J, R> {
    shared: Arc<Shared<K, J, R>>,
    wake: Wake,
    workers: Vec<JoinHandle<()>>,
    max_concurrent: usize,
    max_queued: usize,
}

/// The queue is full (or closed); the server answers 503 `server_busy`.
#[derive(Debug)]
pub struct Busy<J>(pub J);

impl<K, J, R> TurnPool<K, J, R>
where
    K: Copy + Eq + Send + 'static,
    J: Send + 'static,
    R: Send + 'static,
{
    /// Starts `max_concurrent` workers (at least one) that run jobs with `runner` and
    /// announce each job's [`Done`] with `wake` (coalesced). `max_queued` jobs may wait
    /// beyond those running. A panicking `runner` is caught and its job reported as
    /// [`Outcome::Panicked`]; the worker goes on.
    ///
    /// # Errors
    /// The OS refused to start a thread.
    pub fn start(
        max_concurrent: usize,
        max_queued: usize,
        runner: impl Fn(&J) -> R + Send + Sync + 'static,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<TurnPool<K, J, R>> {
        let runner: Runner<J, R> = Arc::new(runner);
        let wake: Wake = Arc::new(wake);
        let max_concurrent = max_concurrent.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                done: Vec::new(),
                running: 0,
                idle: 0,
                signalled: false,
                closed: false,
            }),
            ready: Condvar::new(),
            wake_pending: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(max_concurrent);
        for index in 0..max_concurrent {
            let shared = Arc::clone(&shared);
            let runner = Arc::clone(&runner);
            let wake = Arc::clone(&wake);
            let handle = thread::Builder::new()
                .name(format!("turn-{index}"))
                .spawn(move || worker(&shared, runner.as_ref(), wake.as_ref()))?;
            workers.push(handle);
        }
        Ok(TurnPool {
            shared,
            wake,
            workers,
            max_concurrent,
            max_queued,
        })
    }

    /// Queues `job` under `key` unless `max_concurrent + max_queued` jobs are already
    /// admitted (running or waiting). It starts at the next [`TurnPool::dispatch`] (or
    /// when a busy worker looks at the queue).
    ///
    /// # Errors
    /// [`Busy`] (with the job handed back) when the queue is full or the pool is closed.
    pub fn submit(&self, key: K, job: J) -> Result<(), Busy<J>> {
        let mut queue = self.shared.lock();
        if queue.closed || queue.jobs.len() + queue.running >= self.max_concurrent + self.max_queued
        {
            return Err(Busy(job));
        }
        queue.jobs.push_back((key, job));
        Ok(())
    }

    /// Wakes a worker for the jobs waiting, if none is on its way. Called once after a
    /// batch of submits (the server does, before its loop polls again).
    pub fn dispatch(&self) {
        self.shared.signal(self.shared.lock());
    }

    /// Finished jobs, without blocking. A [`Done`] left after this call is announced by
    /// a new wake-up.
    pub fn finished(&self) -> impl Iterator<Item = Done<K, R>> {
        // Cleared before the results are taken: a Done left before a wake-up that found
        // it set is taken here (it was left before that wake-up, so before this call).
        self.shared.wake_pending.store(false, Ordering::SeqCst);
        std::mem::take(&mut self.shared.lock().done).into_iter()
    }

    /// Takes the job submitted under `key` out of the queue if it is still waiting, so
    /// it never runs: its [`Done`] ([`Outcome::Withdrawn`]) is left and the wake-up
    /// called, as for a job that ran. Whether it was waiting (false: it is running or
    /// done, and its own [`Done`] comes or came).
    pub fn cancel(&self, key: K) -> bool {
        let mut queue = self.shared.lock();
        let Some(index) = queue.jobs.iter().position(|(k, _)| *k == key) else {
            return false;
        };
        queue.jobs.remove(index);
        let outcome = Outcome::Withdrawn;
        queue.done.push(Done { key, outcome });
        drop(queue);
        wake_once(&self.shared, self.wake.as_ref());
        true
    }

    /// Whether the job submitted under `key` still waits for a worker.
    pub fn is_queued(&self, key: K) -> bool {
        self.shared.lock().jobs.iter().any(|(k, _)| *k == key)
    }

    /// Current counters, as `/api/health` reports them.
    pub fn load(&self) -> TurnLoad {
        let queue = self.shared.lock();
        TurnLoad {
            running: queue.running,
            queued: queue.jobs.len(),
            max: self.max_concurrent,
        }
    }

    /// Closes the queue: no job is admitted any more, and the jobs still waiting are
    /// handed back with their keys (the server answers them `server_busy`). Running
    /// jobs go on; workers exit once their job is done.
    pub fn close(&self) -> Vec<(K, J)> {
        let mut queue = self.shared.lock();
        queue.closed = true;
        let waiting = queue.jobs.drain(..).collect();
        drop(queue);
        self.shared.ready.notify_all();
        waiting
    }

    /// Whether no job is running and none is waiting. A job counts as running until
    /// its [`Done`] is left, so once this holds every result is in
    /// [`TurnPool::finished`]. It says nothing about the worker threads: before
    /// [`TurnPool::close`] they stay alive, waiting for work; after it, they exit
    /// without taking another job.
    pub fn is_idle(&self) -> bool {
        let queue = self.shared.lock();
        queue.running == 0 && queue.jobs.is_empty()
    }
}

impl<K, J, R> Drop for TurnPool<K, J, R> {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.closed = true;
        queue.jobs.clear();
        let idle = queue.running == 0;
        drop(queue);
        self.shared.ready.notify_all();
        // Joined only when no job runs, so that dropping never blocks on an engine.
        if idle {
            for worker in self.workers.drain(..) {
                let _ = worker.join();
            }
        }
    }
}

fn worker<K, J, R>(
    shared: &Shared<K, J, R>,
    runner: &(dyn Fn(&J) -> R + Send + Sync),
    wake: &(dyn Fn() + Send + Sync),
) {
    loop {
        let mut queue = shared.lock();
        let (key, job) = loop {
            if let Some(next) = queue.jobs.pop_front() {
                break next;
            }
            if queue.closed {
                return;
            }
            queue.idle += 1;
            queue = shared
                .ready
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
            queue.idle -= 1;
            queue.signalled = false;
        };
        queue.running += 1;
        shared.signal(queue);
        let outcome = match panic::catch_unwind(AssertUnwindSafe(|| runner(&job))) {
            Ok(result) => Outcome::Finished(result),
            Err(_) => Outcome::Panicked,
        };
        // Left and counted out at once, so the caller never sees a job that is neither
        // running nor finished; woken after, so that a caller woken for this result
        // already sees the pool idle if this was the last job. A dropped pool is closed:
        // the worker exits at the top of the loop.
        let mut queue = shared.lock();
        queue.done.push(Done { key, outcome });
        queue.running -= 1;
        drop(queue);
        wake_once(shared, wake);
    }
}

/// Calls `wake` unless a wake-up is already pending (see [`TurnPool::finished`]).
fn wake_once<K, J, R>(shared: &Shared<K, J, R>, wake: &(dyn Fn() + Send + Sync)) {
    if !shared.wake_pending.swap(true, Ordering::SeqCst) {
        wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{self, Receiver};
    use std::time::Duration;

    /// A runner that waits for its gate to open, doubles its job, and panics on 13.
    struct Slow {
        started: AtomicUsize,
        gate: Mutex<bool>,
        open: Condvar,
    }

    impl Slow {
        fn new() -> Arc<Slow> {
            Arc::new(Slow {
                started: AtomicUsize::new(0),
                gate: Mutex::new(false),
                open: Condvar::new(),
            })
        }

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

        fn open(&self) {
            *self.gate.lock().unwrap() = true;
            self.open.notify_all();
        }

        fn wait_started(&self, n: usize) {
            while self.started.load(Ordering::SeqCst) < n {
                thread::sleep(Duration::from_millis(5));
            }
        }
    }

    /// A pool of `Slow` runners whose wake-ups arrive on the returned channel.
    fn pool(
        max_concurrent: usize,
        max_queued: usize,
    ) -> (TurnPool<u64, u32, u32>, Arc<Slow>, Receiver<()>) {
        let runner = Slow::new();
        let slow = Arc::clone(&runner);
        let (wake_tx, wake_rx) = mpsc::channel();
        let wake_tx = Mutex::new(wake_tx);
        let pool = TurnPool::start(
            max_concurrent,
            max_queued,
            move |job: &u32| slow.run(job),
            move || {
                let _ = wake_tx.lock().unwrap().send(());
            },
        )
        .unwrap();
        (pool, runner, wake_rx)
    }

    #[test]
    fn bounded_queue_fifo_and_panics() {
        let (pool, runner, wakes) = pool(2, 2);
        for (key, job) in [(0, 1), (1, 2), (2, 13), (3, 4)] {
            pool.submit(key, job).unwrap();
        }
        // One dispatch starts both workers: the first one signals the second.
        pool.dispatch();
        // 2 running + 2 queued: the fifth is refused.
        let Busy(job) = pool.submit(9, 5).unwrap_err();
        assert_eq!(job, 5);
        runner.wait_started(2);
        assert_eq!(
            pool.load(),
            TurnLoad {
                running: 2,
                queued: 2,
                max: 2
            }
        );
        runner.open();
        let mut done = Vec::new();
        while done.len() < 4 {
            // Every result is announced by a wake-up (one for all sent before it).
            wakes.recv_timeout(Duration::from_secs(10)).unwrap();
            done.extend(pool.finished());
        }
        let panicked: Vec<u64> = done
            .iter()
            .filter(|d| matches!(d.outcome, Outcome::Panicked))
            .map(|d| d.key)
            .collect();
        assert_eq!(panicked, vec![2], "the job 13 was submitted under key 2");
        let mut results: Vec<(u64, u32)> = done
            .iter()
            .filter_map(|d| match d.outcome {
                Outcome::Finished(r) => Some((d.key, r)),
                Outcome::Panicked | Outcome::Withdrawn => None,
            })
            .collect();
        results.sort_unstable();
        assert_eq!(results, vec![(0, 2), (1, 4), (3, 8)]);
        assert!(pool.is_idle());
        assert!(pool.close().is_empty());
        assert!(pool.submit(10, 1).is_err());
    }

    #[test]
    fn close_hands_back_queued_jobs() {
        let (pool, runner, _wakes) = pool(1, 3);
        for key in 0..3 {
            pool.submit(key, key as u32 + 100).unwrap();
        }
        pool.dispatch();
        runner.wait_started(1);
        assert!(!pool.is_idle());
        assert_eq!(pool.close(), vec![(1, 101), (2, 102)]);
        runner.open();
        while !pool.is_idle() {
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn cancel_takes_only_a_waiting_job_and_reports_it() {
        let (pool, runner, wakes) = pool(1, 2);
        pool.submit(7, 1).unwrap();
        pool.dispatch();
        runner.wait_started(1);
        pool.submit(8, 2).unwrap();
        assert!(pool.is_queued(8));
        // 7 is running: too late to cancel. 8 waits: it is taken out and never runs,
        // and its Done comes like any other, announced by a wake-up.
        assert!(!pool.cancel(7));
        assert!(pool.cancel(8));
        assert!(!pool.cancel(8));
        assert!(!pool.is_queued(8));
        assert_eq!(pool.load().queued, 0);
        wakes.recv_timeout(Duration::from_secs(10)).unwrap();
        let withdrawn: Vec<u64> = pool.finished().map(|d| d.key).collect();
        assert_eq!(withdrawn, vec![8]);
        runner.open();
        while !pool.is_idle() {
            thread::sleep(Duration::from_millis(5));
        }
        let done: Vec<(u64, bool)> = pool
            .finished()
            .map(|d| (d.key, matches!(d.outcome, Outcome::Finished(2))))
            .collect();
        assert_eq!(done, vec![(7, true)]);
        assert!(pool.close().is_empty());
    }

    /// Results sent while a wake-up is pending share it; the next `finished` takes them
    /// all, and a result after that call is announced by a wake-up of its own.
    #[test]
    fn wake_ups_are_coalesced_and_none_is_lost() {
        let (pool, runner, wakes) = pool(1, 3);
        for key in 0..3 {
            pool.submit(key, 1).unwrap();
        }
        pool.dispatch();
        runner.open();
        wakes.recv_timeout(Duration::from_secs(10)).unwrap();
        while !pool.is_idle() {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(wakes.try_recv().is_err(), "one wake-up for three results");
        assert_eq!(pool.finished().count(), 3);
        pool.submit(3, 1).unwrap();
        pool.dispatch();
        wakes.recv_timeout(Duration::from_secs(10)).unwrap();
        let done: Vec<u64> = pool.finished().map(|d| d.key).collect();
        assert_eq!(done, vec![3]);
    }

    /// A submitted job waits for `dispatch` (when no worker is busy), and one dispatch
    /// starts a whole batch of slow jobs side by side: each worker woken signals the next.
    #[test]
    fn one_dispatch_starts_a_batch_side_by_side() {
        let (pool, runner, wakes) = pool(3, 0);
        while pool.shared.lock().idle < 3 {
            thread::sleep(Duration::from_millis(5));
        }
        for key in 0..3 {
            pool.submit(key, 1).unwrap();
        }
        thread::sleep(Duration::from_millis(50));
        assert_eq!(
            runner.started.load(Ordering::SeqCst),
            0,
            "not dispatched yet"
        );
        pool.dispatch();
        runner.wait_started(3);
        runner.open();
        let mut done = 0;
        while done < 3 {
            wakes.recv_timeout(Duration::from_secs(10)).unwrap();
            done += pool.finished().count();
        }
    }

    /// An idle pool dropped without `close` (an `Instance` dropped without `run`)
    /// stops its workers: each held a clone of the runner, released as it exits.
    #[test]
    fn dropping_an_idle_pool_stops_its_workers() {
        let (pool, runner, _wakes) = pool(3, 1);
        assert_eq!(Arc::strong_count(&runner), 2, "the test's and the runner's");
        drop(pool);
        assert_eq!(Arc::strong_count(&runner), 1);
    }
}
