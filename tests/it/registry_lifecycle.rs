//! The registry (contract section 6), file modes (section 1), `loopbus init`, signals,
//! and what the log must never contain (section 7).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]
use crate::client_support;
use crate::common;
use client_support::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, or `None` if `s` is
/// not in that form.
fn parse_iso8601_utc(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let rest = &s[19..];
    let rest = match rest.strip_prefix('.') {
        Some(frac) => {
            let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return None;
            }
            &frac[digits..]
        }
        None => rest,
    };
    if rest != "Z"
        || !(1..=12).contains(&m)
        || !(1..=31).contains(&d)
        || hh > 23
        || mm > 59
        || ss > 60
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn now_secs() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

#[test]
fn registry_entry_after_startup() {
    let root = TestRoot::new("reg-entry");
    let w = root.start("worker", &open_config("entry-secret-0123456789abcdef"));
    let registry = root.registry();
    let entry = &registry["instances"]["worker"];
    assert_eq!(entry["port"], u64::from(w.port), "{registry}");
    assert!(w.port > 0);
    assert_eq!(entry["pid"], u64::from(w.pid()), "{registry}");
    assert_eq!(
        entry["secret"], "entry-secret-0123456789abcdef",
        "{registry}"
    );
    let updated = entry["updatedAt"].as_str().expect("updatedAt is a string");
    let at = parse_iso8601_utc(updated).unwrap_or_else(|| panic!("not ISO-8601: {updated}"));
    assert!(
        (now_secs() - at).abs() < 120,
        "updatedAt {updated} is not now"
    );
    // The port in the registry is the one serving this instance.
    let health = w.health();
    assert_eq!(health["instance"], "worker");
    assert_eq!(health["pid"], u64::from(w.pid()));
    assert_eq!(file_mode(&root.path.join(".bus-registry.json")), 0o600);
}

#[test]
fn generated_secret_is_published_only_in_the_registry() {
    let root = TestRoot::new("reg-gen");
    let mut w = root.start("worker", &json!({"bus": {"peers": "*"}}));
    let secret = w.secret.clone();
    assert_eq!(secret.len(), 64, "32 random bytes as hex: {secret}");
    assert!(secret.bytes().all(|c| c.is_ascii_hexdigit()), "{secret}");
    assert_success(
        &Req::talk(&w).send(w.port),
        "worker",
        "hi",
        "registry secret works",
    );
    let config = std::fs::read_to_string(w.state_dir.join("config.json")).unwrap();
    assert!(!config.contains(&secret), "secret written to config.json");
    // An empty secret is no secret: one is generated too.
    let mut e = root.start("empty", &json!({"bus": {"peers": "*", "secret": ""}}));
    assert_eq!(e.secret.len(), 64);
    let r = Req::talk(&e).set("Authorization", "Bearer ").send(e.port);
    assert_failure(&r, "empty", 401, "auth_failed", "empty bearer");
    assert_eq!(w.terminate(Duration::from_secs(10)).code(), Some(0));
    assert_eq!(e.terminate(Duration::from_secs(10)).code(), Some(0));
    assert!(!w.stderr().contains(&secret), "secret in the log");
}

fn stops_on_signal(signal_name: &str) {
    let root = TestRoot::new(&format!("reg-{signal_name}"));
    let mut a = root.start("alpha", &open_config("a-0123456789abcdef"));
    let b = root.start("beta", &open_config("b-0123456789abcdef"));
    signal(a.pid(), signal_name);
    let status = a.wait(Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(0),
        "SIG{signal_name}: {status}\n{}",
        a.describe()
    );
    let registry = root.registry();
    assert!(registry["instances"].get("alpha").is_none(), "{registry}");
    assert_eq!(
        registry["instances"]["beta"]["pid"],
        u64::from(b.pid()),
        "{registry}"
    );
    assert_eq!(file_mode(&root.path.join(".bus-registry.json")), 0o600);
    assert_eq!(b.health()["instance"], "beta");
}

#[test]
fn sigterm_deregisters_and_exits_0() {
    stops_on_signal("TERM");
}

#[test]
fn sigint_deregisters_and_exits_0() {
    stops_on_signal("INT");
}

#[test]
fn bug_sigusr1_killed_serve_and_left_its_registry_entry() {
    stops_on_signal("USR1");
}

