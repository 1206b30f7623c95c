//! The `/api/talk` body validator: never panics; what it accepts keeps the contract's
//! limits (a non-empty `fromInstance` of at most `MAX_FROM_INSTANCE_BYTES` bytes with
//! no control character: U+0000-U+001F or U+007F, contract section 3, check 7; C1
//! characters such as U+0080 are allowed) and re-encodes to a body it accepts again,
//! unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::{encode_talk_request, parse_talk_request, MAX_FROM_INSTANCE_BYTES};

fuzz_target!(|data: &[u8]| {
    let first = parse_talk_request(data);
    // Deterministic: the same bytes, the same verdict.
    assert_eq!(parse_talk_request(data), first);
    if let Ok(request) = first {
        let from = &request.from_instance;
        assert!(!from.is_empty() && from.len() <= MAX_FROM_INSTANCE_BYTES);
        assert!(!from.chars().any(|c| c.is_ascii_control()), "{from:?}");
        let encoded = encode_talk_request(&request);
        let again = parse_talk_request(&encoded);
        assert_eq!(again.as_ref(), Ok(&request));
    }
});
