//! Who owns the listening socket a secret is about to be sent to (contract section 6.1).
//!
//! A peer that cannot prove itself (an entry without `proof: true`: the original
//! implementation) is at least checked to be a process of the caller's own user: on
//! Linux, the kernel's socket tables `/proc/net/tcp` and `/proc/net/tcp6` name the uid
//! of every listening socket. A listener of another uid on the target address and port,
//! or a wildcard listener that would also receive a connection to it, refuses the
//! delegation before the secret leaves. So does another uid on the accepted end of
//! the very connection the secret would go out on: a squatter that closes its listener
//! right after answering health still holds that socket, and the tables list it. The
//! parser ([`parse_sockets`]) and the verdict ([`verdict`]) are pure functions over the
//! tables' text, so they are tested with plain values; [`check_connection_owner`] and
//! [`check_listener_owner`] read the files.
//!
//! Where the check cannot be made (not Linux, the tables unreadable, no matching
//! listener found) it says so at debug level and lets the delegation go on: the check
//! is a second line behind the proof, not a replacement for it.

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The kernel's IPv4 socket table.
pub const PROC_NET_TCP: &str = "/proc/net/tcp";
/// The kernel's IPv6 socket table (also lists IPv4-mapped and dual-stack listeners).
pub const PROC_NET_TCP6: &str = "/proc/net/tcp6";

/// The most of each socket table read: 16 MiB, about 100,000 sockets. The kernel lists
/// listening sockets before all others, so a longer table cut here still holds every
/// listener in any realistic case; a listener past the cut is "no matching listener",
/// which the caller treats as "cannot check".
pub const MAX_PROC_NET_BYTES: u64 = 16 * 1024 * 1024;

/// The `st` column's value for a listening socket (`TCP_LISTEN`).
const TCP_LISTEN: &str = "0A";

/// One socket of a socket table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    /// Its local address and port (unspecified address for a wildcard listener).
    pub local: SocketAddr,
    /// Its remote address and port (unspecified for a listener).
    pub remote: SocketAddr,
    /// Whether it is listening (state `0A`).
    pub listening: bool,
    /// The uid owning the socket.
    pub uid: u32,
}

/// A listener of another user holds the target address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMismatch {
    /// The target port.
    pub port: u16,
    /// The uid holding it.
    pub uid: u32,
}

impl fmt::Display for OwnerMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "port {} is held by another user's process, uid {}; not sending the secret",
            self.port, self.uid
        )
    }
}

impl std::error::Error for OwnerMismatch {}

/// What the socket tables say of a target address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every socket that would receive the connection is the caller's own.
    Own,
    /// A socket of this other uid would (or might) receive it.
    Foreign(u32),
    /// No socket matches: the check cannot be made from these tables.
    NoListener,
}

/// The sockets of one socket table's text (`/proc/net/tcp` or `/proc/net/tcp6`; the
/// address width tells which). The header line and lines that do not parse are skipped.
///
/// Each line is `sl local_address rem_address st tx:rx tr:when retrnsmt uid ...`, where
/// an address is `HEX:PORT`: the IP as 8 (IPv4) or 32 (IPv6) hex digits, each 32-bit
/// word printed as the kernel holds it in memory (little-endian on x86 and arm:
/// 127.0.0.1 is `0100007F`), and the port as 4 hex digits in plain order.
pub fn parse_sockets(text: &str) -> Vec<Socket> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Socket> {
    let fields: Vec<&str> = line.split_whitespace().take(8).collect();
    let [_sl, local, remote, state, _queues, _timer, _retransmits, uid] = fields[..] else {
        return None;
    };
    Some(Socket {
        local: parse_address(local)?,
        remote: parse_address(remote)?,
        listening: state == TCP_LISTEN,
        uid: uid.parse::<u32>().ok()?,
    })
}

/// `HEX:PORT` of the table.
fn parse_address(field: &str) -> Option<SocketAddr> {
    let (ip_hex, port_hex) = field.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    Some(SocketAddr::new(parse_ip(ip_hex)?, port))
}