#[test]
fn bug_sigusr2_killed_serve_and_left_its_registry_entry() {
    stops_on_signal("USR2");
}

#[test]
fn bug_sigalrm_killed_serve_and_left_its_registry_entry() {
    stops_on_signal("ALRM");
}

#[test]
fn deregistration_leaves_an_entry_of_another_pid() {
    let root = TestRoot::new("reg-other-pid");
    let mut a = root.start("alpha", &open_config("a-0123456789abcdef"));
    // A successor with the same name registered meanwhile (here: faked in the file).
    let path = root.path.join(".bus-registry.json");
    let mut registry = root.registry();
    let successor = u64::from(std::process::id());
    registry["instances"]["alpha"]["pid"] = json!(successor);
    registry["instances"]["alpha"]["port"] = json!(1);
    write_file_atomic(&path, registry.to_string().as_bytes());
    assert_eq!(a.terminate(Duration::from_secs(10)).code(), Some(0));
    let after = root.registry();
    assert_eq!(after["instances"]["alpha"]["pid"], successor, "{after}");
    assert_eq!(after["instances"]["alpha"]["port"], 1, "{after}");
}

#[test]
fn invalid_entries_are_kept_on_the_next_write() {
    let root = TestRoot::new("reg-invalid");
    let path = root.path.join(".bus-registry.json");
    // A valid entry must also be alive to survive: serve prunes dead entries at startup.
    let _other = root.start("other", &open_config("x-0123456789abcdef"));
    let valid = root.registry()["instances"]["other"].clone();
    let registry = json!({"instances": {
        "other": valid,
        "port-zero": {"port": 0, "pid": 5, "secret": "x-0123456789abcdef", "updatedAt": "2026-01-01T00:00:00.000Z"},
        "port-big": {"port": 70000, "pid": 5, "secret": "x-0123456789abcdef", "updatedAt": "2026-01-01T00:00:00.000Z"},
        "pid-negative": {"port": 5, "pid": -3, "secret": "x-0123456789abcdef", "updatedAt": "2026-01-01T00:00:00.000Z"},
        "secret-number": {"port": 5, "pid": 5, "secret": 7, "updatedAt": "2026-01-01T00:00:00.000Z"},
        "bad-time": {"port": 5, "pid": 5, "secret": "x-0123456789abcdef", "updatedAt": "yesterday"},
        "-bad name": valid,
        "not-an-object": 12,
    }});
    write_file_atomic(&path, registry.to_string().as_bytes());
    let w = root.start("worker", &open_config("s-0123456789abcdef"));
    let after = root.registry();
    // Ignored on read, kept as they are on write (contract 6).
    let mut want = registry.clone();
    want["instances"]["worker"] = after["instances"]["worker"].clone();
    assert_eq!(after, want);
    assert_eq!(after["instances"]["worker"]["pid"], u64::from(w.pid()));
}

#[test]
fn a_corrupt_registry_does_not_stop_serve() {
    let root = TestRoot::new("reg-corrupt");
    let path = root.path.join(".bus-registry.json");
    for junk in [&b"{not json"[..], b"[]", b"{\"instances\": 5}", b""] {
        write_file_atomic(&path, junk);
        let mut w = root.start("worker", &open_config("s-0123456789abcdef"));
        assert_eq!(
            root.registry()["instances"]["worker"]["pid"],
            u64::from(w.pid())
        );
        assert_eq!(w.terminate(Duration::from_secs(10)).code(), Some(0));
    }
}

