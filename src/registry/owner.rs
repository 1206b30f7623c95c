//! Who owns the listening socket a secret is about to be sent to (contract section 6.1).
//!
//! A peer that cannot prove itself (an entry without `proof: true`: the original
//! implementation) is at least checked to be a process of the caller's own user: on
//! Linux, the kernel's socket tables `/proc/net/tcp` and `/proc/net/tcp6` name the uid
//! of every listening socket. A listener of another uid on the target address and port,
//! or a wildcard listener that would also receive a connection to it, refuses the
//! delegation before the secret leaves. The parser ([`parse_listeners`]) and the verdict
//! ([`verdict`]) are pure functions over the table's text, so they are tested with
//! plain values; [`check_listener_owner`] reads the files.
//!
//! Where the check cannot be made (not Linux, the tables unreadable, no matching
//! listener found) it says so at debug level and lets the delegation go on: the check
//! is a second line behind the proof, not a replacement for it.

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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

/// One listening socket of a socket table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// The address it is bound to (unspecified for a wildcard listener).
    pub ip: IpAddr,
    /// The port.
    pub port: u16,
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
    /// Every listener that would receive the connection is the caller's own.
    Own,
    /// A listener of this other uid would (or might) receive it.
    Foreign(u32),
    /// No listener matches: the check cannot be made from these tables.
    NoListener,
}

