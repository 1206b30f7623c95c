//! The floor server: about the least an HTTP/1.1 server on std can do for the same
//! requests. One thread per connection, keep-alive, no validation at all, and a fixed
//! reply per method whose size matches loopbus's answer, so that loopbus's figures
//! can be read as ratios to it.
//!
//! It frames requests only as far as it must to answer them one by one: the end of
//! the head, and `Content-Length` to skip a body.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Largest request head plus body the floor buffers.
const BUF_BYTES: usize = 16 * 1024;
/// A connection silent this long is closed, so that no thread outlives the bench.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Connection threads alive at most; past it new connections are dropped.
const MAX_THREADS: usize = 2_048;
/// Most requests served on one connection.
const MAX_REQUESTS_PER_CONN: u64 = 10_000_000;
/// Most connections accepted over the floor's life.
const MAX_ACCEPTS: u64 = 10_000_000;
/// Pause after a failed accept (out of descriptors, say), so as not to spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(1);
/// Stack size of connection threads.
const STACK_BYTES: usize = 64 * 1024;

/// A running floor server; [`Floor::stop`] ends it.
pub struct Floor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

/// The two fixed replies.
struct Replies {
    get: Vec<u8>,
    post: Vec<u8>,
}

impl Floor {
    /// Starts a floor on an ephemeral loopback port answering `GET` with a response of
    /// exactly `get_size` bytes and anything else with one of `post_size` bytes.
    ///
    /// # Errors
    /// The listener or the accept thread could not be created.
    pub fn start(get_size: usize, post_size: usize) -> io::Result<Floor> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(Replies {
            get: fixed_reply(get_size),
            post: fixed_reply(post_size),
        });
        let acceptor = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("floor-accept".to_owned())
                .spawn(move || accept_loop(&listener, &stop, &replies))?
        };
        Ok(Floor {
            addr,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and lets connection threads end at their next read.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Unblock the accept call; the connection itself is dropped at once.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// `HTTP/1.1 200` with a JSON body padded so that the whole response is `size` bytes
/// (or the smallest possible response, if `size` is smaller than that).
fn fixed_reply(size: usize) -> Vec<u8> {
    let build = |pad: usize| {
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(pad));
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let mut pad = size.saturating_sub(build(0).len());
    // The length's digit count can change with the pad: settle in a few steps.
    for _ in 0..4 {
        let len = build(pad).len();
        if len == size {
            break;
        }
        pad = (pad + size).saturating_sub(len);
    }
    build(pad)
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, replies: &Arc<Replies>) {
    let live = Arc::new(AtomicUsize::new(0));
    for _ in 0..MAX_ACCEPTS {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if live.load(Ordering::SeqCst) >= MAX_THREADS {
            continue;
        }
        live.fetch_add(1, Ordering::SeqCst);
        let replies = Arc::clone(replies);
        let live_in_thread = Arc::clone(&live);
        let spawned = thread::Builder::new()
            .stack_size(STACK_BYTES)
            .spawn(move || {
                let _ = serve(stream, &replies);
                live_in_thread.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Serves one connection until EOF, an error, `Connection: close` or the timeout.
fn serve(mut stream: TcpStream, replies: &Replies) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut buf = vec![0u8; BUF_BYTES];
    let mut filled = 0;
    for _ in 0..MAX_REQUESTS_PER_CONN {
        // Read until a whole head is buffered.
        let head_end = loop {
            if let Some(pos) = crate::load::find(&buf[..filled], b"\r\n\r\n") {
                break pos + 4;
            }
            if filled == buf.len() {
                return Ok(());
            }
            let n = stream.read(&mut buf[filled..])?;
            if n == 0 {
                return Ok(());
            }
            filled += n;
        };
        let body_len = body_length(&buf[..head_end]).min(BUF_BYTES - head_end);
        while filled < head_end + body_len {
            let n = stream.read(&mut buf[filled..])?;
            if n == 0 {
                return Ok(());
            }
            filled += n;
        }
        let close = crate::load::find(&buf[..head_end], b"Connection: close").is_some();
        let reply = if buf.starts_with(b"GET ") {
            &replies.get
        } else {
            &replies.post
        };
        stream.write_all(reply)?;
        if close {
            return Ok(());
        }
        buf.copy_within(head_end + body_len..filled, 0);
        filled -= head_end + body_len;
    }
    Ok(())
}

/// The request's `Content-Length`, 0 when absent or unreadable.
fn body_length(head: &[u8]) -> usize {
    const NAME: &[u8] = b"content-length:";
    head.split(|b| *b == b'\n')
        .find(|line| line.len() > NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME))
        .and_then(|line| std::str::from_utf8(&line[NAME.len()..]).ok())
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_reply_has_the_asked_size() {
        for size in [120, 200, 207, 208, 300, 999, 1000, 1001, 5000] {
            let reply = fixed_reply(size);
            assert_eq!(reply.len(), size, "size {size}");
            let head_end = crate::load::find(&reply, b"\r\n\r\n").unwrap() + 4;
            assert_eq!(body_length(&reply[..head_end]), size - head_end);
        }
    }
}