#[test]
fn concurrent_startups_all_register() {
    let root = TestRoot::new("reg-concurrent");
    let names = ["n1", "n2", "n3", "n4", "n5", "n6"];
    let instances: Vec<Instance> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|name| {
                let root = &root;
                s.spawn(move || root.start(name, &open_config(&format!("{name}-0123456789abcdef"))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let registry = root.registry();
    for w in &instances {
        let entry = &registry["instances"][w.name.as_str()];
        assert_eq!(entry["pid"], u64::from(w.pid()), "{registry}");
        assert_eq!(entry["port"], u64::from(w.port), "{registry}");
        assert_eq!(
            entry["secret"],
            format!("{}-0123456789abcdef", w.name),
            "{registry}"
        );
    }
}

/// `loopbus init DIR`, then `serve`: no hand editing.
fn init(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["init", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args, &[], None)
}

#[test]
fn init_then_serve_needs_no_hand_editing() {
    let root = TestRoot::new("init");
    // A channel root that does not exist yet: loopbus creates it.
    let channel = root.path.join("fresh-root");
    let dir = channel.join("inst");
    // A fixed secret (`--fixed-secret`; a plain init writes none: tests/it/secret_proof.rs).
    let output = init(&dir, &["--fixed-secret"]);
    assert!(output.status.success(), "{}", describe(&["init"], &output));
    let config_path = dir.join("config.json");
    assert_eq!(file_mode(&config_path), 0o600, "config.json mode");
    assert_eq!(file_mode(&dir), 0o700, "state dir mode");
    let config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    assert_eq!(config["bus"]["peers"], "*", "{config}");
    let secret = config["bus"]["secret"]
        .as_str()
        .expect("a secret")
        .to_owned();
    assert!(secret.len() >= 32, "{config}");
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains(&secret),
        "secret printed"
    );

    let instance_root = TestRoot {
        path: channel.clone(),
    };
    let mut w = Instance::spawn(&instance_root, "inst", &[]);
    assert_eq!(
        w.secret, secret,
        "the registry publishes the config's secret"
    );
    assert_success(&Req::talk(&w).send(w.port), "inst", "hi", "talk after init");
    assert_eq!(file_mode(&channel.join(".bus-registry.json")), 0o600);
    assert_eq!(
        file_mode(&channel),
        0o700,
        "channel root created by loopbus"
    );
    assert_eq!(w.terminate(Duration::from_secs(10)).code(), Some(0));
    std::mem::forget(instance_root); // `root` removes the whole tree

    // A second init refuses to overwrite; --force --rotate-secret writes a fresh secret
    // (--force alone keeps it: tests/it/first_hour.rs).
    let output = init(&dir, &[]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        describe(&["init"], &output)
    );
    let unchanged: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    assert_eq!(unchanged, config);
    let output = init(&dir, &["--force", "--rotate-secret"]);
    assert!(
        output.status.success(),
        "{}",
        describe(&["init", "--force"], &output)
    );
    let forced: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    assert_ne!(forced["bus"]["secret"], config["bus"]["secret"]);
    assert_eq!(file_mode(&config_path), 0o600);
}

#[test]
fn logs_never_contain_secrets_or_prompts() {
    let root = TestRoot::new("logs");
    let mut w = root.start(
        "worker",
        &json!({"bus": {"peers": ["alice"], "secret": "LOG-SECRET-1f2e-0123456789abcdef"}}),
    );
    let prompt = "PROMPT-TEXT-MARKER-9a8b";
    let talk = |from: &str, depth: u64| {
        Req::talk(&w).json(&json!({"fromInstance": from, "prompt": prompt, "depth": depth}))
    };
    let requests = [
        talk("alice", 0),
        talk("mallory", 0),
        talk("alice", 9),
        talk("alice", 0).set("Authorization", "Bearer WRONG-SECRET-7c6d"),
        talk("alice", 0).set("Content-Type", "text/plain"),
        Req::talk(&w).body(format!(
            "{{\"fromInstance\": \"alice\", \"prompt\": \"{prompt}\""
        )),
    ];
    for req in &requests {
        let _ = req.send(w.port);
    }
    assert_eq!(w.terminate(Duration::from_secs(10)).code(), Some(0));
    let stderr = w.stderr();
    assert!(stderr.contains("worker"), "the log has content: {stderr}");
    for needle in ["LOG-SECRET-1f2e", "WRONG-SECRET-7c6d", prompt, "Bearer"] {
        assert!(!stderr.contains(needle), "{needle} in the log:\n{stderr}");
    }
}

/// Regression: `loopbus init ROOT/NAME` created a missing channel root with the umask's
/// mode (0755), while contract section 1 asks for 0700 (it holds the registry).
#[test]
fn bug_init_created_a_missing_channel_root_with_the_umask_mode() {
    let root = TestRoot::new("init-root-mode");
    let channel = root.path.join("parent").join("channel");
    let output = init(&channel.join("inst"), &[]);
    assert!(output.status.success(), "{}", describe(&["init"], &output));
    assert_eq!(file_mode(&channel), 0o700, "channel root");
    assert_eq!(file_mode(&channel.join("inst")), 0o700, "state dir");
    // An existing root is the user's: left as it is.
    let existing = root.path.join("existing");
    std::fs::create_dir(&existing).unwrap();
    let before = file_mode(&existing);
    assert!(init(&existing.join("inst"), &[]).status.success());
    assert_eq!(file_mode(&existing), before);
}

/// Regression: under umask 000, `init` created the missing ancestors of the channel
/// root with mode 0777 (another user could swap the root out from under them).
#[test]
fn bug_init_under_umask_000_created_missing_ancestors_0777() {
    let root = TestRoot::new("init-umask-000");
    let created = [
        root.path.join("a"),
        root.path.join("a/b"),
        root.path.join("a/b/channel"),
        root.path.join("a/b/channel/inst"),
    ];
    let dir = created[3].to_str().unwrap();
    let output = std::process::Command::new("/bin/sh")
        .args(["-c", "umask 000; exec \"$0\" init \"$1\"", bin(), dir])
        .env_remove("LOOPBUS_STATE_DIR")
        .env_remove("LOOPBUS_ROOT")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        describe(&["init", dir], &output)
    );
    for path in &created {
        assert_eq!(file_mode(path), 0o700, "{}", path.display());
    }
    assert_eq!(file_mode(&created[3].join("config.json")), 0o600);
}

#[test]
fn sigterm_with_many_open_connections_exits_0_promptly() {
    use std::io::Write;
    let root = TestRoot::new("term-busy");
    let mut w = root.start("worker", &open_config("s-0123456789abcdef"));
    let mut conns = Vec::new();
    // Idle, mid-head, mid-body and keep-alive connections.
    for _ in 0..connections_to_open(300) {
        conns.push(connect(w.port));
    }
    for _ in 0..50 {
        let mut s = connect(w.port);
        s.write_all(b"GET /api/health HTTP/1.1\r\nHost: ").unwrap();
        conns.push(s);
    }
    for _ in 0..5 {
        let mut s = connect(w.port);
        let head = Req::talk(&w).body(Vec::new()).set("Content-Length", "1000");
        s.write_all(&head.to_bytes()).unwrap();
        s.write_all(b"{\"fromInstance\"").unwrap();
        conns.push(s);
    }
    let mut kept = connect(w.port);
    kept.write_all(&Req::health(&w).to_bytes()).unwrap();
    assert_eq!(read_response(&mut kept).expect("health").status, 200);
    w.assert_alive("before SIGTERM");

    let status = w.terminate(Duration::from_secs(15));
    assert_eq!(status.code(), Some(0), "{status}\n{}", w.describe());
    assert!(root.registry()["instances"].get("worker").is_none());
    assert!(
        closed_within(&mut kept, Duration::from_secs(2)),
        "keep-alive connection left open"
    );
}

#[test]
fn a_config_readable_by_others_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let root = TestRoot::new("wide-config");
    let path = root.write_config("worker", &open_config("s-0123456789abcdef"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let w = Instance::spawn(&root, "worker", &[]);
    let stderr = w.stderr();
    let warned = stderr
        .lines()
        .any(|l| l.contains("WARN") && l.contains("config.json") && l.contains("644"));
    assert!(warned, "no warning about mode 644:\n{stderr}");
}

/// Regression: two `serve` processes could serve one state directory (under different
/// names, or racing under one).
#[test]
fn a_second_serve_for_the_same_state_dir_is_refused() {
    let root = TestRoot::new("reg-twice");
    let _first = root.start("alpha", &open_config("s-0123456789abcdef"));
    let dir = root.state_dir("alpha");
    let args = [
        "serve",
        "--state-dir",
        dir.to_str().unwrap(),
        "--name",
        "beta",
    ];
    let output = run(&args, &[], None);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        describe(&args, &output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already running"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// Regression: the check that re-registers a lost entry took the registry lock on the
/// event loop, so another process holding that lock froze health.
#[test]
fn health_answers_while_another_process_holds_the_registry_lock() {
    let root = TestRoot::new("reg-locked");
    let mut a = root.start("alpha", &open_config("s-0123456789abcdef"));
    let path = root.path.join(".bus-registry.json");
    // The registry lock as the original takes it: the directory, with an owner.json
    // naming a live process (this one) that took it at a time not yet stale.
    let lock = root.path.join(".bus-registry.json.lock");
    // The entry shows before the start has released its own lock directory.
    assert!(eventually(Duration::from_secs(10), || !lock.is_dir()));
    std::fs::create_dir(&lock).unwrap();
    let owner = json!({"pid": std::process::id(), "acquiredAt": "2999-01-01T00:00:00.000Z"});
    std::fs::write(lock.join("owner.json"), owner.to_string()).unwrap();
    // alpha's entry is lost. The one entry left is invalid, and every read of the file
    // warns about it: the sign that the periodic check read the registry, found alpha
    // missing, and went on to the lock.
    let before = a.stderr().len();
    let invalid = json!({"instances": {"port-zero": {"port": 0, "pid": 5, "secret": "x-0123456789abcdef",
        "updatedAt": "2026-01-01T00:00:00.000Z"}}});
    write_file_atomic(&path, invalid.to_string().as_bytes());
    let checked = eventually(Duration::from_secs(10), || {
        a.assert_alive("while the registry lock is held elsewhere");
        a.stderr()[before..].contains("ignoring an entry")
    });
    assert!(checked, "no registry check ran\n{}", a.describe());
    // The check met the held lock; the server still answers at once.
    a.assert_alive("after a registry check met the held lock");
    assert!(
        root.registry()["instances"].get("alpha").is_none(),
        "written without the lock"
    );
    std::fs::remove_dir_all(&lock).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            a.assert_alive("after the lock was released");
            root.registry()["instances"]["alpha"]["pid"] == u64::from(a.pid())
        }),
        "the lost entry was not written again once the lock was free"
    );
}

#[test]
fn a_fifo_in_place_of_the_registry_does_not_stall_the_server() {
    let root = TestRoot::new("reg-fifo");
    let mut a = root.start("alpha", &open_config("s-0123456789abcdef"));
    let path = root.path.join(".bus-registry.json");
    std::fs::remove_file(&path).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &path,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
    // The periodic check meets the FIFO (opened without blocking), sets it aside and
    // writes the entry again; health answers all along.
    assert!(
        eventually(Duration::from_secs(10), || {
            a.assert_alive("with a FIFO in place of the registry");
            root.registry()["instances"]["alpha"]["pid"] == u64::from(a.pid())
        }),
        "the entry was not written again\n{}",
        a.describe()
    );
    a.assert_alive("after the FIFO was set aside");
    let set_aside = std::fs::read_dir(&root.path).unwrap().flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with(".bus-registry.json.corrupt-")
    });
    assert!(set_aside, "the FIFO was not set aside");
}

