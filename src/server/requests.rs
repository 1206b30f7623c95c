//! The stored answers of finished turns (contract 8.2), by (`fromInstance`,
//! `requestId`), so that a retry gets its answer again instead of running the engine
//! twice. Which ids have a turn running is the turn table's (`server/turn_table.rs`),
//! which owns this store.
//!
//! Pure bookkeeping: no I/O, time passed in. Bounds: at most [`MAX_STORED_ANSWERS`] stored answers and
//! [`MAX_STORED_BYTES`] bytes (the answer's size as given, key and
//! [`ENTRY_OVERHEAD_BYTES`] each); beyond either, the oldest stored answer (by the time
//! it was stored) is evicted first; an answer is kept for [`ANSWER_TTL`]. A restart
//! forgets everything.

use crate::protocol::{Envelope, RequestId};
use sha2::{Digest as _, Sha256};
use std::collections::{HashMap, VecDeque};
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

/// Who asked, and under which id: the request's `fromInstance` and its
/// `ext.requestId`, the store's key.
pub type RequestKey = (String, RequestId);

/// A digest of what a request id stands for: its prompt and depth.
pub type RequestDigest = [u8; 32];

/// The digest of `prompt` at `depth` (SHA-256 over the depth's 8 bytes and the prompt).
pub fn digest(prompt: &str, depth: u64) -> RequestDigest {
    let mut hasher = Sha256::new();
    hasher.update(depth.to_be_bytes());
    hasher.update(prompt.as_bytes());
    hasher.finalize().into()
}

/// The store.
#[derive(Default)]
pub struct RequestStore {
    /// Each stored answer, with the digest of what its id stood for and the bytes it
    /// counts against [`MAX_STORED_BYTES`].
    entries: HashMap<RequestKey, (RequestDigest, Envelope, usize)>,
    /// The keys of `entries`, oldest first, with when each was stored.
    order: VecDeque<(RequestKey, Instant)>,
    bytes: usize,
}

impl RequestStore {
    /// The stored answer of `key` at `now`, and the digest of what its id stood for.
    pub fn get(&mut self, key: &RequestKey, now: Instant) -> Option<(RequestDigest, &Envelope)> {
        self.expire(now);
        let (digest, answer, _) = self.entries.get(key)?;
        Some((*digest, answer))
    }

    /// Stores what `key`'s turn (of `digest`) answered, `size` bytes of it (an
    /// envelope: its JSON's length), evicting the oldest answers to stay within the
    /// bounds. An answer over [`MAX_STORED_BYTES`] alone is not stored, nor one for a
    /// key already stored (its id never ran twice).
    pub fn store(
        &mut self,
        key: &RequestKey,
        digest: RequestDigest,
        answer: Envelope,
        size: usize,
        now: Instant,
    ) {
        let size = size + key.0.len() + key.1.as_str().len() + ENTRY_OVERHEAD_BYTES;
        if size > MAX_STORED_BYTES || self.entries.contains_key(key) {
            return;
        }
        // The queue holds exactly the stored keys: once it is empty, both bounds hold.
        while self.entries.len() >= MAX_STORED_ANSWERS || self.bytes + size > MAX_STORED_BYTES {
            self.evict_oldest();
        }
        self.bytes += size;
        self.order.push_back((key.clone(), now));
        self.entries.insert(key.clone(), (digest, answer, size));
    }