/// The listening sockets of one socket table's text (`/proc/net/tcp` or
/// `/proc/net/tcp6`; the address width tells which). The header line, sockets in other
/// states and lines that do not parse are skipped.
///
/// Each line is `sl local_address rem_address st tx:rx tr:when retrnsmt uid ...`, where
/// an address is `HEX:PORT`: the IP as 8 (IPv4) or 32 (IPv6) hex digits, each 32-bit
/// word printed as the kernel holds it in memory (little-endian on x86 and arm:
/// 127.0.0.1 is `0100007F`), and the port as 4 hex digits in plain order.
pub fn parse_listeners(text: &str) -> Vec<Listener> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Listener> {
    let fields: Vec<&str> = line.split_whitespace().take(8).collect();
    let [_sl, local, _remote, state, _queues, _timer, _retransmits, uid] = fields[..] else {
        return None;
    };
    if state != TCP_LISTEN {
        return None;
    }
    let (ip_hex, port_hex) = local.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let ip = parse_ip(ip_hex)?;
    let uid = uid.parse::<u32>().ok()?;
    Some(Listener { ip, port, uid })
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

/// The verdict on `target` and `port` from `listeners`: foreign if any listener that
/// would receive the connection belongs to a uid other than `own_uid`.
pub fn verdict(listeners: &[Listener], target: IpAddr, port: u16, own_uid: u32) -> Verdict {
    let mut matched = false;
    for listener in listeners
        .iter()
        .filter(|l| l.port == port && receives(l.ip, target))
    {
        if listener.uid != own_uid {
            return Verdict::Foreign(listener.uid);
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
pub fn check_listener_owner(ip: IpAddr, port: u16) -> Result<(), OwnerMismatch> {
    if !cfg!(target_os = "linux") {
        log::debug!("listener owner of port {port} not checked: not Linux");
        return Ok(());
    }
    let mut listeners = Vec::new();
    let mut readable = false;
    for path in [PROC_NET_TCP, PROC_NET_TCP6] {
        match read_bounded(path) {
            Ok(text) => {
                readable = true;
                listeners.extend(parse_listeners(&text));
            }
            Err(e) => log::debug!("cannot read {path}: {e}"),
        }
    }
    if !readable {
        log::debug!("listener owner of port {port} not checked: no socket table readable");
        return Ok(());
    }
    let own_uid = rustix::process::getuid().as_raw();
    match verdict(&listeners, ip, port, own_uid) {
        Verdict::Own => Ok(()),
        Verdict::Foreign(uid) => Err(OwnerMismatch { port, uid }),
        Verdict::NoListener => {
            log::debug!(
                "listener owner of port {port} not checked: no listener for {ip} in the socket tables"
            );
            Ok(())
        }
    }
}

/// At most [`MAX_PROC_NET_BYTES`] of `path` as text. `files::read_regular_file` won't
/// do: files under /proc report size 0.
fn read_bounded(path: &str) -> std::io::Result<String> {
    let mut bytes = Vec::new();
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

    fn v4(a: [u8; 4]) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(a))
    }

    // The sample lines are in the byte order of a little-endian machine.
    #[cfg(target_endian = "little")]
    #[test]
    fn parse_listeners_table() {
        let tcp = [
            HEADER,
            // 127.0.0.1:7701 listening, uid 1000
            "   0: 0100007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 41234 1 0000000000000000 100 0 0 10 0",
            // 0.0.0.0:8080 listening, uid 65534
            "   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 41235 1 0000000000000000 100 0 0 10 0",
            // 127.0.0.1:7701 -> 127.0.0.1:50000 established (01): not a listener
            "   2: 0100007F:1E15 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 41236 1 0000000000000000 20 4 30 10 -1",
            // 127.0.0.1:7702 in TIME_WAIT (06)
            "   3: 0100007F:1E16 0100007F:C351 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000",
            // 192.168.1.5:22 listening, uid 0
            "   4: 0501A8C0:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41237 1 0000000000000000 100 0 0 10 0",
            // malformed lines
            "   5: 0100007F 00000000:0000 0A",
            "   6: ZZ00007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
            "   7: 0100007F:1E15 00000000:0000 0A 00000000:00000000 00:00000000 00000000  -1",
            "",
        ]
        .join("\n");
        assert_eq!(
            parse_listeners(&tcp),
            vec![
                Listener {
                    ip: v4([127, 0, 0, 1]),
                    port: 7701,
                    uid: 1000
                },
                Listener {
                    ip: v4([0, 0, 0, 0]),
                    port: 8080,
                    uid: 65534
                },
                Listener {
                    ip: v4([192, 168, 1, 5]),
                    port: 22,
                    uid: 0
                },
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
            // [::1]:7701 established
            "   3: 00000000000000000000000001000000:1E15 00000000000000000000000001000000:C350 01 00000000:00000000 00:00000000 00000000  1000        0 51237 1 0000000000000000 20 4 30 10 -1",
            // 24 hex digits: neither width
            "   4: 000000000000000001000000:1E15 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
        ]
        .join("\n");
        assert_eq!(
            parse_listeners(&tcp6),
            vec![
                Listener {
                    ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
                    port: 7701,
                    uid: 1000
                },
                Listener {
                    ip: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    port: 7703,
                    uid: 65534
                },
                Listener {
                    ip: IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()),
                    port: 7704,
                    uid: 65534
                },
            ]
        );
        assert_eq!(parse_listeners(""), vec![]);
        assert_eq!(parse_listeners(HEADER), vec![]);
    }

    #[test]
    fn verdict_table() {
        let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let any4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let any6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        let other4 = v4([192, 168, 1, 5]);
        let l = |ip, port, uid| Listener { ip, port, uid };
        let me = 1000;
        // (listeners, target, port, verdict)
        let cases: Vec<(Vec<Listener>, IpAddr, u16, Verdict)> = vec![
            (vec![l(lo4, 7701, me)], lo4, 7701, Verdict::Own),
            (
                vec![l(lo4, 7701, 65534)],
                lo4,
                7701,
                Verdict::Foreign(65534),
            ),
            (
                vec![l(lo6, 7701, 65534)],
                lo6,
                7701,
                Verdict::Foreign(65534),
            ),
            (vec![l(lo6, 7701, me)], lo6, 7701, Verdict::Own),
            // another port, another address: no match
            (vec![l(lo4, 7702, 65534)], lo4, 7701, Verdict::NoListener),
            (vec![l(other4, 7701, 65534)], lo4, 7701, Verdict::NoListener),
            // the other family's loopback does not receive it
            (vec![l(lo6, 7701, 65534)], lo4, 7701, Verdict::NoListener),
            (vec![l(lo4, 7701, 65534)], lo6, 7701, Verdict::NoListener),
            // wildcards of the same family receive it
            (
                vec![l(any4, 7701, 65534)],
                lo4,
                7701,
                Verdict::Foreign(65534),
            ),
            (
                vec![l(any6, 7701, 65534)],
                lo6,
                7701,
                Verdict::Foreign(65534),
            ),
            // an IPv4 wildcard does not receive IPv6
            (vec![l(any4, 7701, 65534)], lo6, 7701, Verdict::NoListener),
            // a dual-stack IPv6 wildcard, or a mapped address, may receive IPv4
            (
                vec![l(any6, 7701, 65534)],
                lo4,
                7701,
                Verdict::Foreign(65534),
            ),
            (
                vec![l(mapped, 7701, 65534)],
                lo4,
                7701,
                Verdict::Foreign(65534),
            ),
            // own specific listener plus a foreign wildcard: refused
            (
                vec![l(lo4, 7701, me), l(any6, 7701, 0)],
                lo4,
                7701,
                Verdict::Foreign(0),
            ),
            (
                vec![l(lo4, 7701, me), l(any4, 7701, me)],
                lo4,
                7701,
                Verdict::Own,
            ),
            (vec![], lo4, 7701, Verdict::NoListener),
        ];
        for (listeners, target, port, want) in cases {
            assert_eq!(
                verdict(&listeners, target, port, me),
                want,
                "{listeners:?} {target}:{port}"
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
    fn own_listener_passes_the_live_check() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(
            check_listener_owner(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            Ok(())
        );
        if cfg!(target_os = "linux") {
            let text = read_bounded(PROC_NET_TCP).unwrap();
            let own = rustix::process::getuid().as_raw();
            assert_eq!(
                verdict(
                    &parse_listeners(&text),
                    IpAddr::V4(Ipv4Addr::LOCALHOST),
                    port,
                    own
                ),
                Verdict::Own
            );
        }
    }
}
