//! Discovery: the registry under concurrent `serve` processes, torn and invalid
//! registry files, pruning at startup, duplicate names, and the `health` and `list`
//! commands.
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
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Child processes killed on drop, so a failing test leaves nothing running.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the binary like `common::run`, but kills it if it has not exited by `limit`.
fn run_bounded(args: &[&str], limit: Duration) -> Output {
    let child = Command::new(bin())
        .args(args)
        .env_remove("LOOPBUS_STATE_DIR")
        .env_remove("LOOPBUS_DEPTH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + limit;
    let killer = std::thread::spawn(move || {
        while Instant::now() < deadline {
            std::thread::sleep(POLL_INTERVAL);
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        // It may have exited since the check above.
        let _ = try_signal(pid, rustix::process::Signal::KILL);
    });
    let output = child.wait_with_output().unwrap();
    let _ = killer.join();
    output
}

#[test]
fn twenty_concurrent_serve_processes_lose_no_registration() {
    const N: usize = 20;
    let root = TestRoot::new("disc-twenty");
    let names: Vec<String> = (0..N).map(|i| format!("inst-{i:02}")).collect();
    for name in &names {
        root.write_config(
            name,
            &open_config(&format!("secret-{name}-0123456789abcdef")),
        );
    }
    // Start all of them at once; each registers (and prunes) while the others do.
    let mut children = Children(Vec::new());
    for name in &names {
        let stderr = std::fs::File::create(root.path.join(format!("{name}.stderr"))).unwrap();
        let child = Command::new(bin())
            .args(["serve", "--state-dir"])
            .arg(root.state_dir(name))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        children.0.push(child);
    }
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    let all_registered = || {
        let registry = root.registry();
        names
            .iter()
            .zip(&pids)
            .all(|(name, pid)| registry["instances"][name]["pid"].as_u64() == Some(u64::from(*pid)))
    };
    let stderr_of_all = || {
        names
            .iter()
            .map(|n| {
                format!(
                    "{n}: {}",
                    std::fs::read_to_string(root.path.join(format!("{n}.stderr")))
                        .unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        eventually(Duration::from_secs(60), all_registered),
        "registry: {}\n{}",
        root.registry(),
        stderr_of_all()
    );

    let listed = list_json(&root);
    assert_eq!(listed.len(), N, "{listed:?}");
    assert!(listed.iter().all(|i| i["alive"] == true), "{listed:?}");

    let first = root.state_dir(&names[0]);
    let t = talk(&first, &[&names[N - 1], "across the crowd"], &[], None);
    assert_eq!(t.code(), Some(0), "{}", t.describe());
    assert_eq!(t.stdout(), "across the crowd\n");

    // And concurrent deregistration loses nothing either: the registry ends empty.
    for pid in &pids {
        signal(*pid, "TERM");
    }
    for child in &mut children.0 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "an instance did not stop\n{}",
                stderr_of_all()
            );
            std::thread::sleep(POLL_INTERVAL);
        };
        assert_eq!(status.code(), Some(0), "{}", stderr_of_all());
    }
    assert_eq!(
        root.registry()["instances"],
        json!({}),
        "{}",
        stderr_of_all()
    );
}

#[test]
fn serve_prunes_stale_entries_at_startup() {
    let root = TestRoot::new("disc-prune");
    let impostor = FakePeer::start(|_| health_of("mallory"));
    let stopping = FakePeer::start(|_| {
        Answer::json(
            200,
            &json!({"kind": "loopbus", "instance": "stopping", "status": "stopping", "pid": 1}),
        )
    });
    let other_kind = FakePeer::start(|_| {
        Answer::json(
            200,
            &json!({"kind": "elsewhere", "instance": "foreign", "status": "ok", "pid": 1}),
        )
    });
    let not_http = FakePeer::start(|_| Answer::Respond(404, b"nope".to_vec()));
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    // Only an entry whose pid is gone is pruned (contract 6): a reaped child's pid.
    let gone = {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    register_by_hand(&root.path, "ghost", closed_port(), gone, "s1");
    register_by_hand(&root.path, "impostor", impostor.port, 1, "s2");
    register_by_hand(&root.path, "stopping", stopping.port, 1, "s3");
    register_by_hand(&root.path, "foreign", other_kind.port, 1, "s4");
    register_by_hand(&root.path, "web", not_http.port, gone, "s5");
    register_by_hand(
        &root.path,
        "silent",
        silent.local_addr().unwrap().port(),
        1,
        "s6",
    );

    let beta = root.start("beta", &open_config("sb-0123456789abcdef"));
    let mut names: Vec<String> = root.registry()["instances"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    names.sort();
    // Certainly stale: the pid is gone (whatever holds the port). Kept while the pid
    // lives: another instance's name on the port, a timeout, a stopping instance, an
    // instance of another kind (the original implementation's entries among them).
    assert_eq!(
        names,
        ["beta", "foreign", "impostor", "silent", "stopping"],
        "{}",
        beta.describe()
    );
    assert!(
        beta.wait_for_log("stale registry entry of ghost", Duration::from_secs(10)),
        "{}",
        beta.describe()
    );
    // The impostor was asked for its health only.
    assert!(impostor
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
}

#[test]
fn serve_refuses_a_name_that_is_already_running() {
    let root = TestRoot::new("disc-duplicate");
    let mut beta = root.start("beta", &open_config("sb-0123456789abcdef"));
    let dir = root.state_dir("beta").display().to_string();
    let args = ["serve", "--state-dir", dir.as_str()];
    let out = run_bounded(&args, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already running"),
        "{}",
        describe(&args, &out)
    );
    assert_eq!(root.registry()["instances"]["beta"]["pid"], beta.pid());

    // Once it is gone (killed, its entry stale), the name is free again.
    let mut child = beta.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let again = Instance::spawn(&root, "beta", &[]);
    assert_eq!(root.registry()["instances"]["beta"]["pid"], again.pid());
}

#[test]
fn health_command() {
    let root = TestRoot::new("disc-health");
    root.write_config("me", &json!({"bus": {"peers": "*"}}));
    let beta = root.start("beta", &open_config("sb-0123456789abcdef"));
    let root_arg = root.path.display().to_string();
    let me = root.state_dir("me").display().to_string();
    let beta_port = beta.port.to_string();
    let impostor = FakePeer::start(|_| health_of("mallory"));
    register_by_hand(&root.path, "fake", impostor.port, 1, "s");
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port().to_string();

    let alive: Vec<Vec<&str>> = vec![
        vec!["health", "beta", "--root", &root_arg],
        vec!["health", "beta", "--state-dir", &me],
        vec!["health", "--port", &beta_port],
        vec!["health", "beta", "--port", &beta_port],
    ];
    for args in alive {
        let out = run_probing(&args, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["instance"].as_str(), v["status"].as_str()),
            (Some("beta"), Some("ok"))
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("sb"));
    }
    let out = run_probing(&["health", "beta"], &[("LOOPBUS_STATE_DIR", &me)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        describe(&["health", "beta"], &out)
    );

    // (args, what stderr says)
    let not_alive: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["health", "nobody", "--root", &root_arg],
            "not registered",
        ),
        (
            vec!["health", "fake", "--root", &root_arg],
            "another instance",
        ),
        (
            vec!["health", "other", "--port", &beta_port],
            "another instance",
        ),
        (vec!["health", "--port", &silent_port], NO_ANSWER_IN_TIME),
    ];
    for (args, why) in not_alive {
        let started = Instant::now();
        // A probe timeout is the point of the silent port's case only.
        let out = if why == NO_ANSWER_IN_TIME {
            run(&args, &[], None)
        } else {
            run_probing(&args, &[])
        };
        assert_eq!(out.status.code(), Some(75), "{}", describe(&args, &out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{}",
            describe(&args, &out)
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    // No flags: the default channel root ($LOOPBUS_ROOT, else ~/.loopbus), named.
    let out = run(&["health", "beta"], &[], None);
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        describe(&["health"], &out)
    );
    let default = no_home().join(".loopbus/.bus-registry.json");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(default.to_str().unwrap()), "{said}");
    for args in [
        vec!["health"],
        vec!["health", "--port", "0"],
        vec!["health", "a b", "--root", &root_arg],
    ] {
        let out = run(&args, &[], None);
        assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    }
}

#[test]
fn list_command_shows_liveness_and_never_secrets() {
    let root = TestRoot::new("disc-list");
    let alpha = root.start("alpha", &open_config("alpha-secret-value"));
    let _beta = root.start("beta", &open_config("beta-secret-value"));
    register_by_hand(
        &root.path,
        "ghost",
        closed_port(),
        4242,
        "ghost-secret-value",
    );
    let root_arg = root.path.display().to_string();

    let args = ["list", "--root", root_arg.as_str()];
    let out = run_probing(&args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("NAME")
            && lines[0].contains("PORT")
            && lines[0].contains("PID")
            && lines[0].contains("ALIVE")
            && lines[0].contains("AGE"),
        "{text}"
    );
    let alpha_line = lines.iter().find(|l| l.starts_with("alpha")).unwrap();
    assert!(
        alpha_line.contains(&alpha.port.to_string())
            && alpha_line.contains(&alpha.pid().to_string()),
        "{text}"
    );
    assert!(
        alpha_line.split_whitespace().nth(3) == Some("yes"),
        "{text}"
    );
    let ghost_line = lines.iter().find(|l| l.starts_with("ghost")).unwrap();
    assert!(
        ghost_line.split_whitespace().nth(3) == Some("no") && ghost_line.contains("4242"),
        "{text}"
    );
    // A registration from 2026-01-01 reads in days.
    assert!(
        ghost_line.split_whitespace().nth(4).unwrap().ends_with('d'),
        "{text}"
    );

    let listed = list_json(&root);
    let alive: Vec<(String, bool)> = listed
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_owned(),
                i["alive"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        alive,
        [
            ("alpha".into(), true),
            ("beta".into(), true),
            ("ghost".into(), false)
        ]
    );
    assert!(
        listed[2]["problem"].as_str().unwrap().contains("connect"),
        "{listed:?}"
    );

    // Via the state directory's parent, too; never a secret anywhere.
    let alpha_dir = root.state_dir("alpha").display().to_string();
    for args in [
        vec!["list", "--state-dir", alpha_dir.as_str()],
        vec!["list", "--state-dir", alpha_dir.as_str(), "--json"],
    ] {
        let out = run_probing(&args, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&args, &out));
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains("secret-value"), "{all}");
        assert!(all.contains("ghost"), "{all}");
    }
    // No flags: the default channel root, named; nothing registered is no error.
    let out = run(&["list"], &[], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&["list"], &out));
    let default = no_home().join(".loopbus/.bus-registry.json");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(default.to_str().unwrap()), "{said}");
}