/// (In this file rather than with the other lookups in discovery.rs so that its wait for
/// the 1 s registry check runs beside the other long waits here.)
#[test]
fn invalid_entries_and_a_torn_registry_do_not_break_lookup() {
    let root = TestRoot::new("disc-torn");
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let me = root.state_dir("me");
    let beta = root.start("beta", &open_config("sb-0123456789abcdef"));

    // Invalid entries beside the valid one are skipped.
    let mut registry = root.registry();
    let t = "2026-01-01T00:00:00.000Z";
    registry["instances"]["port-zero"] =
        json!({"port": 0, "pid": 1, "secret": "s-0123456789abcdef", "updatedAt": t});
    registry["instances"]["no-secret"] = json!({"port": beta.port, "pid": 1, "updatedAt": t});
    registry["instances"]["bad-time"] = json!({"port": beta.port, "pid": 1, "secret": "s-0123456789abcdef", "updatedAt": "yesterday"});
    registry["instances"]["-bad name"] =
        json!({"port": beta.port, "pid": 1, "secret": "s-0123456789abcdef", "updatedAt": t});
    registry["instances"]["not-an-object"] = json!(42);
    registry["unexpected"] = json!([1, 2, 3]);
    std::fs::write(root.path.join(".bus-registry.json"), registry.to_string()).unwrap();

    let t1 = talk(&me, &["beta", "still there"], &[], None);
    assert_eq!(t1.code(), Some(0), "{}", t1.describe());
    assert_eq!(t1.stdout(), "still there\n");
    let names: Vec<Value> = list_json(&root).iter().map(|i| i["name"].clone()).collect();
    assert_eq!(names, [json!("beta")]);
    talk(&me, &["port-zero", "hi", "--json"], &[], None).assert_failure(
        75,
        "instance_unavailable",
        true,
    );

    // A torn file (cut mid-JSON) reads as an empty registry: a clean "not available",
    // never a crash or a usage error.
    let bytes = std::fs::read(root.path.join(".bus-registry.json")).unwrap();
    std::fs::write(
        root.path.join(".bus-registry.json"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let t2 = talk(&me, &["no-such-instance", "hi", "--json"], &[], None);
    t2.assert_failure(75, "instance_unavailable", true);

    // The next registration sets the torn file aside and rewrites a valid one, and
    // lookups work again.
    let _gamma = root.start("gamma", &open_config("sc-0123456789abcdef"));
    let t3 = talk(&me, &["gamma", "recovered"], &[], None);
    assert_eq!(t3.code(), Some(0), "{}", t3.describe());
    assert_eq!(t3.stdout(), "recovered\n");
    let aside = std::fs::read_dir(&root.path)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".bus-registry.json.corrupt-")
        })
        .count();
    assert_eq!(aside, 1, "the torn registry was not set aside");

    // Regression: a live instance whose entry was lost with the torn file stayed
    // invisible until restarted. It now notices and registers again.
    assert!(
        eventually(Duration::from_secs(6), || {
            talk(&me, &["beta", "back again"], &[], None).code() == Some(0)
        }),
        "beta did not re-register after its entry was lost"
    );
    drop(beta);
}

