//! The differential target: the same bytes fed to the server's sans-IO connection
//! whole, and cut where the fuzzer says, get the same answers, the same state at the
//! end of the input and the same close after the timeouts. TCP may split a stream
//! anywhere; the answer must not depend on where.
//!
//! Input: the first byte says how many cuts (`% 16`), then two bytes (little-endian)
//! per cut, then the stream.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::fuzzing::{replay, Pending, MAX_HEAD_BYTES};

/// Streams up to this long are also fed one byte at a time.
const BYTE_BY_BYTE_MAX: usize = 96;

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = usize::from(count % 16).min(rest.len() / 2);
    let (cut_bytes, stream) = rest.split_at(count * 2);
    let cuts: Vec<usize> = cut_bytes
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (stream.len() + 1))
        .collect();

    let replayed = replay(stream, &[]);
    let whole = &replayed.answers;
    // Invariants of one replay.
    assert!(replayed.consumed <= stream.len());
    assert!(replayed.continues <= whole.heads);
    if !whole.written.is_empty() {
        assert!(whole.written.starts_with(b"HTTP/1.1 "));
    }
    if let Pending::Read(n) = whole.pending {
        assert!(n > 0, "asks to read nothing");
        assert_eq!(replayed.consumed, stream.len(), "input left while reading");
    }
    assert!(whole.closed.is_some(), "never closed: {whole:?}");
    // Only a parsed head is ever answered 200.
    if whole.heads == 0 {
        assert!(!whole.written.starts_with(b"HTTP/1.1 200"));
    }
    // Waiting for a first head with the whole limit still free: only empty lines came.
    if whole.heads == 0 && whole.pending == Pending::Read(MAX_HEAD_BYTES + 1) {
        assert!(stream.iter().all(|b| *b == b'\r' || *b == b'\n'));
    }

    // Whole == split.
    assert_eq!(&replay(stream, &cuts).answers, whole, "cuts {cuts:?}");
    if stream.len() <= BYTE_BY_BYTE_MAX {
        let every: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(&replay(stream, &every).answers, whole, "byte by byte");
    }
});
