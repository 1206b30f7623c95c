//! The request-id store (contract 8.2): which (`fromInstance`, `requestId`) pairs have a
//! turn running, and the stored envelopes of those that finished, so that a retry
//! attaches to its turn or gets its answer again instead of running the engine twice.
//!
//! The turn table (`server/turn_table.rs`) owns it. Pure bookkeeping: no I/O, time
//! passed in, the answer type generic (the server stores envelopes). Bounds: at most
//! [`MAX_STORED_ANSWERS`] stored answers and [`MAX_STORED_BYTES`] bytes (the answer's
//! size as given, key and [`ENTRY_OVERHEAD_BYTES`] each); beyond either, the oldest
//! stored answer (by the time it was stored) is evicted first; an answer is kept for
//! [`ANSWER_TTL`]. Running entries are bounded by the turn pool (one per admitted turn)
//! and are never evicted. A restart forgets everything.

use crate::protocol::RequestId;
use sha2::{Digest as _, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a finished turn's envelope is kept for retries (contract 8.2).
pub const ANSWER_TTL: Duration = Duration::from_secs(600);
/// Most stored envelopes at once.
pub const MAX_STORED_ANSWERS: usize = 4096;
/// Most bytes of stored envelopes (with their keys and overhead) at once. An envelope
/// larger than this alone is not stored: its retry runs the turn again.
pub const MAX_STORED_BYTES: usize = 32 * 1024 * 1024;
/// What one stored entry is counted as besides its envelope and key: the map's and
/// queue's own bookkeeping.
pub const ENTRY_OVERHEAD_BYTES: usize = 128;

/// Who asked, and under which id: the store's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RequestKey {
    /// The request's `fromInstance`.
    pub from_instance: String,
    /// Its `ext.requestId`.
    pub id: RequestId,
}

impl RequestKey {
    fn bytes(&self) -> usize {
        self.from_instance.len() + self.id.as_str().len()
    }
}

/// A digest of what a request id stands for: its prompt and depth.
pub type RequestDigest = [u8; 32];

/// The digest of `prompt` at `depth` (SHA-256 over the depth's 8 bytes and the prompt).
pub fn digest(prompt: &str, depth: u64) -> RequestDigest {
    let mut hasher = Sha256::new();
    hasher.update(depth.to_be_bytes());
    hasher.update(prompt.as_bytes());
    hasher.finalize().into()
}

/// What the store knows of a request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen<T, A> {
    /// Nothing: a new turn.
    New,
    /// The id is known for a different prompt or depth.
    Mismatch,
    /// Its turn is running (or queued) under this id of the caller's.
    Running(T),
    /// Its turn finished; this is what it answered.
    Answered(Arc<A>),
}

#[derive(Debug)]
enum State<T, A> {
    Running(T),
    Answered {
        answer: Arc<A>,
        size: usize,
        /// Its place in the queue of stored answers.
        serial: u64,
    },
}

/// What the store holds for one request id.
#[derive(Debug)]
struct Stored<T, A> {
    digest: RequestDigest,
    state: State<T, A>,
}

/// The store; `T` names a running turn, `A` is what a finished one answered.
#[derive(Debug)]
pub struct RequestStore<T, A> {
    entries: HashMap<RequestKey, Stored<T, A>>,
    /// Stored answers, oldest first: key, serial and when it was stored. An element
    /// whose serial is not its key's current one is stale (the key was forgotten or
    /// stored again) and is skipped.
    answered: VecDeque<(RequestKey, u64, Instant)>,
    next_serial: u64,
    answers: usize,
    bytes: usize,
}

impl<T, A> Default for RequestStore<T, A> {
    fn default() -> Self {
        RequestStore {
            entries: HashMap::new(),
            answered: VecDeque::new(),
            next_serial: 0,
            answers: 0,
            bytes: 0,
        }
    }
}

impl<T: Copy, A> RequestStore<T, A> {
    /// What is known of `key` at `now`. With `digest` (a request), an id known for
    /// another prompt or depth is [`Seen::Mismatch`]; without (a cancel request,
    /// whose prompt is not compared), it is not looked at.
    pub fn look(
        &mut self,
        key: &RequestKey,
        digest: Option<&RequestDigest>,
        now: Instant,
    ) -> Seen<T, A> {
        self.expire(now);
        let Some(entry) = self.entries.get(key) else {
            return Seen::New;
        };
        if digest.is_some_and(|d| *d != entry.digest) {
            return Seen::Mismatch;
        }
        match &entry.state {
            State::Running(turn) => Seen::Running(*turn),
            State::Answered { answer, .. } => Seen::Answered(Arc::clone(answer)),
        }
    }

