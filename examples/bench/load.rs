//! The load generator: a minimal blocking HTTP/1.1 client over loopback, closed-loop
//! runs on std threads, and latency percentiles from sorted samples.
//!
//! A closed-loop client sends one request, waits for the whole answer, and only then
//! sends the next. Only requests that completed with status 200 inside the measured
//! window count, towards throughput and towards latency.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Read and write timeout of every client socket: a stuck server fails a request
/// instead of hanging the bench.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response the client accepts (loopbus's are well under 1 KiB here).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// Most requests one client sends in one run, whatever the duration.
const MAX_REQUESTS_PER_CLIENT: u64 = 5_000_000;
/// After this many failed requests a client gives up for the rest of the run.
const MAX_ERRORS_PER_CLIENT: u64 = 1_000;
/// Pause after a failed request, so that a refusing server is not spun against.
const ERROR_BACKOFF: Duration = Duration::from_millis(1);
/// How often the peak RSS of the server is sampled during a run.
const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);
/// Extra time, past the end of the window, that a run waits for its clients.
const JOIN_GRACE: Duration = Duration::from_secs(10);
/// Clock ticks per second of the CPU times in `/proc/PID/stat` (`USER_HZ`, 100 on
/// every Linux ABI that exports it to user space).
const USER_HZ: u64 = 100;
/// Tolerance when turning a percentile into a rank.
const RANK_EPSILON: f64 = 1e-9;
/// Stack size of client threads; they keep little on the stack.
const CLIENT_STACK_BYTES: usize = 128 * 1024;

/// One decoded response: the status and where the body sits in the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    head_len: usize,
    total_len: usize,
}

impl Answer {
    /// The whole response's size in bytes, head included.
    pub fn size(&self) -> usize {
        self.total_len
    }
}

/// A client connection with its own response buffer.
pub struct Conn {
    stream: TcpStream,
    buf: Box<[u8]>,
    filled: usize,
}

impl Conn {
    /// Connects to `addr` with [`IO_TIMEOUT`] on reads and writes and `TCP_NODELAY`.
    ///
    /// # Errors
    /// The connection or a socket option failed.
    pub fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: vec![0u8; MAX_RESPONSE_BYTES].into_boxed_slice(),
            filled: 0,
        })
    }

    /// Replaces [`IO_TIMEOUT`] on reads, for answers known to take longer.
    ///
    /// # Errors
    /// The socket option failed.
    pub fn set_read_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(timeout))
    }

    /// Sends `request` (one complete HTTP/1.1 request) and reads the whole answer.
    ///
    /// # Errors
    /// I/O failure, early EOF, a malformed or oversized answer, or trailing bytes.
    pub fn exchange(&mut self, request: &[u8]) -> io::Result<Answer> {
        self.stream.write_all(request)?;
        self.read_answer()
    }

    /// The body of the last answer read.
    pub fn body(&self, answer: &Answer) -> &[u8] {
        &self.buf[answer.head_len..answer.total_len]
    }

    /// Reads one response framed by `Content-Length`.
    fn read_answer(&mut self) -> io::Result<Answer> {
        self.filled = 0;
        let mut head_len = None;
        let mut total_len = usize::MAX;
        // Each pass reads at least one byte, so MAX_RESPONSE_BYTES passes bound it.
        for _ in 0..MAX_RESPONSE_BYTES {
            if self.filled >= total_len {
                break;
            }
            if self.filled == self.buf.len() {
                return Err(malformed("response larger than the client buffer"));
            }
            let n = self.stream.read(&mut self.buf[self.filled..])?;
            if n == 0 {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "connection closed mid-response",
                ));
            }
            let scan_from = self.filled.saturating_sub(3);
            self.filled += n;
            if head_len.is_none() {
                if let Some(pos) = find(&self.buf[scan_from..self.filled], b"\r\n\r\n") {
                    let end = scan_from + pos + 4;
                    head_len = Some(end);
                    total_len = end + content_length(&self.buf[..end])?;
                }
            }
        }
        let head_len = head_len.ok_or_else(|| malformed("no end of head"))?;
        if self.filled != total_len {
            return Err(malformed("bytes after the response"));
        }
        Ok(Answer {
            status: status_code(&self.buf[..head_len])?,
            head_len,
            total_len,
        })
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, what.to_owned())
}

