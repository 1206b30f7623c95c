//! Proven connections kept for the next delegation: the fast path of a library that
//! delegates again and again to the same instance.
//!
//! A connection is *proven* when its health probe matched (name, kind, and the proof
//! of the entry's secret, or for an entry without proof the same-user check, contract
//! 6.1): the secret may go out on it, and on no other. After a talk answered on such
//! a connection, it is kept here, keyed by channel root and target, with the exact
//! registry entry it was proven for, so that the next delegation sends its request on
//! it at once: no new connection, no second probe. The rule is not weakened: the
//! secret still goes out only on a connection whose health answer matched, the same
//! TCP connection to the same socket.
//!
//! A kept connection is handed out only when the target's registry entry is still
//! exactly the one it was proven for (same port, host, secret, pid, updatedAt: an
//! instance that restarted or re-registered is proven anew), when it has been idle
//! less than [`MAX_IDLE`] (well inside the server's keep-alive idle timeout), and
//! when the peer has not closed it meanwhile. Only connections to peers whose health
//! listed `idempotent-requests` are kept: if such a peer closes a kept connection just
//! as a request goes out, the request is sent again on a freshly proven one, and its
//! request id makes that repeat harmless (contract 8.2).

use crate::http::client::Connection;
use crate::protocol::{InstanceName, IDEMPOTENT_REQUESTS};
use crate::registry::Entry;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most connections kept at once (oldest dropped first).
pub const MAX_POOLED: usize = 16;

/// Longest a kept connection stays usable without a request: well below the server's
/// keep-alive idle timeout (5 s), so that a peer rarely closes one just as it is used.
pub const MAX_IDLE: Duration = Duration::from_secs(2);

/// A connection the secret may go out on, with what its health answer said.
#[derive(Debug)]
pub(super) struct Proven {
    /// The connection the health answer came on.
    pub connection: Connection,
    /// The capabilities the health answer listed.
    pub capabilities: Vec<String>,
    /// The kind the health answer gave.
    pub kind: String,
}

impl Proven {
    /// Whether the kind it was proven with is one of `accept_kinds` (a later
    /// delegation may accept fewer kinds than the one that proved it).
    pub fn kind_accepted(&self, accept_kinds: &[String]) -> bool {
        accept_kinds.contains(&self.kind)
    }

    /// Whether the peer said it deduplicates requests (contract 8.2).
    pub fn dedupes(&self) -> bool {
        self.capabilities.iter().any(|c| c == IDEMPOTENT_REQUESTS)
    }
}

/// One kept connection.
struct Kept {
    root: PathBuf,
    target: InstanceName,
    entry: Entry,
    proven: Proven,
    since: Instant,
}

/// The kept connections, newest last.
static POOL: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// Takes the kept connection for `target` under `root` proven for exactly `entry`,
/// if there is one that is still fresh and open. Stale ones found on the way are
/// dropped (closed).
pub(super) fn take(root: &Path, target: &InstanceName, entry: &Entry) -> Option<Proven> {
    let kept = {
        // A panic while holding the lock left nothing half-done: the list is valid.
        let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pool.retain(|k| k.since.elapsed() < MAX_IDLE);
        let index = pool
            .iter()
            .rposition(|k| k.target == *target && k.root == root)?;
        pool.remove(index)
    };
    // Checked outside the lock: the check is a system call or two.
    (kept.entry == *entry && kept.proven.connection.is_open_and_idle()).then_some(kept.proven)
}

/// Keeps `proven` for the next delegation to `target` under `root`, when its peer
/// deduplicates requests and the connection may carry another request.
pub(super) fn put_back(root: &Path, target: &InstanceName, entry: &Entry, proven: Proven) {
    if !proven.dedupes() || !proven.connection.is_reusable() {
        return;
    }
    let kept = Kept {
        root: root.to_path_buf(),
        target: target.clone(),
        entry: entry.clone(),
        proven,
        since: Instant::now(),
    };
    let dropped = {
        let mut pool = POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        pool.push(kept);
        let excess = pool.len().saturating_sub(MAX_POOLED);
        pool.drain(..excess).collect::<Vec<_>>()
    };
    // Closed outside the lock.
    drop(dropped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;
    use std::net::TcpListener;

    #[test]
    fn limits_sit_inside_the_servers_idle_timeout() {
        // The server's keep-alive idle timeout (`http::conn::IDLE_TIMEOUT`) is 5 s.
        assert!(MAX_IDLE < Duration::from_secs(5));
    }

    fn entry(port: u16, secret: &str) -> Entry {
        Entry {
            port,
            pid: 1,
            secret: Secret::new(secret).unwrap(),
            updated_at: "2026-12-01T00:00:00.000Z".into(),
            host: crate::registry::store::DEFAULT_HOST,
            proof: true,
        }
    }

    fn proven(port: u16, capabilities: &[&str]) -> Proven {
        let soon = Instant::now() + Duration::from_secs(2);
        Proven {
            connection: Connection::open_at(crate::registry::store::DEFAULT_HOST, port, soon)
                .unwrap(),
            capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
            kind: "loopbus".into(),
        }
    }

    #[test]
    fn a_kept_connection_goes_only_to_the_entry_it_was_proven_for() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let root = Path::new("/pool-test-root");
        let target = InstanceName::new("pool-target").unwrap();
        let proven_entry = entry(port, "s1");

        put_back(
            root,
            &target,
            &proven_entry,
            proven(port, &[IDEMPOTENT_REQUESTS]),
        );
        let kept = take(root, &target, &proven_entry).expect("kept for the same entry");
        assert!(kept.kind_accepted(&["loopbus".to_owned()]));
        assert!(!kept.kind_accepted(&["other".to_owned()]));

        // Another secret (the instance restarted): proven anew, the kept one dropped.
        put_back(root, &target, &proven_entry, kept);
        assert!(take(root, &target, &entry(port, "s2")).is_none());
        assert!(take(root, &target, &proven_entry).is_none());

        // Another root or target: not handed out.
        put_back(
            root,
            &target,
            &proven_entry,
            proven(port, &[IDEMPOTENT_REQUESTS]),
        );
        let other = InstanceName::new("pool-other").unwrap();
        assert!(take(Path::new("/elsewhere"), &target, &proven_entry).is_none());
        assert!(take(root, &other, &proven_entry).is_none());
        assert!(take(root, &target, &proven_entry).is_some());

        // A peer that does not deduplicate: never kept.
        put_back(root, &target, &proven_entry, proven(port, &[]));
        assert!(take(root, &target, &proven_entry).is_none());

        // Closed by the peer meanwhile: not handed out.
        put_back(
            root,
            &target,
            &proven_entry,
            proven(port, &[IDEMPOTENT_REQUESTS]),
        );
        let (server_side, _) = listener.accept().unwrap();
        drop(server_side);
        let mut closed = false;
        for _ in 0..200 {
            // Every accepted connection of this test is closed here in turn.
            if let Some(kept) = take(root, &target, &proven_entry) {
                put_back(root, &target, &proven_entry, kept);
                std::thread::sleep(Duration::from_millis(5));
                listener.set_nonblocking(true).unwrap();
                while let Ok((s, _)) = listener.accept() {
                    drop(s);
                }
            } else {
                closed = true;
                break;
            }
        }
        assert!(closed, "a connection the peer closed was handed out");
    }
}