    /// Records that `key`'s turn runs as `turn`.
    pub fn running(&mut self, key: RequestKey, digest: RequestDigest, turn: T) {
        self.forget(&key);
        let state = State::Running(turn);
        self.entries.insert(key, Stored { digest, state });
    }

    /// Stores what `key`'s turn answered, `size` bytes of it (an envelope: its JSON's
    /// length), evicting the oldest answers to stay within the bounds. An answer over
    /// [`MAX_STORED_BYTES`] alone is not stored.
    pub fn answered(&mut self, key: &RequestKey, answer: Arc<A>, size: usize, now: Instant) {
        let Some(digest) = self.entries.get(key).map(|e| e.digest) else {
            return;
        };
        self.forget(key);
        let size = entry_bytes(key, size);
        if size > MAX_STORED_BYTES {
            return;
        }
        while self.answers >= MAX_STORED_ANSWERS || self.bytes + size > MAX_STORED_BYTES {
            if self.oldest().is_none() {
                break;
            }
            self.evict_oldest();
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        self.answers += 1;
        self.bytes += size;
        self.answered.push_back((key.clone(), serial, now));
        let state = State::Answered {
            answer,
            size,
            serial,
        };
        self.entries.insert(key.clone(), Stored { digest, state });
    }

    /// Forgets `key` (its turn ended in a way a retry should run again), keeping the
    /// counters right (its queue element goes stale).
    pub fn forget(&mut self, key: &RequestKey) {
        if let Some(entry) = self.entries.remove(key) {
            if let State::Answered { size, .. } = &entry.state {
                self.answers -= 1;
                self.bytes -= size;
            }
        }
    }

    /// Drops the answers older than [`ANSWER_TTL`], and only those.
    pub fn expire(&mut self, now: Instant) {
        while self
            .oldest()
            .is_some_and(|at| now.saturating_duration_since(at) >= ANSWER_TTL)
        {
            self.evict_oldest();
        }
    }

    /// When the oldest stored answer was stored, after dropping the stale elements in
    /// front of it, so that the queue's front is that answer.
    fn oldest(&mut self) -> Option<Instant> {
        while let Some((key, serial, at)) = self.answered.front() {
            let current = matches!(
                self.entries.get(key),
                Some(Stored {
                    state: State::Answered { serial: s, .. },
                    ..
                }) if s == serial
            );
            if current {
                return Some(*at);
            }
            self.answered.pop_front();
        }
        None
    }

    /// Evicts the answer at the queue's front (call [`RequestStore::oldest`] first).
    fn evict_oldest(&mut self) {
        if let Some((key, _, _)) = self.answered.pop_front() {
            self.forget(&key);
        }
    }
}

/// What an answer of `size` bytes under `key` counts against [`MAX_STORED_BYTES`].
fn entry_bytes(key: &RequestKey, size: usize) -> usize {
    size + key.bytes() + ENTRY_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<T, A> RequestStore<T, A> {
        /// How many answers are stored, and their bytes as counted against the bounds.
        pub fn stored(&self) -> (usize, usize) {
            (self.answers, self.bytes)
        }

        /// Whether anything at all is known (running or stored).
        pub fn is_empty(&self) -> bool {
            self.entries.is_empty()
        }
    }

    fn key(from: &str, n: u128) -> RequestKey {
        RequestKey {
            from_instance: from.to_owned(),
            id: RequestId::new(format!("{n:032x}")).unwrap(),
        }
    }

    fn body(text: &str) -> Arc<Vec<u8>> {
        Arc::new(text.as_bytes().to_vec())
    }

    #[test]
    fn a_running_turn_then_its_answer() {
        let t0 = Instant::now();
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        let k = key("a", 1);
        let d = digest("p", 1);
        assert_eq!(store.look(&k, Some(&d), t0), Seen::New);
        store.running(k.clone(), d, 7);
        assert_eq!(store.look(&k, Some(&d), t0), Seen::Running(7));
        // The same id for another prompt or depth; a cancel does not compare.
        assert_eq!(store.look(&k, Some(&digest("q", 1)), t0), Seen::Mismatch);
        assert_eq!(store.look(&k, Some(&digest("p", 2)), t0), Seen::Mismatch);
        assert_eq!(store.look(&k, None, t0), Seen::Running(7));
        // Another caller's same id is another request.
        assert_eq!(store.look(&key("b", 1), Some(&d), t0), Seen::New);
        store.answered(&k, body("envelope"), 8, t0);
        assert_eq!(
            store.look(&k, Some(&d), t0),
            Seen::Answered(body("envelope"))
        );
        assert_eq!(store.stored(), (1, 8 + 1 + 32 + ENTRY_OVERHEAD_BYTES));
        // Just under the TTL it is there; at the TTL it is gone.
        let late = t0 + ANSWER_TTL - Duration::from_millis(1);
        assert_eq!(
            store.look(&k, Some(&d), late),
            Seen::Answered(body("envelope"))
        );
        assert_eq!(store.look(&k, Some(&d), t0 + ANSWER_TTL), Seen::New);
        assert_eq!(store.stored(), (0, 0));
        assert!(store.is_empty());
    }

    #[test]
    fn a_forgotten_turn_runs_again() {
        let t0 = Instant::now();
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        let k = key("a", 2);
        store.running(k.clone(), digest("p", 1), 1);
        store.forget(&k);
        assert_eq!(store.look(&k, None, t0), Seen::New);
        // An answer for an id that is not running (forgotten) is not stored.
        store.answered(&k, body("x"), 1, t0);
        assert_eq!(store.look(&k, None, t0), Seen::New);
    }

    #[test]
    fn ten_thousand_ids_stay_within_the_bounds() {
        let t0 = Instant::now();
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        let big = Arc::new(vec![b'x'; 16 * 1024]);
        for n in 0..10_000u128 {
            let k = key("caller", n);
            store.running(k.clone(), digest("p", 1), 0);
            store.answered(
                &k,
                Arc::clone(&big),
                big.len(),
                t0 + Duration::from_millis(n as u64),
            );
            let (answers, bytes) = store.stored();
            assert!(answers <= MAX_STORED_ANSWERS, "{answers}");
            assert!(bytes <= MAX_STORED_BYTES, "{bytes}");
        }
        // The bytes bound bit first here (16 KiB each): the newest are kept, the
        // oldest evicted.
        let (answers, _) = store.stored();
        assert!(answers > 1000, "{answers}");
        let newest = key("caller", 9_999);
        assert!(matches!(store.look(&newest, None, t0), Seen::Answered(_)));
        assert_eq!(store.look(&key("caller", 0), None, t0), Seen::New);
        // Small answers: the entry bound bites.
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        for n in 0..10_000u128 {
            let k = key("caller", n);
            store.running(k.clone(), digest("p", 1), 0);
            store.answered(&k, body("{}"), 2, t0);
        }
        assert_eq!(store.stored().0, MAX_STORED_ANSWERS);
        assert_eq!(store.entries.len(), MAX_STORED_ANSWERS);
        assert!(store.answered.len() <= MAX_STORED_ANSWERS);
    }

    /// Expiry used to pop a stale element (its key forgotten) that had outlived the
    /// TTL, then evict the next stored answer whatever its age.
    #[test]
    fn bug_expiry_evicted_a_fresh_answer_after_a_stale_queue_entry() {
        let t0 = Instant::now();
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        let (old, fresh) = (key("a", 1), key("a", 2));
        store.running(old.clone(), digest("p", 1), 0);
        store.answered(&old, body("old"), 3, t0);
        // The old id runs again: its stored answer goes, its queue element stays.
        store.running(old.clone(), digest("p", 1), 1);
        let later = t0 + ANSWER_TTL / 2;
        store.running(fresh.clone(), digest("p", 1), 2);
        store.answered(&fresh, body("fresh"), 5, later);
        store.expire(t0 + ANSWER_TTL);
        assert_eq!(
            store.look(&fresh, None, t0 + ANSWER_TTL),
            Seen::Answered(body("fresh"))
        );
        assert_eq!(store.look(&old, None, t0 + ANSWER_TTL), Seen::Running(1));
        assert_eq!(store.stored().0, 1);
    }

    #[test]
    fn an_envelope_over_the_byte_bound_is_not_stored() {
        let t0 = Instant::now();
        let mut store: RequestStore<u32, Vec<u8>> = RequestStore::default();
        let k = key("a", 3);
        store.running(k.clone(), digest("p", 1), 0);
        store.answered(&k, Arc::new(Vec::new()), MAX_STORED_BYTES, t0);
        assert_eq!(store.look(&k, None, t0), Seen::New);
        assert_eq!(store.stored(), (0, 0));
    }
}
