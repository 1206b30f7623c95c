//! The listening socket and how many connections it may hold: loopback-only binding
//! with a deep backlog, and the connection cap the open-files limit allows.

use mio::net::TcpListener;
use rustix::process::{getrlimit, Resource};
use std::io::{self, ErrorKind};
use std::net::SocketAddr;

/// Open connections at most; lower when the open-files limit (`ulimit -n`) leaves less
/// room (see [`RESERVED_FDS`], [`FDS_PER_TURN`]). When full, a new connection is admitted
/// by evicting one in `conn::Class` order; one holding authorized work never is, and
/// when nothing can be, the new connection is closed.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections that authorized work may not take, so that health (and every other
/// request) always finds room: once the connection cap less this many connections hold
/// authorized work, a new talk head that passed its checks is answered 503
/// `server_busy` at once. A config whose running plus queued turns cannot fit under
/// the cap less this reserve is refused at startup.
pub const HEALTH_RESERVE: usize = 32;
/// Descriptors kept free for everything that is not a connection or a running
/// engine's (listener, poll, waker, signal and stop pipes, stdio, serve lock, audit,
/// config and registry files, `/proc` scans, and the child's pipe ends and exec-error
/// pipe of the one engine being spawned: spawns take a lock, one at a time) when the
/// open-files limit caps the number of connections. An idle instance holds about 15.
pub const RESERVED_FDS: usize = 48;
/// Descriptors one running turn holds for its engine: our ends of its stdin, stdout
/// and stderr pipes, a pidfd, and the eventfd its cancel wakes (see `engine::process`).
/// The cap keeps this many per `bus.maxConcurrentTurns` free, so that busy engines
/// never leave accept without a descriptor.
pub const FDS_PER_TURN: usize = 5;
/// The fewest connections served however low the open-files limit is.
const MIN_CONNECTIONS: usize = 8;
/// The listen backlog: connections the kernel queues before the loop accepts them.
/// (The kernel caps it at `net.core.somaxconn`.)
pub const LISTEN_BACKLOG: i32 = 1024;

/// Binds a listener on `addr`, which must be a loopback address.
///
/// # Errors
/// `addr` is not loopback (`PermissionDenied`), or the bind failed (in use, ...).
pub fn bind_loopback(addr: SocketAddr) -> io::Result<TcpListener> {
    // Exactly the two addresses clients dial and the Host check accepts; 127.0.0.2
    // is loopback too, but nobody would find the instance there.
    let ip = addr.ip();
    if ip != std::net::Ipv4Addr::LOCALHOST && ip != std::net::Ipv6Addr::LOCALHOST {
        return Err(io::Error::new(
            ErrorKind::PermissionDenied,
            // The caller's error names the address already.
            "loopbus listens on the loopback addresses 127.0.0.1 (localhost) and [::1] only",
        ));
    }
    // std binds with SO_REUSEADDR and close-on-exec, and listens with a smaller
    // backlog; a burst of new connections larger than that would be dropped by the
    // kernel before the loop could evict idle ones. Listening again raises it.
    let listener = std::net::TcpListener::bind(addr)?;
    rustix::net::listen(&listener, LISTEN_BACKLOG)?;
    listener.set_nonblocking(true)?;
    Ok(TcpListener::from_std(listener))
}

/// The connection cap this process can honour with `concurrent_turns` engines running
/// at once: [`MAX_CONNECTIONS`], or the soft limit on open files less [`RESERVED_FDS`]
/// and [`FDS_PER_TURN`] per turn if that is lower (the event loop logs that).
/// Otherwise accept would run out of descriptors first, and new connections (health
/// checks included) would wait behind the backlog instead of evicting idle ones.
pub fn connection_cap(concurrent_turns: usize) -> usize {
    // `None` is unlimited.
    cap_for(getrlimit(Resource::Nofile).current, concurrent_turns)
}

/// Logs (a warning) that the open-files limit lowered the connection cap to `cap`, if
/// it did.
pub(crate) fn warn_if_reduced(cap: usize, concurrent_turns: usize) {
    if cap < MAX_CONNECTIONS {
        let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
        log::warn!(
            "the open-files limit is {soft}: serving at most {cap} connections \
             instead of {MAX_CONNECTIONS} ({RESERVED_FDS} descriptors are kept for the \
             instance and {FDS_PER_TURN} for each of {concurrent_turns} running turns; \
             raise it with `ulimit -n`)"
        );
    }
}

/// Most connections that may hold authorized work under the connection cap `cap`: the
/// cap less [`HEALTH_RESERVE`]. Running plus queued turns must fit under it.
pub fn max_authorized(cap: usize) -> usize {
    cap.saturating_sub(HEALTH_RESERVE)
}

/// The connection cap under the soft open-files limit `soft` (`None`: unlimited) with
/// `concurrent_turns` engines running at once.
fn cap_for(soft: Option<u64>, concurrent_turns: usize) -> usize {
    let soft = soft.map_or(usize::MAX, |s| usize::try_from(s).unwrap_or(usize::MAX));
    let kept = FDS_PER_TURN
        .saturating_mul(concurrent_turns)
        .saturating_add(RESERVED_FDS);
    // MIN_CONNECTIONS < MAX_CONNECTIONS, so the clamp cannot panic.
    soft.saturating_sub(kept)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_binds() {
        for refused in ["0.0.0.0:0", "127.0.0.2:0", "[::]:0", "192.0.2.1:0"] {
            let err = bind_loopback(refused.parse().unwrap()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{refused}");
        }
        assert!(bind_loopback("127.0.0.1:0".parse().unwrap()).is_ok());
    }

    #[test]
    fn connection_cap_table() {
        let cases = [
            (None, 64, MAX_CONNECTIONS),
            (Some(u64::MAX), 4, MAX_CONNECTIONS),
            (Some(1_048_576), 1_000, MAX_CONNECTIONS),
            (Some(1024 + 48), 0, MAX_CONNECTIONS),
            (Some(1024 + 48 + 20), 4, MAX_CONNECTIONS),
            (Some(1024 + 48 + 19), 4, 1023),
            (Some(1024), 0, 976),
            (Some(1024), 4, 956),
            // The attack review's config: 64 engines under `ulimit -n 1024`.
            (Some(1024), 64, 1024 - 48 - 320),
            (Some(132), 4, 64),
            (Some(70), 4, MIN_CONNECTIONS),
            (Some(0), 0, MIN_CONNECTIONS),
            (Some(1024), usize::MAX, MIN_CONNECTIONS),
        ];
        for (soft, turns, want) in cases {
            assert_eq!(cap_for(soft, turns), want, "{soft:?} {turns}");
        }
    }

    #[test]
    fn the_health_reserve_is_kept_from_authorized_work() {
        assert_eq!(
            max_authorized(MAX_CONNECTIONS),
            MAX_CONNECTIONS - HEALTH_RESERVE
        );
        assert_eq!(max_authorized(64), 32);
        assert_eq!(max_authorized(MIN_CONNECTIONS), 0);
    }
}
