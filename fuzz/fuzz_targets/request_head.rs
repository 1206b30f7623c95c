//! The server's request-head parser and its framing rule: never panics; whatever it
//! accepts stays within the limits, parses the same from exactly the bytes it took,
//! and a `Content-Length` it accepts is the one rule's (digits only, repeats agreeing,
//! no `Transfer-Encoding`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::fuzzing::{parse_request_head, MAX_HEADERS, MAX_HEAD_BYTES};

fuzz_target!(|data: &[u8]| {
    let Ok(Some((head, consumed))) = parse_request_head(data) else {
        return;
    };
    assert!(consumed <= MAX_HEAD_BYTES && consumed <= data.len());
    assert!(head.headers.len() <= MAX_HEADERS);
    assert!(head.minor_version <= 1);
    let _ = head.path();

    // The head ends where it says: the bytes it took alone give the same head.
    let Ok(Some((again, again_consumed))) = parse_request_head(&data[..consumed]) else {
        panic!("the head's own bytes do not parse");
    };
    assert_eq!(again_consumed, consumed);
    assert_eq!(
        (
            &again.method,
            &again.target,
            again.minor_version,
            &again.headers
        ),
        (
            &head.method,
            &head.target,
            head.minor_version,
            &head.headers
        )
    );

    if let Ok(length) = head.content_length() {
        assert!(!head.has_header("transfer-encoding"));
        let values: Vec<&[u8]> = head.header_values("content-length").collect();
        assert!(!values.is_empty());
        for value in values {
            assert!(!value.is_empty() && value.iter().all(u8::is_ascii_digit));
            let trimmed: &[u8] = {
                let zeros = value.iter().take_while(|b| **b == b'0').count();
                &value[zeros..]
            };
            if trimmed.len() < 20 {
                let n: u64 = std::str::from_utf8(trimmed)
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map_or(Some(0), |s| s.parse().ok())
                    .unwrap_or(u64::MAX);
                assert_eq!(n, length, "{value:?}");
            }
        }
    }
});
