//! Replaying bytes to one sans-IO [`Conn`] in given pieces, with a stub service and a
//! fake clock, to check that how TCP splits a stream never changes the answers.
//!
//! Only the differential fuzz target (`fuzz/fuzz_targets/request_split.rs`, through
//! `loopbus::fuzzing`) and the tests at the bottom use it; the server never does. It is
//! compiled only with the `fuzzing` feature (`make test` runs its tests that way).
//!
//! The stub service answers every head with `200` and a body that describes the head
//! (method, target, version, headers), so that two parses that differ give different
//! bytes; a head with a `Content-Length` of at most [`MAX_REPLAY_BODY`] bytes has its
//! body read first and echoed. Reads honour what the connection asks for
//! ([`Action::Read`]), as the event loop's do; the clock stands still while input
//! remains, then jumps from deadline to deadline until the connection closes.

use super::conn::{Action, Conn, CONTINUE};
use super::headers::LengthError;
use super::message::{parse_head, Head, HttpError, Response};
use std::time::{Duration, Instant};

use super::conn::CloseReason;

/// `parse_head` from the start of `buf`, stamped now: for fuzzing and tests (the
/// connection parses incrementally).
///
/// # Errors
/// As `parse_head`: malformed, or past the head limits.
pub fn parse_request_head(buf: &[u8]) -> Result<Option<(Head, usize)>, HttpError> {
    parse_head(buf, &mut 0, Instant::now())
}

/// Largest body the stub service reads; a longer declared one is answered 413 from the
/// head alone (the connection then lingers).
pub const MAX_REPLAY_BODY: usize = 64 * 1024;
/// Most deadlines the replay lets pass after the input before it gives up on the
/// connection closing (each phase has one timeout; a few phases follow each other).
pub const MAX_EXPIRIES: usize = 8;

/// What the connection was doing once all the input was fed (the clock not moved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    /// It asks for more bytes: at most this many.
    Read(usize),
    /// It discards input until the client hangs up or its linger timeout.
    Lingering,
    /// It closed, for this reason (a `CloseReason` variant's name).
    Closed(&'static str),
}

/// Everything a replay produced: the [`Answers`], which must not depend on the cuts,
/// and the interim answers, which may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// What the client sees, cuts aside.
    pub answers: Answers,
    /// How many `100 Continue` answers were written: one is owed only when the body
    /// did not come with the head, so this depends on the cuts by design.
    pub continues: usize,
    /// Input bytes the connection read: it reads what it is offered, so once it closes
    /// this too depends on the cuts.
    pub consumed: usize,
}

/// What a client sees of one connection, without interim `100 Continue` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answers {
    /// The bytes written, in order.
    pub written: Vec<u8>,
    /// How many complete heads reached the stub service.
    pub heads: usize,
    /// The state once the input ran out, before any timeout.
    pub pending: Pending,
    /// Why it closed once the clock ran past each deadline (a `CloseReason` variant's
    /// name; `None`: it did not close within [`MAX_EXPIRIES`] deadlines).
    pub closed: Option<&'static str>,
}

/// Feeds `bytes` to a new connection in pieces cut at `cuts` (offsets into `bytes`,
/// in any order; out-of-range ones are ignored) and runs the stub service over it.
pub fn replay(bytes: &[u8], cuts: &[usize]) -> Replayed {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|&c| c > 0 && c < bytes.len())
        .collect();
    cuts.push(bytes.len());
    cuts.sort_unstable();
    cuts.dedup();

    let mut now = Instant::now();
    let mut conn = Conn::new(now);
    let mut out = Replayed {
        answers: Answers {
            written: Vec::new(),
            heads: 0,
            pending: Pending::Read(0),
            closed: None,
        },
        continues: 0,
        consumed: 0,
    };
    let mut start = 0;
    'pieces: for end in cuts {
        let mut piece = &bytes[start..end];
        start = end;
        // One readiness event per piece: a new share of work.
        conn.begin_step();
        while !piece.is_empty() {
            let next = run(&mut conn, now, &mut out);
            match next {
                Next::Read(wanted) => {
                    let n = wanted.min(piece.len());
                    conn.received(&piece[..n], now);
                    out.consumed += n;
                    piece = &piece[n..];
                }
                Next::Closed(_) => break 'pieces,
            }
        }
    }
    let mut next = run(&mut conn, now, &mut out);
    out.answers.pending = match next {
        Next::Read(usize::MAX) => Pending::Lingering,
        Next::Read(n) => Pending::Read(n),
        Next::Closed(reason) => Pending::Closed(name(reason)),
    };
    for _ in 0..MAX_EXPIRIES {
        if let Next::Closed(reason) = next {
            out.answers.closed = Some(name(reason));
            break;
        }
        let Some(deadline) = conn.deadline() else {
            break;
        };
        now = deadline.max(now) + Duration::from_millis(1);
        conn.expire(now);
        conn.begin_step();
        next = run(&mut conn, now, &mut out);
    }
    out
}