/// An address of the table: 8 hex digits for IPv4, 32 for IPv6, in 32-bit words of
/// the machine's byte order.
fn parse_ip(hex: &str) -> Option<IpAddr> {
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let word = |i: usize| -> Option<[u8; 4]> {
        let digits = hex.get(i * 8..i * 8 + 8)?;
        u32::from_str_radix(digits, 16).ok().map(u32::to_ne_bytes)
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for (i, chunk) in octets.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// Whether a listener bound to `listener` would (or might) receive a connection to
/// `target`: the same address, the wildcard of its family, an IPv4-mapped IPv6 form of
/// it, or, for an IPv4 target, the IPv6 wildcard (a dual-stack listener; the tables do
/// not say whether it is IPv6-only, so it counts).
fn receives(listener: IpAddr, target: IpAddr) -> bool {
    if listener == target || (listener.is_unspecified() && listener.is_ipv4() == target.is_ipv4()) {
        return true;
    }
    match (listener, target) {
        (IpAddr::V6(l), IpAddr::V4(t)) => l.is_unspecified() || l.to_ipv4_mapped() == Some(t),
        _ => false,
    }
}

/// `addr` with an IPv4-mapped IPv6 address written as IPv4, as the other end sees it.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The verdict on a connection to `target` from `sockets`: foreign if any socket that
/// would receive it belongs to a uid other than `own_uid`. Those are the listeners on
/// `target`'s port whose address would receive it, and, when the connection is made
/// (`ours` is its local end), the accepted socket at its other end.
pub fn verdict(
    sockets: &[Socket],
    target: SocketAddr,
    ours: Option<SocketAddr>,
    own_uid: u32,
) -> Verdict {
    let receiving = |socket: &&Socket| {
        if socket.listening {
            socket.local.port() == target.port() && receives(socket.local.ip(), target.ip())
        } else {
            ours.is_some_and(|ours| {
                canonical(socket.local) == canonical(target)
                    && canonical(socket.remote) == canonical(ours)
            })
        }
    };
    let mut matched = false;
    for socket in sockets.iter().filter(receiving) {
        if socket.uid != own_uid {
            return Verdict::Foreign(socket.uid);
        }
        matched = true;
    }
    if matched {
        Verdict::Own
    } else {
        Verdict::NoListener
    }
}

/// Checks that the socket listening on `ip:port` (and any wildcard listener that would
/// also receive a connection to it) belongs to the caller's own uid. Where that
/// cannot be told, says so at debug level and returns `Ok`.
///
/// # Errors
/// A listener of another uid would receive the connection.
// For a start-up that finds its registered port held (issue 10, item 4): there is no
// connection to check then. Not called yet in this branch.
#[allow(dead_code)]
pub fn check_listener_owner(ip: IpAddr, port: u16) -> Result<(), OwnerMismatch> {
    check(SocketAddr::new(ip, port), None)
}

/// Checks, for the open connection from `local` to `peer`, that its accepted end and
/// every listener that would receive a connection to `peer` belong to the caller's own
/// uid. Where that cannot be told, says so at debug level and returns `Ok`.
///
/// # Errors
/// A socket of another uid holds the connection or the port.
pub fn check_connection_owner(peer: SocketAddr, local: SocketAddr) -> Result<(), OwnerMismatch> {
    check(peer, Some(local))
}

fn check(target: SocketAddr, ours: Option<SocketAddr>) -> Result<(), OwnerMismatch> {
    let port = target.port();
    if !cfg!(target_os = "linux") {
        log::debug!("owner of port {port} not checked: not Linux");
        return Ok(());
    }
    let own_uid = rustix::process::getuid().as_raw();
    // The kernel writes these tables a bucket at a time and resumes a later read by
    // offset, so sockets opened or closed meanwhile can hide an entry from one reading:
    // a socket not found is looked for again before it counts as not listed.
    for _ in 0..TABLE_READINGS {
        let Some(sockets) = read_tables() else {
            log::debug!("owner of port {port} not checked: no socket table readable");
            return Ok(());
        };
        match verdict(&sockets, target, ours, own_uid) {
            Verdict::Own => return Ok(()),
            Verdict::Foreign(uid) => return Err(OwnerMismatch { port, uid }),
            Verdict::NoListener => {}
        }
    }
    log::debug!("owner of port {port} not checked: {target} not in the socket tables");
    Ok(())
}

/// How many times the socket tables are read before a socket counts as not listed.
const TABLE_READINGS: usize = 3;

/// Bytes asked for in one read of a socket table: a reading in few large reads gives
/// the kernel few chances to shift entries between them.
const TABLE_READ_CHUNK: usize = 256 * 1024;

/// Every socket of both tables, or `None` when neither can be read.
fn read_tables() -> Option<Vec<Socket>> {
    let mut sockets = Vec::new();
    let mut readable = false;
    for path in [PROC_NET_TCP, PROC_NET_TCP6] {
        match read_bounded(path) {
            Ok(text) => {
                readable = true;
                sockets.extend(parse_sockets(&text));
            }
            Err(e) => log::debug!("cannot read {path}: {e}"),
        }
    }
    readable.then_some(sockets)
}

/// At most [`MAX_PROC_NET_BYTES`] of `path` as text. `files::read_regular_file` won't
/// do: files under /proc report size 0.
fn read_bounded(path: &str) -> std::io::Result<String> {
    let mut bytes = Vec::with_capacity(TABLE_READ_CHUNK);
    std::fs::File::open(path)?
        .take(MAX_PROC_NET_BYTES)
        .read_to_end(&mut bytes)?;
    // The tables are ASCII; a cut in the middle of a line only loses that line.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
    const HEADER6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";

    fn a(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn socket(local: &str, remote: &str, listening: bool, uid: u32) -> Socket {
        Socket {
            local: a(local),
            remote: a(remote),
            listening,
            uid,
        }
    }

    // The sample lines are in the byte order of a little-endian machine.
    #[cfg(target_endian = "little")]
    #[test]
    fn parse_sockets_table() {
        let tcp = [
            HEADER,
            // 127.0.0.1:7701 listening, uid 1000
            "   0: 0100007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 41234 1 0000000000000000 100 0 0 10 0",
            // 0.0.0.0:8080 listening, uid 65534
            "   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 41235 1 0000000000000000 100 0 0 10 0",
            // 127.0.0.1:7701 <- 127.0.0.1:50000 established (01)
            "   2: 0100007F:1E15 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 41236 1 0000000000000000 20 4 30 10 -1",
            // 127.0.0.1:7702 in TIME_WAIT (06), uid 0
            "   3: 0100007F:1E16 0100007F:C351 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000",
            // 192.168.1.5:22 listening, uid 0
            "   4: 0501A8C0:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41237 1 0000000000000000 100 0 0 10 0",
            // malformed lines: no port, not hex, a negative uid, too few fields
            "   5: 0100007F 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
            "   6: ZZ00007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
            "   7: 0100007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  -1",
            "   8: 0100007F:1E15 00000000:0000 0A",
            "",
        ]
        .join("\n");
        assert_eq!(
            parse_sockets(&tcp),
            vec![
                socket("127.0.0.1:7701", "0.0.0.0:0", true, 1000),
                socket("0.0.0.0:8080", "0.0.0.0:0", true, 65534),
                socket("127.0.0.1:7701", "127.0.0.1:50000", false, 1000),
                socket("127.0.0.1:7702", "127.0.0.1:50001", false, 0),
                socket("192.168.1.5:22", "0.0.0.0:0", true, 0),
            ]
        );

        let tcp6 = [
            HEADER6,
            // [::1]:7701 listening, uid 1000
            "   0: 00000000000000000000000001000000:1E15 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 51234 1 0000000000000000 100 0 0 10 0",
            // [::]:7703 listening, uid 65534
            "   1: 00000000000000000000000000000000:1E17 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 51235 1 0000000000000000 100 0 0 10 0",
            // [::ffff:127.0.0.1]:7704 listening, uid 65534
            "   2: 0000000000000000FFFF00000100007F:1E18 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 51236 1 0000000000000000 100 0 0 10 0",
            // [::1]:7701 <- [::1]:50000 established
            "   3: 00000000000000000000000001000000:1E15 00000000000000000000000001000000:C350 01 00000000:00000000 00:00000000 00000000  1000        0 51237 1 0000000000000000 20 4 30 10 -1",
            // 24 hex digits: neither width
            "   4: 000000000000000001000000:1E15 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
        ]
        .join("\n");
        assert_eq!(
            parse_sockets(&tcp6),
            vec![
                socket("[::1]:7701", "[::]:0", true, 1000),
                socket("[::]:7703", "[::]:0", true, 65534),
                socket("[::ffff:127.0.0.1]:7704", "[::]:0", true, 65534),
                socket("[::1]:7701", "[::1]:50000", false, 1000),
            ]
        );
        assert_eq!(parse_sockets(""), vec![]);
        assert_eq!(parse_sockets(HEADER), vec![]);
    }

    #[test]
    fn verdict_table() {
        let me = 1000;
        let listen = |local: &str, uid| socket(local, "0.0.0.0:0", true, uid);
        let accepted = |local: &str, remote: &str, uid| socket(local, remote, false, uid);
        let ours4 = Some(a("127.0.0.1:50000"));
        let ours6 = Some(a("[::1]:50000"));
        // (sockets, target, our end of the connection, verdict)
        type Row = (Vec<Socket>, &'static str, Option<SocketAddr>, Verdict);
        let cases: Vec<Row> = vec![
            (
                vec![listen("127.0.0.1:7701", me)],
                "127.0.0.1:7701",
                None,
                Verdict::Own,
            ),
            (
                vec![listen("127.0.0.1:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Foreign(65534),
            ),
            (
                vec![listen("[::1]:7701", 65534)],
                "[::1]:7701",
                None,
                Verdict::Foreign(65534),
            ),
            (
                vec![listen("[::1]:7701", me)],
                "[::1]:7701",
                None,
                Verdict::Own,
            ),
            // another port, another address: no match
            (
                vec![listen("127.0.0.1:7702", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::NoListener,
            ),
            (
                vec![listen("192.168.1.5:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::NoListener,
            ),
            // the other family's loopback does not receive it
            (
                vec![listen("[::1]:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::NoListener,
            ),
            (
                vec![listen("127.0.0.1:7701", 65534)],
                "[::1]:7701",
                None,
                Verdict::NoListener,
            ),
            // wildcards of the same family receive it
            (
                vec![listen("0.0.0.0:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Foreign(65534),
            ),
            (
                vec![listen("[::]:7701", 65534)],
                "[::1]:7701",
                None,
                Verdict::Foreign(65534),
            ),
            // an IPv4 wildcard does not receive IPv6
            (
                vec![listen("0.0.0.0:7701", 65534)],
                "[::1]:7701",
                None,
                Verdict::NoListener,
            ),
            // a dual-stack IPv6 wildcard, or a mapped address, may receive IPv4
            (
                vec![listen("[::]:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Foreign(65534),
            ),
            (
                vec![listen("[::ffff:127.0.0.1]:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Foreign(65534),
            ),
            // own specific listener plus a foreign wildcard: refused
            (
                vec![listen("127.0.0.1:7701", me), listen("[::]:7701", 0)],
                "127.0.0.1:7701",
                None,
                Verdict::Foreign(0),
            ),
            (
                vec![listen("127.0.0.1:7701", me), listen("0.0.0.0:7701", me)],
                "127.0.0.1:7701",
                None,
                Verdict::Own,
            ),
            (vec![], "127.0.0.1:7701", None, Verdict::NoListener),
            // the accepted end of our connection, its listener already closed
            (
                vec![accepted("127.0.0.1:7701", "127.0.0.1:50000", 65534)],
                "127.0.0.1:7701",
                ours4,
                Verdict::Foreign(65534),
            ),
            (
                vec![accepted("[::1]:7701", "[::1]:50000", 65534)],
                "[::1]:7701",
                ours6,
                Verdict::Foreign(65534),
            ),
            (
                vec![accepted(
                    "[::ffff:127.0.0.1]:7701",
                    "[::ffff:127.0.0.1]:50000",
                    65534,
                )],
                "127.0.0.1:7701",
                ours4,
                Verdict::Foreign(65534),
            ),
            (
                vec![
                    listen("127.0.0.1:7701", me),
                    accepted("127.0.0.1:7701", "127.0.0.1:50000", me),
                ],
                "127.0.0.1:7701",
                ours4,
                Verdict::Own,
            ),
            // someone else's connection to the port, or ours without a connection
            (
                vec![accepted("127.0.0.1:7701", "127.0.0.1:50001", 65534)],
                "127.0.0.1:7701",
                ours4,
                Verdict::NoListener,
            ),
            (
                vec![accepted("127.0.0.1:7701", "127.0.0.1:50000", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::NoListener,
            ),
            // our own client end (local = ours) is not the receiving end
            (
                vec![accepted("127.0.0.1:50000", "127.0.0.1:7701", 65534)],
                "127.0.0.1:7701",
                ours4,
                Verdict::NoListener,
            ),
        ];
        for (sockets, target, ours, want) in cases {
            assert_eq!(
                verdict(&sockets, a(target), ours, me),
                want,
                "{sockets:?} {target} {ours:?}"
            );
        }
    }

    #[test]
    fn mismatch_message_names_port_and_uid() {
        let shown = OwnerMismatch {
            port: 7701,
            uid: 65534,
        }
        .to_string();
        assert_eq!(
            shown,
            "port 7701 is held by another user's process, uid 65534; not sending the secret"
        );
    }

    #[test]
    fn own_listener_and_connection_pass_the_live_check() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = listener.local_addr().unwrap();
        let stream = std::net::TcpStream::connect(target).unwrap();
        let ours = stream.local_addr().unwrap();
        let _accepted = listener.accept().unwrap();
        assert_eq!(check_listener_owner(target.ip(), target.port()), Ok(()));
        assert_eq!(check_connection_owner(target, ours), Ok(()));
        if cfg!(target_os = "linux") {
            let own = rustix::process::getuid().as_raw();
            // As `check` does: a reading that raced other sockets is read again.
            let sockets = (0..TABLE_READINGS)
                .map(|_| read_tables().unwrap())
                .find(|s| verdict(s, target, Some(ours), own) != Verdict::NoListener)
                .expect("our own listener and connection in the socket tables");
            assert_eq!(verdict(&sockets, target, Some(ours), own), Verdict::Own);
            // Seen as another user, both the listener and the accepted end are foreign.
            assert_eq!(
                verdict(&sockets, target, Some(ours), own.wrapping_add(1)),
                Verdict::Foreign(own)
            );
        }
    }
}
