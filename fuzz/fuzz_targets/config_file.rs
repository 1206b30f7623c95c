//! The `config.json` parser: never panics, is deterministic; what it accepts keeps
//! every documented limit; what it refuses is said in one bounded line that names the
//! field where there is one and never carries a control character (an error is
//! printed to a terminal and a log); an error of several problems is one such line each,
//! at most ten.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopbus::parse_config;

/// Largest values the config accepts (docs/configuration.md).
const MAX_CONCURRENT_TURNS: usize = 64;
const MAX_QUEUED_TURNS: usize = 1024;
const MAX_REATTACH_SECS: u64 = 600;
/// An error line longer than this floods a log.
const MAX_ERROR_CHARS: usize = 512;
/// Most problems (lines) one error reports (`MAX_CONFIG_PROBLEMS`).
const MAX_ERROR_LINES: usize = 10;

fuzz_target!(|data: &[u8]| {
    let parsed = parse_config(data);
    match &parsed {
        Ok(config) => {
            let bus = &config.bus;
            assert!((1..=MAX_CONCURRENT_TURNS).contains(&bus.max_concurrent_turns));
            assert!(bus.max_queued_turns <= MAX_QUEUED_TURNS);
            assert!(bus.reattach_secs <= MAX_REATTACH_SECS);
            if let Some(budget) = config.budget_usd {
                assert!(budget.is_finite() && budget >= 0.0, "{budget}");
            }
            if let Some(engine) = &config.engine {
                assert!(!engine.command.is_empty());
                if let Some(cost) = engine.max_turn_cost_usd {
                    assert!(cost.is_finite() && cost >= 0.0, "{cost}");
                }
                assert!(engine
                    .env
                    .keys()
                    .all(|k| !k.is_empty() && !k.contains('=') && !k.contains('\0')));
            }
        }
        Err(error) => {
            let text = error.to_string();
            let lines: Vec<&str> = text.split('\n').collect();
            assert!(lines.len() <= MAX_ERROR_LINES, "{text:?}");
            for line in lines {
                assert!(line.starts_with("config.json: "), "{line:?}");
                // Every path, `engine.env.<name>` included, is shown escaped and cut.
                assert!(!line.chars().any(char::is_control), "{line:?}");
                assert!(line.chars().count() <= MAX_ERROR_CHARS, "{line:?}");
            }
        }
    }
    let again = parse_config(data);
    assert_eq!(
        again.as_ref().map_err(ToString::to_string),
        parsed.as_ref().map_err(ToString::to_string)
    );
});
