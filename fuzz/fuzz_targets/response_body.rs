//! What the client parses from a peer: response heads, envelopes (v1 and legacy) and
//! health answers. Never panics; an accepted envelope round-trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::fuzzing::{parse_health, parse_response_head};
use loopbus::parse_response;

fuzz_target!(|data: &[u8]| {
    let _ = parse_response_head(data);
    let _ = parse_health(data);
    if let Ok(envelope) = parse_response(data) {
        let again = parse_response(&envelope.to_json()).map(|e| e.is_success());
        assert_eq!(again, Ok(envelope.is_success()));
    }
});