/// Position of `needle` in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn status_code(head: &[u8]) -> io::Result<u16> {
    let digits = head
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| head.strip_prefix(b"HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .ok_or_else(|| malformed("bad status line"))?;
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("bad status code"))
}

/// The `Content-Length` of a response head; every server here sends one.
fn content_length(head: &[u8]) -> io::Result<usize> {
    const NAME: &[u8] = b"content-length:";
    head.split(|b| *b == b'\n')
        .find(|line| line.len() > NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME))
        .and_then(|line| std::str::from_utf8(&line[NAME.len()..]).ok())
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| malformed("no Content-Length"))
}

/// How clients reach the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each client keeps one connection open for the whole run.
    KeepAlive,
    /// Each request opens a new connection (and asks the server to close it).
    NewConnection,
}

/// One measured point: who to load, with what, and how.
#[derive(Debug, Clone)]
pub struct Load {
    /// The server.
    pub addr: SocketAddr,
    /// The complete request each client sends, again and again.
    pub request: Arc<[u8]>,
    /// Closed-loop clients running at once.
    pub clients: usize,
    /// Keep-alive or a new connection per request.
    pub mode: Mode,
    /// Time before the window, whose requests are not counted.
    pub warmup: Duration,
    /// The measured window.
    pub window: Duration,
    /// A process whose peak RSS to sample during the window.
    pub rss_pid: Option<u32>,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Requests completed with 200 inside the window.
    pub completed: u64,
    /// Requests that failed inside the window (I/O error or a status other than 200).
    pub errors: u64,
    /// Length of the window.
    pub window: Duration,
    /// Latency of every counted request in nanoseconds, sorted.
    pub latencies_ns: Vec<u64>,
    /// Peak VmRSS of `rss_pid` during the window, in KiB.
    pub peak_rss_kib: Option<u64>,
    /// CPU time (user + system) `rss_pid` used during the window, in nanoseconds.
    pub server_cpu_ns: Option<u64>,
}

impl Stats {
    /// Completed requests per second.
    pub fn rps(&self) -> f64 {
        self.completed as f64 / self.window.as_secs_f64()
    }

    /// Server CPU time per completed request, if the server's CPU time was measured.
    pub fn cpu_per_request(&self) -> Option<Duration> {
        let ns = self.server_cpu_ns?;
        (self.completed > 0).then(|| Duration::from_nanos(ns / self.completed))
    }

