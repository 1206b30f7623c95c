//! Who owns the listening socket a secret is about to be sent to (contract section 6.1).
//!
//! A peer that cannot prove itself (an entry without `proof: true`: the original
//! implementation) is at least checked to be a process of the caller's own user: on
//! Linux, the kernel's socket tables `/proc/net/tcp` and `/proc/net/tcp6` name the uid
//! of every socket. A listener of another uid on the target address and port, or a
//! wildcard listener that would also receive a connection to it, refuses the
//! delegation before the secret leaves. So does another uid on the accepted end of
//! the very connection the secret would go out on: a squatter that closes its listener
//! right after answering health still holds that socket, and the tables list it.
//!
//! That accepted end is always listed while the connection is open, so the check of a
//! connection decides: if it is not found (after [`TABLE_READINGS`] readings, within
//! [`OWNER_CHECK_TIME_LIMIT`]), who holds the port cannot be told and the secret is not
//! sent. A table made huge by another user's sockets cannot hide it: the tables are read
//! whole, a line at a time, and only the lines on the target port are kept.
//!
//! The verdict ([`read_verdict`]) works on any readers of the tables' text, so it is
//! tested without the kernel; [`check_owner`] reads the files. Where no
//! table can be read (a sandbox without /proc) the check fails closed
//! ([`OwnerRefusal::TablesUnreadable`]); only off Linux, where there are no such tables,
//! does it say so at debug level and let the delegation go on.

use std::fmt;
use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// The kernel's IPv4 socket table.
pub const PROC_NET_TCP: &str = "/proc/net/tcp";
/// The kernel's IPv6 socket table (also lists IPv4-mapped and dual-stack listeners).
pub const PROC_NET_TCP6: &str = "/proc/net/tcp6";

/// The longest a check may spend reading the socket tables, all readings together:
/// 5 s. Reading is streamed, so no size cap is needed to bound memory; this bounds the
/// time another user can make a check take by opening sockets. A check of a connection
/// that runs out of it has not found the connection's other end and refuses.
///
/// Measured by hand (2 cores, 2026-12): a real `/proc/net/tcp` of 21.3 MB (139,300
/// listeners of 7 processes, the attack review's flood) takes 0.5 s for the kernel to
/// write (`cat`) and 0.56-0.67 s for one full reading through [`read_verdict`] (release;
/// 0.8-0.9 s debug); parsing alone is 25 ms for 18 MB. So a table three times that
/// size still gets a full reading; past that, legacy peers are refused, never trusted.
pub const OWNER_CHECK_TIME_LIMIT: Duration = Duration::from_secs(5);

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

/// Why a connection's check refuses to send the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnerRefusal {
    /// A socket of another user would receive, or holds, the connection.
    Foreign {
        /// The target port.
        port: u16,
        /// The uid holding it.
        uid: u32,
    },
    /// The tables could be read but do not list the connection's other end (or did not
    /// within the check's time limit, 5 s): who holds the port cannot be told.
    Unknown {
        /// The target port.
        port: u16,
    },
    /// No socket table could be read (a sandbox without /proc): who holds the port
    /// cannot be told, so the check fails closed.
    TablesUnreadable {
        /// The target port.
        port: u16,
    },
}

impl fmt::Display for OwnerRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Foreign { port, uid } => write!(
                f,
                "port {port} is held by another user's process, uid {uid}; not sending the secret"
            ),
            Self::Unknown { port } => write!(
                f,
                "cannot tell who holds port {port}; not sending the secret"
            ),
            Self::TablesUnreadable { port } => write!(
                f,
                "cannot tell who holds port {port}: neither {PROC_NET_TCP} nor {PROC_NET_TCP6} \
                 can be read; not sending the secret to a peer that cannot prove itself \
                 (mount /proc, or upgrade the peer to one that answers the health proof)"
            ),
        }
    }
}

impl std::error::Error for OwnerRefusal {}

