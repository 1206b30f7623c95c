//! The server's request-head parser: never panics, and whatever it accepts stays
//! within the limits.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::__internals::{parse_request_head, MAX_HEADERS, MAX_HEAD_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((head, consumed))) = parse_request_head(data) {
        assert!(consumed <= MAX_HEAD_BYTES && consumed <= data.len());
        assert!(head.headers.len() <= MAX_HEADERS);
        let _ = head.path();
    }
});