    /// The `p`-th percentile (nearest rank), if anything was measured.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        percentile(&self.latencies_ns, p).map(Duration::from_nanos)
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    // The epsilon keeps float noise (99.9% of 1,000 = 999.0000000000001) off the rank.
    let rank = (p / 100.0 * sorted.len() as f64 - RANK_EPSILON).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of unsorted durations.
pub fn median(samples: &[Duration]) -> Option<Duration> {
    let mut ns: Vec<u64> = samples
        .iter()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .collect();
    ns.sort_unstable();
    percentile(&ns, 50.0).map(Duration::from_nanos)
}

/// What one client thread brings back.
struct ClientReport {
    latencies_ns: Vec<u64>,
    errors: u64,
}

/// Runs `load` to completion and returns its statistics.
///
/// # Errors
/// A client could not open its keep-alive connection, or a client thread could not
/// be started or did not finish.
pub fn run(load: &Load) -> Result<Stats, String> {
    let barrier = Arc::new(Barrier::new(load.clients + 1));
    let mut handles = Vec::with_capacity(load.clients);
    for index in 0..load.clients {
        let conn = match load.mode {
            Mode::KeepAlive => Some(
                Conn::connect(load.addr)
                    .map_err(|e| format!("client {index}: cannot connect: {e}"))?,
            ),
            Mode::NewConnection => None,
        };
        let barrier = Arc::clone(&barrier);
        let load = load.clone();
        let handle = thread::Builder::new()
            .name(format!("client-{index}"))
            .stack_size(CLIENT_STACK_BYTES)
            .spawn(move || {
                barrier.wait();
                client(&load, conn)
            })
            .map_err(|e| format!("cannot start client thread {index}: {e}"))?;
        handles.push(handle);
    }
    barrier.wait();
    let started = Instant::now();
    let window_start = started + load.warmup;
    let window_end = window_start + load.window;
    let (peak_rss_kib, server_cpu_ns) = sample_server(load.rss_pid, window_start, window_end);
    let give_up = window_end + JOIN_GRACE;
    let mut stats = Stats {
        window: load.window,
        peak_rss_kib,
        server_cpu_ns,
        ..Stats::default()
    };
    for handle in handles {
        while !handle.is_finished() && Instant::now() < give_up {
            thread::sleep(RSS_SAMPLE_INTERVAL);
        }
        if !handle.is_finished() {
            return Err("a client thread did not finish in time".to_owned());
        }
        let report = handle
            .join()
            .map_err(|_| "a client thread panicked".to_owned())?;
        stats.completed += report.latencies_ns.len() as u64;
        stats.errors += report.errors;
        stats.latencies_ns.extend(report.latencies_ns);
    }
    stats.latencies_ns.sort_unstable();
    Ok(stats)
}

/// Samples the VmRSS of `pid` until `end`, keeping the peak seen inside the window,
/// and the CPU time it used from the first sample inside the window to `end`.
fn sample_server(pid: Option<u32>, start: Instant, end: Instant) -> (Option<u64>, Option<u64>) {
    let Some(pid) = pid else {
        return (None, None);
    };
    let mut peak = None;
    let mut cpu_at_start = None;
    while Instant::now() < end {
        thread::sleep(RSS_SAMPLE_INTERVAL);
        if Instant::now() >= start {
            cpu_at_start = cpu_at_start.or_else(|| cpu_ticks(pid));
            if let Some(kib) = rss_kib(pid) {
                peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
            }
        }
    }
    let used = cpu_at_start
        .zip(cpu_ticks(pid))
        .map(|(a, b)| b.saturating_sub(a) * (1_000_000_000 / USER_HZ));
    (peak, used)
}

/// User plus system CPU time of `pid` in clock ticks, from /proc (the fields after the
/// command name, which may itself hold spaces and parentheses).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// VmRSS of `pid` in KiB, from /proc.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// One closed-loop client: the window is computed from the instant all clients were
/// released together.
fn client(load: &Load, mut conn: Option<Conn>) -> ClientReport {
    let started = Instant::now();
    let window_start = started + load.warmup;
    let window_end = window_start + load.window;
    let mut report = ClientReport {
        latencies_ns: Vec::new(),
        errors: 0,
    };
    let mut failures = 0u64;
    for _ in 0..MAX_REQUESTS_PER_CLIENT {
        let sent = Instant::now();
        if sent >= window_end {
            break;
        }
        let outcome = match load.mode {
            Mode::KeepAlive => match conn.as_mut() {
                Some(c) => c.exchange(&load.request),
                None => Conn::connect(load.addr).and_then(|mut c| {
                    let answer = c.exchange(&load.request);
                    conn = Some(c);
                    answer
                }),
            },
            Mode::NewConnection => {
                Conn::connect(load.addr).and_then(|mut c| c.exchange(&load.request))
            }
        };
        let done = Instant::now();
        let counted = done >= window_start && done <= window_end;
        match outcome {
            Ok(answer) if answer.status == 200 => {
                if counted {
                    let ns = u64::try_from((done - sent).as_nanos()).unwrap_or(u64::MAX);
                    report.latencies_ns.push(ns);
                }
            }
            _ => {
                if counted {
                    report.errors += 1;
                }
                failures += 1;
                conn = None;
                if failures >= MAX_ERRORS_PER_CLIENT {
                    break;
                }
                thread::sleep(ERROR_BACKOFF);
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_table() {
        let samples: Vec<u64> = (1..=1000).collect();
        let cases = [
            (50.0, 500),
            (99.0, 990),
            (99.9, 999),
            (100.0, 1000),
            (0.0, 1),
        ];
        for (p, want) in cases {
            assert_eq!(percentile(&samples, p), Some(want), "p{p}");
        }
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7], 99.9), Some(7));
    }

    #[test]
    fn head_parsing() {
        let head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-LENGTH:  12 \r\n\r\n";
        assert_eq!(status_code(head).unwrap(), 503);
        assert_eq!(content_length(head).unwrap(), 12);
        assert!(content_length(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(status_code(b"HTTP/2 200\r\n\r\n").is_err());
    }
}
