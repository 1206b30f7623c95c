//! The `/api/talk` body validator: never panics; what it accepts keeps the contract's
//! limits (a non-empty `fromInstance` of at most `MAX_FROM_INSTANCE_BYTES` bytes with
//! no control character: U+0000-U+001F or U+007F-U+009F, contract section 3, check 7)
//! and re-encodes to a body it accepts again as the same request, except that the
//! encoder lists the base capabilities whatever the request listed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::{encode_talk_request, parse_talk_request, MAX_FROM_INSTANCE_BYTES};

/// The capabilities `encode_talk_request` writes into every body.
const BASE_CAPABILITIES: [&str; 2] = ["structured-errors", "retryable-errors"];

fuzz_target!(|data: &[u8]| {
    let first = parse_talk_request(data);
    // Deterministic: the same bytes, the same verdict.
    assert_eq!(parse_talk_request(data), first);
    if let Ok(request) = first {
        let from = &request.from_instance;
        assert!(!from.is_empty() && from.len() <= MAX_FROM_INSTANCE_BYTES);
        assert!(!from.chars().any(char::is_control), "{from:?}");
        let encoded = encode_talk_request(&request);
        let mut expected = request;
        expected.capabilities = BASE_CAPABILITIES.map(str::to_owned).to_vec();
        assert_eq!(parse_talk_request(&encoded), Ok(expected));
    }
});
