//! The handles of `loopbus mcp` (contract 10): a delegation that outlives its call's
//! `waitSecs`, or whose answer is longer than one page, is named by a handle that
//! `result` and `cancel` take. Pure: no I/O, no clock of its own (every method takes
//! `now`), tested with plain values.
//!
//! A handle is pending while its work runs and finished from the moment its answer is
//! in. Pending handles are bounded by count ([`MAX_PENDING`]): one more is refused,
//! never an older one dropped, since dropping one would lose a running delegation.
//! Finished ones are kept [`FINISHED_TTL`], and at most [`MAX_FINISHED`] of them
//! holding at most [`MAX_FINISHED_BYTES`]; past either bound the oldest answer goes
//! first. Handles live in memory: they die with the process.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Most handles whose work still runs.
pub const MAX_PENDING: usize = 64;
/// How long a finished answer stays available to `result`.
pub const FINISHED_TTL: Duration = Duration::from_secs(10 * 60);
/// Most finished answers kept.
pub const MAX_FINISHED: usize = 64;
/// Most bytes of finished answers kept (as the caller counts them).
pub const MAX_FINISHED_BYTES: usize = 32 << 20;

/// One handle's entry.
struct Entry<T> {
    value: T,
    /// When the answer came in, and its size; `None` while the work runs.
    finished: Option<(Instant, usize)>,
}

/// The handles of one process, each holding a `T` (the work it names).
pub struct Handles<T> {
    entries: HashMap<String, Entry<T>>,
    /// The process is exiting: no handle is added any more.
    closed: bool,
}

/// Why a handle was not added.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// [`MAX_PENDING`] handles are pending already.
    Full,
    /// The handle is in use (a random handle collided: never in practice).
    Taken,
    /// [`Handles::close`] was called.
    Closed,
}

impl<T> Handles<T> {
    /// No handles.
    pub fn new() -> Handles<T> {
        Handles {
            entries: HashMap::new(),
            closed: false,
        }
    }

    /// Refuses every handle from now on (the process is exiting and cancels the work
    /// of the pending ones).
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// Adds `handle`, pending, naming `value`.
    ///
    /// # Errors
    /// [`Refused::Full`] at [`MAX_PENDING`] pending handles; [`Refused::Taken`];
    /// [`Refused::Closed`].
    pub fn add(&mut self, handle: &str, value: T) -> Result<(), Refused> {
        if self.closed {
            return Err(Refused::Closed);
        }
        if self.entries.contains_key(handle) {
            return Err(Refused::Taken);
        }
        if self.pending() >= MAX_PENDING {
            return Err(Refused::Full);
        }
        self.entries.insert(
            handle.to_owned(),
            Entry {
                value,
                finished: None,
            },
        );
        Ok(())
    }

    /// Marks `handle` finished at `now` with an answer of `bytes`, then applies the
    /// bounds on finished answers. An unknown handle (removed meanwhile) is ignored.
    pub fn finish(&mut self, handle: &str, bytes: usize, now: Instant) {
        if let Some(entry) = self.entries.get_mut(handle) {
            entry.finished.get_or_insert((now, bytes));
        }
        self.expire(now);
    }

    /// The value of `handle`, if it is pending or finished less than
    /// [`FINISHED_TTL`] before `now`.
    pub fn get(&mut self, handle: &str, now: Instant) -> Option<&T> {
        self.expire(now);
        self.entries.get(handle).map(|e| &e.value)
    }

    /// Forgets `handle`, returning its value.
    pub fn remove(&mut self, handle: &str) -> Option<T> {
        self.entries.remove(handle).map(|e| e.value)
    }

    /// The values of every pending handle.
    pub fn pending_values(&self) -> impl Iterator<Item = &T> {
        self.entries
            .values()
            .filter(|e| e.finished.is_none())
            .map(|e| &e.value)
    }

    fn pending(&self) -> usize {
        self.pending_values().count()
    }

