//! The `/api/talk` body validator: never panics; what it accepts re-encodes to a body
//! it accepts again, unchanged.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::{encode_talk_request, parse_talk_request};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = parse_talk_request(data) {
        let again = parse_talk_request(&encode_talk_request(&request));
        assert_eq!(again.as_ref(), Ok(&request));
    }
});