/// Regression: two `serve` of one name (from two state directories) started at the same
/// moment both ran and both said `ready:`, while only one was registered; the other
/// stayed up, unreachable. Now exactly one runs and is registered, and the other exits 2
/// naming the holder. Several rounds, since it is a race.
#[test]
fn bug_two_serves_of_one_name_started_at_once_both_ran() {
    use std::process::{Command, Stdio};
    const ROUNDS: usize = 5;
    let root = TestRoot::new("reg-same-name");
    for dir in ["a", "b"] {
        root.write_config(dir, &open_config("same-name-0123456789abcdef"));
    }
    for round in 0..ROUNDS {
        let spawn = |dir: &str| {
            let stderr = root.path.join(format!("{dir}-{round}.stderr"));
            let child = Command::new(bin())
                .args(["serve", "--port", "0", "--name", "w", "--state-dir"])
                .arg(root.state_dir(dir))
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr).unwrap())
                .spawn()
                .unwrap();
            (child, stderr)
        };
        let mut both = [spawn("a"), spawn("b")];
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        let mut exited = [None, None];
        let settled = eventually(Duration::from_secs(30), || {
            for (i, (child, _)) in both.iter_mut().enumerate() {
                if exited[i].is_none() {
                    exited[i] = child.try_wait().unwrap().map(|s| s.code());
                }
            }
            let registered = root.registry()["instances"]["w"]["pid"].as_u64();
            exited.iter().filter(|e| e.is_some()).count() == 1
                && both.iter().enumerate().any(|(i, (child, _))| {
                    exited[i].is_none() && registered == Some(u64::from(child.id()))
                })
        });
        let shown = format!(
            "round {round}: exits {exited:?}\na:\n{}\nb:\n{}\nregistry: {}",
            read(&both[0].1),
            read(&both[1].1),
            root.registry()
        );
        assert!(settled, "{shown}");
        let loser = exited.iter().position(Option::is_some).unwrap();
        let winner = 1 - loser;
        assert_eq!(exited[loser], Some(Some(2)), "{shown}");
        let pid = both[winner].0.id();
        let lost = read(&both[loser].1);
        assert!(
            lost.contains("already running") && lost.contains(&format!("pid {pid}")),
            "the holder is named: {shown}"
        );
        assert!(!lost.contains("ready:"), "{shown}");
        assert!(
            eventually(Duration::from_secs(10), || read(&both[winner].1)
                .contains("ready:")),
            "{shown}"
        );
        signal(pid, "TERM");
        let (child, _) = &mut both[winner];
        assert!(
            eventually(Duration::from_secs(20), || child
                .try_wait()
                .unwrap()
                .is_some()),
            "{shown}"
        );
        assert!(root.registry()["instances"].get("w").is_none(), "{shown}");
    }
}