    /// Drops the finished answers older than [`FINISHED_TTL`], then the oldest ones
    /// while more than [`MAX_FINISHED`] or [`MAX_FINISHED_BYTES`] are kept.
    fn expire(&mut self, now: Instant) {
        self.entries.retain(|_, e| match e.finished {
            Some((at, _)) => now.saturating_duration_since(at) < FINISHED_TTL,
            None => true,
        });
        let mut finished: Vec<(Instant, usize, String)> = self
            .entries
            .iter()
            .filter_map(|(h, e)| e.finished.map(|(at, bytes)| (at, bytes, h.clone())))
            .collect();
        finished.sort();
        let mut count = finished.len();
        let mut bytes: usize = finished.iter().map(|f| f.1).sum();
        for (_, size, handle) in finished {
            if count <= MAX_FINISHED && bytes <= MAX_FINISHED_BYTES {
                break;
            }
            self.entries.remove(&handle);
            count -= 1;
            bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_handles_are_bounded_and_never_evicted() {
        let t0 = Instant::now();
        let mut handles = Handles::new();
        for i in 0..MAX_PENDING {
            handles.add(&format!("h{i}"), i).unwrap();
        }
        assert_eq!(handles.add("more", 0), Err(Refused::Full));
        assert_eq!(handles.add("h0", 0), Err(Refused::Taken));
        // Time passing does not drop work that runs.
        assert_eq!(handles.get("h0", t0 + FINISHED_TTL * 10), Some(&0));
        // One finishing makes room.
        handles.finish("h1", 10, t0);
        handles.add("more", 99).unwrap();
        assert_eq!(handles.pending_values().count(), MAX_PENDING);
    }

    #[test]
    fn no_work_starts_once_the_process_is_exiting() {
        let mut handles = Handles::new();
        handles.add("before", 1).unwrap();
        handles.close();
        assert_eq!(handles.add("after", 2), Err(Refused::Closed));
        assert_eq!(handles.pending_values().collect::<Vec<_>>(), [&1]);
    }

    #[test]
    fn finished_answers_expire_after_their_ttl() {
        let t0 = Instant::now();
        let mut handles = Handles::new();
        handles.add("a", 1).unwrap();
        handles.finish("a", 10, t0);
        handles.finish("a", 10, t0 + Duration::from_secs(1)); // the first one counts
        let almost = t0 + FINISHED_TTL - Duration::from_millis(1);
        assert_eq!(handles.get("a", almost), Some(&1));
        assert_eq!(handles.get("a", t0 + FINISHED_TTL), None);
        // Finishing or removing an unknown handle does nothing.
        handles.finish("gone", 1, t0);
        assert_eq!(handles.remove("gone"), None);
    }

    #[test]
    fn the_oldest_answers_go_first_past_the_count_or_the_bytes() {
        let t0 = Instant::now();
        let at = |i: usize| t0 + Duration::from_millis(i as u64);
        let mut handles = Handles::new();
        for i in 0..=MAX_FINISHED {
            handles.add(&format!("h{i}"), i).unwrap();
            handles.finish(&format!("h{i}"), 1, at(i));
        }
        let now = at(MAX_FINISHED);
        assert_eq!(
            handles.get("h0", now),
            None,
            "one too many: the oldest went"
        );
        assert_eq!(handles.get("h1", now), Some(&1));
        // One answer of nearly all the bytes pushes out as many as needed.
        handles.add("big", 0).unwrap();
        handles.finish("big", MAX_FINISHED_BYTES - 2, at(MAX_FINISHED + 1));
        let now = at(MAX_FINISHED + 1);
        assert_eq!(handles.get("big", now), Some(&0));
        let kept = (0..=MAX_FINISHED)
            .filter(|i| handles.get(&format!("h{i}"), now).is_some())
            .count();
        assert_eq!(kept, 2, "only the two newest small ones fit beside it");
    }
}