/// What the socket tables say of a target address and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every socket that would receive the connection is the caller's own.
    Own,
    /// A socket of this other uid would (or might) receive it.
    Foreign(u32),
    /// Nothing that decides is in these tables: without a connection, no listener
    /// matches (the port is not held); with one, its accepted end is not listed (who
    /// would receive the secret cannot be told).
    Unlisted,
}

/// One line of a socket table (`/proc/net/tcp` or `/proc/net/tcp6`; the address width
/// tells which); `None` for the header line and lines that do not parse.
///
/// Each line is `sl local_address rem_address st tx:rx tr:when retrnsmt uid ...`, where
/// an address is `HEX:PORT`: the IP as 8 (IPv4) or 32 (IPv6) hex digits, each 32-bit
/// word printed as the kernel holds it in memory (little-endian on x86 and arm:
/// 127.0.0.1 is `0100007F`), and the port as 4 hex digits in plain order.
fn parse_line(line: &str) -> Option<Socket> {
    // sl, local, remote, state, then queues, timer and retransmits before the uid.
    let mut fields = line.split_ascii_whitespace().skip(1);
    Some(Socket {
        local: parse_address(fields.next()?)?,
        remote: parse_address(fields.next()?)?,
        listening: fields.next()? == TCP_LISTEN,
        uid: fields.nth(3)?.parse::<u32>().ok()?,
    })
}

/// The local port of a table line (its second field's `:PORT`), without parsing the rest.
fn local_port(line: &str) -> Option<u16> {
    let (_, port_hex) = line.split_ascii_whitespace().nth(1)?.split_once(':')?;
    u16::from_str_radix(port_hex, 16).ok()
}

/// `HEX:PORT` of the table: the address as 8 hex digits for IPv4, 32 for IPv6, in
/// 32-bit words of the machine's byte order.
fn parse_address(field: &str) -> Option<SocketAddr> {
    let (hex, port_hex) = field.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    if !matches!(hex.len(), 8 | 32) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut octets = [0u8; 16];
    for (i, word) in octets.chunks_exact_mut(4).take(hex.len() / 8).enumerate() {
        let digits = u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok()?;
        word.copy_from_slice(&digits.to_ne_bytes());
    }
    let [a, b, c, d, ..] = octets;
    let ip = match hex.len() {
        8 => IpAddr::from([a, b, c, d]),
        _ => IpAddr::from(octets),
    };
    Some(SocketAddr::new(ip, port))
}

/// `addr` with an IPv4-mapped IPv6 address written as IPv4, as the other end sees it.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The longest line kept from a socket table: the kernel's lines are about 150 bytes
/// (IPv6: 180); a longer one is not a socket line and is skipped.
const MAX_TABLE_LINE_BYTES: usize = 512;

/// The verdict from socket tables given as readers, read a line at a time and in full
/// (memory stays at one line whatever the tables' size), stopping early at a foreign
/// socket. `None` when `deadline` passes first.
///
/// # Errors
/// A read error of any table.
pub fn read_verdict<R: BufRead>(
    tables: impl IntoIterator<Item = R>,
    target: SocketAddr,
    ours: Option<SocketAddr>,
    own_uid: u32,
    deadline: Instant,
) -> std::io::Result<Option<Verdict>> {
    /// Lines read between looks at the clock.
    const LINES_PER_CLOCK_LOOK: usize = 4096;
    // Whether an own socket that decides was seen: the accepted end of our connection
    // if there is one, else a listener that would receive it.
    let mut own = false;
    for table in tables {
        for (count, line) in table.split(b'\n').enumerate() {
            let line = line?;
            if (count + 1).is_multiple_of(LINES_PER_CLOCK_LOOK) && Instant::now() >= deadline {
                return Ok(None);
            }
            // Most lines are of other ports: their local port alone rules them out.
            let socket = std::str::from_utf8(&line)
                .ok()
                .filter(|text| text.len() <= MAX_TABLE_LINE_BYTES)
                .filter(|text| local_port(text) == Some(target.port()))
                .and_then(parse_line);
            let Some(socket) = socket else { continue };
            let receiving = if socket.listening {
                // The same address, the wildcard of its family, an IPv4-mapped IPv6
                // form of it, or, for an IPv4 target, the IPv6 wildcard (a dual-stack
                // listener; the tables do not say whether it is IPv6-only, so it counts).
                let listener = socket.local.ip().to_canonical();
                let wildcard =
                    listener.is_unspecified() && (listener.is_ipv6() || target.is_ipv4());
                wildcard || listener == target.ip().to_canonical()
            } else {
                ours.is_some_and(|ours| {
                    canonical(socket.local) == canonical(target)
                        && canonical(socket.remote) == canonical(ours)
                })
            };
            if receiving && socket.uid != own_uid {
                return Ok(Some(Verdict::Foreign(socket.uid)));
            }
            // With a connection, only its accepted end decides.
            own |= receiving && (ours.is_none() || !socket.listening);
        }
    }
    Ok(Some(if own { Verdict::Own } else { Verdict::Unlisted }))
}