    /// Drops the answers older than [`ANSWER_TTL`], and only those.
    pub fn expire(&mut self, now: Instant) {
        while self
            .order
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= ANSWER_TTL)
        {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((key, _)) = self.order.pop_front() {
            if let Some((_, _, size)) = self.entries.remove(&key) {
                self.bytes -= size;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl RequestStore {
        /// How many answers are stored, and their bytes as counted against the bounds.
        pub fn stored(&self) -> (usize, usize) {
            (self.entries.len(), self.bytes)
        }
    }

    fn key(from: &str, n: u128) -> RequestKey {
        (
            from.to_owned(),
            RequestId::new(format!("{n:032x}")).unwrap(),
        )
    }

    fn body(text: &str) -> Envelope {
        Envelope::success("worker", text.to_owned(), 0)
    }

    #[test]
    fn an_answer_is_kept_with_its_digest_until_its_ttl() {
        let t0 = Instant::now();
        let mut store = RequestStore::default();
        let k = key("a", 1);
        let d = digest("p", 1);
        assert_ne!(d, digest("q", 1));
        assert_ne!(d, digest("p", 2));
        assert_eq!(store.get(&k, t0), None);
        store.store(&k, d, body("envelope"), 8, t0);
        assert_eq!(store.get(&k, t0), Some((d, &body("envelope"))));
        // Another caller's same id is another request.
        assert_eq!(store.get(&key("b", 1), t0), None);
        assert_eq!(store.stored(), (1, 8 + 1 + 32 + ENTRY_OVERHEAD_BYTES));
        // A second answer for a stored key is not taken.
        store.store(&k, d, body("other"), 5, t0);
        assert_eq!(store.get(&k, t0), Some((d, &body("envelope"))));
        // Just under the TTL it is there; at the TTL it is gone.
        let late = t0 + ANSWER_TTL - Duration::from_millis(1);
        assert_eq!(store.get(&k, late), Some((d, &body("envelope"))));
        assert_eq!(store.get(&k, t0 + ANSWER_TTL), None);
        assert_eq!(store.stored(), (0, 0));
        assert!(store.order.is_empty());
    }

    #[test]
    fn ten_thousand_ids_stay_within_the_bounds() {
        let t0 = Instant::now();
        let mut store = RequestStore::default();
        let big = body("x");
        let d = digest("p", 1);
        for n in 0..10_000u128 {
            let at = t0 + Duration::from_millis(n as u64);
            store.store(&key("caller", n), d, big.clone(), 16 * 1024, at);
            let (answers, bytes) = store.stored();
            assert!(answers <= MAX_STORED_ANSWERS, "{answers}");
            assert!(bytes <= MAX_STORED_BYTES, "{bytes}");
        }
        // The bytes bound bit first here (16 KiB each): the newest are kept, the
        // oldest evicted.
        let (answers, _) = store.stored();
        assert!(answers > 1000, "{answers}");
        assert!(store.get(&key("caller", 9_999), t0).is_some());
        assert_eq!(store.get(&key("caller", 0), t0), None);
        // Small answers: the entry bound bites.
        let mut store = RequestStore::default();
        for n in 0..10_000u128 {
            store.store(&key("caller", n), d, body("{}"), 2, t0);
        }
        assert_eq!(store.stored().0, MAX_STORED_ANSWERS);
        assert_eq!(store.order.len(), MAX_STORED_ANSWERS);
    }

    /// Expiry used to pop a stale element (its key forgotten) that had outlived the
    /// TTL, then evict the next stored answer whatever its age. The queue now holds
    /// exactly the stored keys; expiry still drops the old answer and keeps the fresh.
    #[test]
    fn bug_expiry_evicted_a_fresh_answer_after_a_stale_queue_entry() {
        let t0 = Instant::now();
        let mut store = RequestStore::default();
        let (old, fresh) = (key("a", 1), key("a", 2));
        store.store(&old, digest("p", 1), body("old"), 3, t0);
        let later = t0 + ANSWER_TTL / 2;
        store.store(&fresh, digest("p", 1), body("fresh"), 5, later);
        store.expire(t0 + ANSWER_TTL);
        assert_eq!(
            store.get(&fresh, t0 + ANSWER_TTL),
            Some((digest("p", 1), &body("fresh")))
        );
        assert_eq!(store.get(&old, t0 + ANSWER_TTL), None);
        assert_eq!(store.stored().0, 1);
    }

    #[test]
    fn an_envelope_over_the_byte_bound_is_not_stored() {
        let t0 = Instant::now();
        let mut store = RequestStore::default();
        let k = key("a", 3);
        store.store(&k, digest("p", 1), body(""), MAX_STORED_BYTES, t0);
        assert_eq!(store.get(&k, t0), None);
        assert_eq!(store.stored(), (0, 0));
    }
}