/// The name of a close reason, as the answers carry it.
fn name(reason: CloseReason) -> &'static str {
    match reason {
        CloseReason::HeadTimeout => "HeadTimeout",
        CloseReason::IdleTimeout => "IdleTimeout",
        CloseReason::WriteTimeout => "WriteTimeout",
        CloseReason::LingerTimeout => "LingerTimeout",
        CloseReason::ClientAsked => "ClientAsked",
        CloseReason::ServerAsked => "ServerAsked",
    }
}

/// Where [`run`] stopped.
#[derive(Debug, Clone, Copy)]
enum Next {
    Read(usize),
    Closed(CloseReason),
}

/// Does what the connection asks, as the event loop would with the stub service, until
/// it wants input or closes. Yields start a new share at once (no other connection).
fn run(conn: &mut Conn, now: Instant, out: &mut Replayed) -> Next {
    loop {
        match conn.poll(now) {
            Action::Read(n) => return Next::Read(n),
            Action::Close(reason) => return Next::Closed(reason),
            // The stub's answers are never just an interim `100 Continue`.
            Action::Write(CONTINUE) => {
                out.continues += 1;
                conn.wrote(CONTINUE.len(), now);
            }
            Action::Write(bytes) => {
                out.answers.written.extend_from_slice(bytes);
                let n = bytes.len();
                conn.wrote(n, now);
            }
            Action::ShutdownWrite | Action::Yield => conn.begin_step(),
            Action::Head(head) => {
                out.answers.heads += 1;
                let text = describe(head);
                match head.content_length() {
                    Ok(len) if len > 0 && len <= MAX_REPLAY_BODY as u64 => {
                        // At most MAX_REPLAY_BODY, so it fits a usize.
                        conn.read_body(usize::try_from(len).unwrap_or(0), now);
                    }
                    Ok(0) | Err(LengthError::Missing) => conn.respond(answer(200, text), now),
                    Ok(_) => conn.respond(closing(413, text), now),
                    Err(_) => conn.respond(closing(400, text), now),
                }
            }
            Action::Request(head, body) => {
                let mut text = describe(head);
                text.extend_from_slice(&body);
                conn.respond(answer(200, text), now);
            }
            Action::Error(error, head) => {
                let status = match error {
                    HttpError::MalformedHead => 400,
                    HttpError::HeadTooLarge | HttpError::TooManyHeaders => 431,
                    HttpError::BodyTimeout => 408,
                    HttpError::Overloaded => 503,
                };
                let text = head.map(describe).unwrap_or_default();
                conn.respond(answer(status, text), now);
            }
            // The stub answers every request at once, so nothing ever waits; a wait
            // would last forever, which is what a close says here.
            Action::Wait => return Next::Closed(CloseReason::ServerAsked),
        }
    }
}

/// The stub's description of a head: everything the parser took from it.
fn describe(head: &Head) -> Vec<u8> {
    let mut text = format!(
        "{} {} 1.{} {}\n",
        head.method,
        head.target,
        head.minor_version,
        head.headers.len()
    )
    .into_bytes();
    for (name, value) in &head.headers {
        text.extend_from_slice(name.as_bytes());
        text.extend_from_slice(b": ");
        text.extend_from_slice(value);
        text.push(b'\n');
    }
    text
}

fn answer(status: u16, body: Vec<u8>) -> Response {
    Response {
        status,
        headers: Vec::new(),
        body,
        close: false,
    }
}