/// Checks, for the open connection from `ours` to `target`, that its accepted end and
/// every listener that would receive a connection to `target` belong to the caller's
/// own uid; without a connection, that every listener that would receive one does (a
/// port no one listens on passes). Only off Linux does it say so at debug level and
/// return `Ok`.
///
/// # Errors
/// A socket of another uid holds the connection or the port
/// ([`OwnerRefusal::Foreign`]), the tables do not list the connection's accepted
/// end within [`TABLE_READINGS`] readings and [`OWNER_CHECK_TIME_LIMIT`]
/// ([`OwnerRefusal::Unknown`]), or no table can be read
/// ([`OwnerRefusal::TablesUnreadable`]).
pub fn check_owner(target: SocketAddr, ours: Option<SocketAddr>) -> Result<(), OwnerRefusal> {
    if !cfg!(target_os = "linux") {
        log::debug!("owner of port {} not checked: not Linux", target.port());
        return Ok(());
    }
    let own_uid = rustix::process::getuid().as_raw();
    check_tables(target, ours, own_uid, open_tables)
}

/// [`check_owner`] on the tables `open` gives at each reading (the kernel's, or a test's).
fn check_tables<R: BufRead>(
    target: SocketAddr,
    ours: Option<SocketAddr>,
    own_uid: u32,
    open: impl Fn() -> Vec<R>,
) -> Result<(), OwnerRefusal> {
    let port = target.port();
    let limit = OWNER_CHECK_TIME_LIMIT;
    let deadline = Instant::now() + limit;
    // The kernel writes these tables a bucket at a time and resumes a later read by
    // offset, so sockets opened or closed meanwhile can hide an entry from one reading:
    // a socket not found is looked for again before it counts as not listed. Only a
    // last reading that found no listener (and no connection to find) passes.
    let mut free = false;
    for _ in 0..TABLE_READINGS {
        let tables = open();
        if tables.is_empty() {
            // Failing open here sent the secret to another user's squatter.
            return Err(OwnerRefusal::TablesUnreadable { port });
        }
        free = match read_verdict(tables, target, ours, own_uid, deadline) {
            Ok(Some(Verdict::Own)) => return Ok(()),
            Ok(Some(Verdict::Foreign(uid))) => return Err(OwnerRefusal::Foreign { port, uid }),
            Ok(Some(_)) => ours.is_none(),
            Ok(None) => {
                log::debug!("owner of port {port}: socket tables not read within {limit:?}");
                free = false;
                break;
            }
            Err(e) => {
                log::debug!("owner of port {port}: reading the socket tables failed: {e}");
                false
            }
        }
    }
    if free {
        return Ok(());
    }
    log::debug!("owner of port {port} unknown: {target} <- {ours:?} not in the socket tables");
    Err(OwnerRefusal::Unknown { port })
}

