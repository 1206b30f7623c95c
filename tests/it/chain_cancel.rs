//! Cancellation down a chain (contract 8.1): three real instances A -> B -> C with
//! default settings (`maxDepth` 3), A and B relaying through `loopbus talk`, C's engine
//! sleeping 60 s. Giving up at the top leaves no engine process of any instance alive,
//! every instance that ran a turn audits `cancelled`, and every usage.json stays valid.
//! The top is A's own `loopbus talk` to B (SIGINT to it), or a raw client of A at
//! depth 0 that closes its socket (a top `talk` to A would reach C at depth 3, which the
//! default `maxDepth` refuses).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on the first broken expectation"
)]

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the whole chain may take to be gone after the top gives up (the issue's
/// bound: each hop cancels the next at once).
const CHAIN_GONE: Duration = Duration::from_secs(3);
/// Generous bound for the chain to get going.
const BOUND: Duration = Duration::from_secs(20);

struct Chain {
    root: TestRoot,
    hops: Vec<Instance>,
}

impl Chain {
    fn start(label: &str) -> Chain {
        let root = TestRoot::new(label);
        let relay = format!("{}/tests/engines/relay.sh", env!("CARGO_MANIFEST_DIR"));
        let relay_to = |next: &str| {
            json!({
                "bus": {"peers": "*", "secret": format!("s-{next}-0123456789abcdef")},
                "engine": {"command": ["/bin/sh", relay], "env": {"RELAY_TO": next, "LOOPBUS_BIN": bin()}},
            })
        };
        let leaf = json!({
            "bus": {"peers": "*", "secret": "s-leaf-0123456789abcdef"},
            "engine": {"command": ["sh", "-c", "cat > /dev/null; sleep 60"]},
        });
        let c = root.start("c", &leaf);
        let b = root.start("b", &relay_to("c"));
        let a = root.start("a", &relay_to("b"));
        Chain {
            root,
            hops: vec![a, b, c],
        }
    }

    /// Waits until the leaf's engine runs: the whole chain is busy.
    fn wait_busy(&self) {
        let leaf = &self.hops[2];
        assert!(
            eventually(BOUND, || leaf.health()["turns"]["running"] == 1),
            "the chain never reached its leaf\n{}\n{}\n{}",
            self.hops[0].describe(),
            self.hops[1].describe(),
            leaf.describe()
        );
    }

    /// Whether no instance has an engine (or a leftover of one) left.
    fn engines_gone(&self) -> bool {
        self.hops.iter().all(|hop| children(hop.pid()).is_empty())
    }

    /// Checks what the top's giving up left: nothing running, and a `cancelled` audit
    /// line and a valid usage.json for each of `ran` (the hops that ran a turn).
    fn check_aftermath(&self, gave_up: Instant, ran: &[&str]) {
        let gone = eventually(CHAIN_GONE.saturating_sub(gave_up.elapsed()), || {
            self.engines_gone()
        });
        eprintln!("chain gone after {:?}", gave_up.elapsed());
        assert!(
            gone,
            "engines still alive {:?} after the top gave up: {:?}",
            gave_up.elapsed(),
            self.hops
                .iter()
                .map(|h| (h.pid(), children(h.pid())))
                .collect::<Vec<_>>()
        );
        for (hop, name) in self.hops.iter().zip(["a", "b", "c"]) {
            if !ran.contains(&name) {
                continue;
            }
            let dir = self.root.state_dir(name);
            let cancelled = eventually(BOUND, || {
                audit(&dir).iter().any(|l| {
                    l["outcome"] == "cancelled" && l["metadata"]["errorCode"] == "cancelled"
                })
            });
            assert!(
                cancelled,
                "{name} audited no cancel: {:?}\n{}",
                audit(&dir),
                hop.describe()
            );
            let usage: Value =
                serde_json::from_slice(&std::fs::read(dir.join("usage.json")).unwrap())
                    .unwrap_or_else(|e| panic!("{name}'s usage.json is not JSON: {e}"));
            assert!(usage["requestCount"].as_u64() >= Some(1), "{name}: {usage}");
            assert!(usage["totalCostUsd"].is_number(), "{name}: {usage}");
        }
    }
}

fn audit(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("audit.log.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A's own `loopbus talk` to B, as A's engine would run it.
fn top_talk(chain: &Chain) -> Child {
    Command::new(bin())
        .args(["talk", "b", "a long job"])
        .arg("--state-dir")
        .arg(chain.root.state_dir("a"))
        .env_remove("LOOPBUS_STATE_DIR")
        .env_remove("LOOPBUS_DEPTH")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn sigint_to_the_top_talk_cancels_the_whole_chain() {
    let chain = Chain::start("chain-sigint");
    let mut talk = top_talk(&chain);
    chain.wait_busy();
    send_signal(talk.id(), rustix::process::Signal::INT);
    let gave_up = Instant::now();
    let status = talk.wait().unwrap();
    chain.check_aftermath(gave_up, &["b", "c"]);
    // talk handles SIGINT: it cancelled its turn and exited 130.
    assert_eq!(status.code(), Some(130), "{status:?}");
}

#[test]
fn a_raw_client_that_closes_its_socket_cancels_the_whole_chain() {
    let chain = Chain::start("chain-close");
    let a = &chain.hops[0];
    let body = json!({"fromInstance": "top", "prompt": "a long job", "depth": 0}).to_string();
    let mut stream = connect(a.port);
    stream
        .write_all(
            format!(
                "POST /api/talk HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                a.host(),
                a.secret,
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    chain.wait_busy();
    drop(stream);
    chain.check_aftermath(Instant::now(), &["a", "b", "c"]);
}