fn closing(status: u16, body: Vec<u8>) -> Response {
    Response {
        close: true,
        ..answer(status, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every single cut, and every pair of cuts, gives what the whole stream gives.
    fn assert_split_invariant(raw: &[u8]) -> Answers {
        let whole = replay(raw, &[]).answers;
        for i in 0..=raw.len() {
            assert_eq!(replay(raw, &[i]).answers, whole, "{raw:?} cut at {i}");
        }
        let every: Vec<usize> = (1..raw.len()).collect();
        assert_eq!(replay(raw, &every).answers, whole, "{raw:?} byte by byte");
        whole
    }

    fn status(replayed: &Answers) -> String {
        String::from_utf8_lossy(&replayed.written)
            .split("HTTP/1.1 ")
            .skip(1)
            .map(|r| r.split(' ').next().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn known_heads_get_the_same_answer_whole_and_split() {
        let cases: &[(&[u8], &str)] = &[
            (b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", "200"),
            (b"GET /a HTTP/1.1\nHost: x\n\n", "200"),
            (b"\r\n\r\nGET /a HTTP/1.1\r\n\r\n", "200"),
            (b"POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", "200"),
            (
                b"POST /b HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
                "200",
            ),
            (b"POST /b HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", "400"),
            (
                b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                "400",
            ),
            (b"\x00\x01garbage\r\n\r\n", "400"),
            (
                b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.0\r\n\r\nGET /c HTTP/1.1\r\n\r\n",
                "200,200",
            ),
        ];
        for (raw, want) in cases {
            let whole = assert_split_invariant(raw);
            assert_eq!(status(&whole), *want, "{raw:?}");
        }
    }

    /// Leading blank lines, then a malformed head without an end: sent whole it got 400
    /// at once (the leading blank line passed for the end of a head); split after the
    /// blank lines it got silence until the head timeout, or 431 once the limit was
    /// reached. Now leading empty lines are skipped whatever the reads: no end, no
    /// parse, as without them; with an end, 400 either way.
    #[test]
    fn bug_leading_blank_lines_before_a_malformed_head_got_silence_when_split() {
        for raw in [
            &b"\r\n\r\nGARBAGE\x01\r\n"[..],
            b"\n\n\x00\r\n",
            b"\r\n\r\n\r\nGET / HTTP/1.1\r\nBad Header\r\n",
            b"\n\nG\x7fT / HTTP/1.1\r\n",
            b"\n\r\n\r",
        ] {
            let whole = assert_split_invariant(raw);
            assert_eq!(status(&whole), "", "{raw:?}");
            assert_eq!(whole.closed, Some("HeadTimeout"), "{raw:?}");
            // The same head without the blank lines gets the same silence.
            let bare = raw.trim_ascii_start();
            assert_eq!(replay(bare, &[]).answers.written, whole.written, "{raw:?}");
        }
        for raw in [
            &b"\r\n\r\nGARBAGE\x01\r\n\r\n"[..],
            b"\n\n\x00\r\n\n",
            b"\r\n\r\n\r\nGET / HTTP/1.1\r\nBad Header\r\n\r\n",
        ] {
            assert_eq!(status(&assert_split_invariant(raw)), "400", "{raw:?}");
        }
    }

    /// The same bug's other face: leading blank lines, then more than the head limit of
    /// garbage. Whole, the leading blank line made it parse (400); split, 431.
    #[test]
    fn bug_leading_blank_lines_before_an_oversized_malformed_head_got_431_when_split() {
        let mut raw = b"\r\n\r\nGARBAGE\x01".to_vec();
        raw.resize(super::super::headers::MAX_HEAD_BYTES + 64, b'a');
        let whole = replay(&raw, &[]).answers;
        assert_eq!(status(&whole), "431");
        for cuts in [&[1][..], &[2], &[4], &[5, 9], &[4, 100, 16_000, 16_390]] {
            assert_eq!(replay(&raw, cuts).answers, whole, "cuts {cuts:?}");
        }
    }

    #[test]
    fn a_body_that_never_comes_is_answered_408_after_its_timeout() {
        let whole = assert_split_invariant(b"POST /b HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc");
        assert_eq!(whole.pending, Pending::Read(6));
        assert_eq!(status(&whole), "408");
        assert_eq!(whole.closed, Some("LingerTimeout"));
    }

    #[test]
    fn cuts_out_of_range_or_repeated_are_ignored() {
        let raw = b"GET /a HTTP/1.1\r\n\r\n";
        assert_eq!(replay(raw, &[0, 5, 5, 999]), replay(raw, &[5]));
        assert_eq!(replay(b"", &[3]).consumed, 0);
    }
}