/// How many times the socket tables are read before a socket counts as not listed.
pub const TABLE_READINGS: usize = 3;

/// Bytes of a socket table buffered per read: a reading in few large reads gives the
/// kernel few chances to shift entries between them.
const TABLE_READ_CHUNK: usize = 256 * 1024;

/// Both socket tables that can be opened, buffered (none when neither can).
/// `files::read_regular_file` won't do: files under /proc report size 0.
fn open_tables() -> Vec<std::io::BufReader<std::fs::File>> {
    [PROC_NET_TCP, PROC_NET_TCP6]
        .into_iter()
        .filter_map(|path| {
            let file = std::fs::File::open(path);
            file.inspect_err(|e| log::debug!("cannot read {path}: {e}"))
                .ok()
        })
        .map(|file| std::io::BufReader::with_capacity(TABLE_READ_CHUNK, file))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sockets of one socket table's text (`/proc/net/tcp` or `/proc/net/tcp6`; the
    /// address width tells which). The header line and lines that do not parse are skipped.
    ///
    /// Each line is `sl local_address rem_address st tx:rx tr:when retrnsmt uid ...`, where
    /// an address is `HEX:PORT`: the IP as 8 (IPv4) or 32 (IPv6) hex digits, each 32-bit
    /// word printed as the kernel holds it in memory (little-endian on x86 and arm:
    /// 127.0.0.1 is `0100007F`), and the port as 4 hex digits in plain order.
    fn parse_sockets(text: &str) -> Vec<Socket> {
        text.lines().filter_map(parse_line).collect()
    }

    /// The verdict on a connection to `target` from `sockets`: foreign if any socket that
    /// would receive it belongs to a uid other than `own_uid`. Those are the listeners on
    /// `target`'s port whose address would receive it, and, when the connection is made
    /// (`ours` is its local end), the accepted socket at its other end, which must then be
    /// among `sockets` for the verdict to be [`Verdict::Own`].
    fn verdict(
        sockets: &[Socket],
        target: SocketAddr,
        ours: Option<SocketAddr>,
        own_uid: u32,
    ) -> Verdict {
        let table: String = sockets.iter().enumerate().map(line).collect();
        let far = Instant::now() + Duration::from_secs(3600);
        let read = read_verdict([table.as_bytes()], target, ours, own_uid, far);
        read.unwrap().unwrap()
    }

    /// A table line in the kernel's format for `socket` (words in the machine's byte
    /// order, as the kernel prints them).
    fn line((sl, socket): (usize, &Socket)) -> String {
        let hex = |addr: SocketAddr| {
            let octets = match addr.ip() {
                IpAddr::V4(ip) => ip.octets().to_vec(),
                IpAddr::V6(ip) => ip.octets().to_vec(),
            };
            let words = octets.chunks(4).map(|word| {
                let word = u32::from_ne_bytes(word.try_into().unwrap());
                format!("{word:08X}")
            });
            format!("{}:{:04X}", words.collect::<String>(), addr.port())
        };
        let (local, remote) = (hex(socket.local), hex(socket.remote));
        let state = if socket.listening { "0A" } else { "01" };
        let uid = socket.uid;
        format!(
            "{sl:>4}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {} 1 0000000000000000 100 0 0 10 0\n",
            40000 + sl
        )
    }

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
                Verdict::Unlisted,
            ),
            (
                vec![listen("192.168.1.5:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Unlisted,
            ),
            // the other family's loopback does not receive it
            (
                vec![listen("[::1]:7701", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Unlisted,
            ),
            (
                vec![listen("127.0.0.1:7701", 65534)],
                "[::1]:7701",
                None,
                Verdict::Unlisted,
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
                Verdict::Unlisted,
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
            (vec![], "127.0.0.1:7701", None, Verdict::Unlisted),
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
                Verdict::Unlisted,
            ),
            (
                vec![accepted("127.0.0.1:7701", "127.0.0.1:50000", 65534)],
                "127.0.0.1:7701",
                None,
                Verdict::Unlisted,
            ),
            // our own client end (local = ours) is not the receiving end
            (
                vec![accepted("127.0.0.1:50000", "127.0.0.1:7701", 65534)],
                "127.0.0.1:7701",
                ours4,
                Verdict::Unlisted,
            ),
            // an own listener but no accepted end of our connection: undecided
            (
                vec![listen("127.0.0.1:7701", me)],
                "127.0.0.1:7701",
                ours4,
                Verdict::Unlisted,
            ),
            (vec![], "127.0.0.1:7701", ours4, Verdict::Unlisted),
        ];
        for (sockets, target, ours, want) in cases {
            assert_eq!(
                verdict(&sockets, a(target), ours, me),
                want,
                "{sockets:?} {target} {ours:?}"
            );
        }
    }

    /// A table line in the kernel's format for an IPv4 socket (little-endian words).
    #[cfg(target_endian = "little")]
    fn line4(sl: usize, local: SocketAddr, remote: SocketAddr, state: &str, uid: u32) -> String {
        let hex = |addr: SocketAddr| match addr.ip() {
            IpAddr::V4(ip) => format!(
                "{:08X}:{:04X}",
                u32::from_ne_bytes(ip.octets()),
                addr.port()
            ),
            IpAddr::V6(_) => unreachable!("IPv4 lines only"),
        };
        format!(
            "{sl:>4}: {} {} {state} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {} 1 0000000000000000 100 0 0 10 0\n",
            hex(local),
            hex(remote),
            40000 + sl
        )
    }

    /// A table of `flood` listeners of uid 65534 on 127.0.10.x ports 20000.., then
    /// `last` (the kernel lists listeners first; a flood of them pushes the rest far).
    #[cfg(target_endian = "little")]
    fn flooded_table(flood: usize, last: &[String]) -> Vec<u8> {
        let mut text = String::from(HEADER);
        text.push('\n');
        for i in 0..flood {
            let ip = std::net::Ipv4Addr::new(127, 0, 10, u8::try_from(i / 20_000 + 1).unwrap());
            let port = u16::try_from(20_000 + i % 20_000).unwrap();
            let local = SocketAddr::new(IpAddr::V4(ip), port);
            text.push_str(&line4(i, local, a("0.0.0.0:0"), "0A", 65534));
        }
        for line in last {
            text.push_str(line);
        }
        text.into_bytes()
    }

    // The attack review's flood: other users' sockets made the table longer than the
    // 16 MiB then read, the squatter's socket was past the cut, "no matching socket" let
    // the secret go. Now the whole table is read a line at a time, and a connection whose
    // other end is not found is refused.
    #[cfg(target_endian = "little")]
    #[test]
    fn bug_a_flooded_socket_table_hid_a_squatter() {
        let target = a("127.0.0.1:7701");
        let ours = a("127.0.0.1:50000");
        let me = 1000;
        let far = Instant::now() + Duration::from_secs(3600);
        let end = |uid| line4(300_000, target, ours, "01", uid);
        // 140,000 lines: about 21 MB, as in the review, past the old 16 MiB cap.
        let mut table = flooded_table(140_000, &[]);
        assert!(table.len() > 16 * 1024 * 1024, "{}", table.len());
        let flood = table.len();
        table.extend_from_slice(end(65534).as_bytes());
        let tables = [std::io::Cursor::new(&table[..])];
        assert_eq!(
            read_verdict(tables, target, Some(ours), me, far).unwrap(),
            Some(Verdict::Foreign(65534))
        );
        // Our own peer's accepted end at the very end is found too.
        table.truncate(flood);
        table.extend_from_slice(end(me).as_bytes());
        let tables = [std::io::Cursor::new(&table[..])];
        assert_eq!(
            read_verdict(tables, target, Some(ours), me, far).unwrap(),
            Some(Verdict::Own)
        );
        // A reading that runs out of time decides nothing (the check then refuses).
        let past = Instant::now();
        let tables = [std::io::Cursor::new(&table[..])];
        assert_eq!(
            read_verdict(tables, target, Some(ours), me, past).unwrap(),
            None
        );
    }

    // Before: no socket found on the port meant "cannot check" and the secret went out.
    // The accepted end of an open connection is always listed, so its absence refuses.
    #[cfg(target_endian = "little")]
    #[test]
    fn bug_a_connection_missing_from_the_socket_tables_still_got_the_secret() {
        let target = a("127.0.0.1:7701");
        let ours = a("127.0.0.1:50000");
        let me = 1000;
        let far = Instant::now() + Duration::from_secs(3600);
        // Our own listener, someone's connection from another port, no accepted end of ours.
        let text = flooded_table(
            10,
            &[
                line4(10, target, a("0.0.0.0:0"), "0A", me),
                line4(11, target, a("127.0.0.1:50001"), "01", me),
            ],
        );
        let tcp6 = HEADER6.as_bytes();
        let tables = [std::io::Cursor::new(&text[..]), std::io::Cursor::new(tcp6)];
        assert_eq!(
            read_verdict(tables, target, Some(ours), me, far).unwrap(),
            Some(Verdict::Unlisted)
        );
        // Without a connection (a start-up's look at its port) the own listener passes.
        let tables = [std::io::Cursor::new(&text[..])];
        assert_eq!(
            read_verdict(tables, target, None, me, far).unwrap(),
            Some(Verdict::Own)
        );
        assert_eq!(
            OwnerRefusal::Unknown { port: 7701 }.to_string(),
            "cannot tell who holds port 7701; not sending the secret"
        );
    }

    #[test]
    fn mismatch_message_names_port_and_uid() {
        let shown = OwnerRefusal::Foreign {
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
        assert_eq!(check_owner(target, None), Ok(()));
        assert_eq!(check_owner(target, Some(ours)), Ok(()));
        if cfg!(target_os = "linux") {
            let own = rustix::process::getuid().as_raw();
            let far = Instant::now() + Duration::from_secs(3600);
            let live = |uid| read_verdict(open_tables(), target, Some(ours), uid, far);
            // As `check_owner` does: a reading that raced other sockets is read again.
            let found = (0..TABLE_READINGS)
                .map(|_| live(own).unwrap().unwrap())
                .find(|v| *v != Verdict::Unlisted);
            assert_eq!(found, Some(Verdict::Own));
            // Seen as another user, the listener and the accepted end are foreign.
            assert_eq!(
                live(own.wrapping_add(1)).unwrap(),
                Some(Verdict::Foreign(own))
            );
        }
    }

    /// Where /proc/net/tcp* could not be read (a sandbox without /proc), the check
    /// let the delegation go on, and the secret went to another user's squatter.
    #[test]
    fn bug_unreadable_socket_tables_let_the_secret_go_to_a_peer_that_cannot_prove_itself() {
        let target = a("127.0.0.1:7701");
        let none = || Vec::<std::io::Cursor<&[u8]>>::new();
        for ours in [None, Some(a("127.0.0.1:50000"))] {
            assert_eq!(
                check_tables(target, ours, 1000, none),
                Err(OwnerRefusal::TablesUnreadable { port: 7701 })
            );
        }
        let text = OwnerRefusal::TablesUnreadable { port: 7701 }.to_string();
        assert!(text.contains("port 7701"), "{text}");
        assert!(text.contains("not sending the secret"), "{text}");
        assert!(text.contains("mount /proc"), "{text}");
        assert!(text.contains("health proof"), "{text}");
        // Readable tables still decide as before.
        let own = || vec![std::io::Cursor::new(HEADER.as_bytes())];
        assert_eq!(check_tables(target, None, 1000, own), Ok(()));
    }
}
