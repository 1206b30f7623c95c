//! Files another user owns or may write to (contract 1): a channel root, a state
//! directory, config.json or the registry planted by someone else is refused by
//! `serve`, `init` and `talk` instead of trusted. The chown cases need root (to give a
//! file to `nobody`) and are skipped with a message otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{bin, describe, open_config, run, TestRoot, POLL_INTERVAL};
use serde_json::json;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `nobody`: the other user whose files these tests plant.
const NOBODY: u32 = 65534;
/// How long a refusing `serve` may take to exit (generous: the machine is shared).
const EXIT_BOUND: Duration = Duration::from_secs(20);

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn give_to_nobody(path: &Path) {
    std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `loopbus serve` for `state_dir` on port 0 until it exits (killed if it is
/// still serving after [`EXIT_BOUND`]): its exit code (`None`: it served) and stderr.
fn serve(state_dir: &Path) -> (Option<i32>, String) {
    let stderr_path = state_dir.with_extension("stderr");
    let mut child = Command::new(bin())
        .args(["serve", "--port", "0", "--state-dir"])
        .arg(state_dir)
        .env_remove("LOOPBUS_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EXIT_BOUND;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    (code, fs::read_to_string(&stderr_path).unwrap_or_default())
}

fn assert_refused(state_dir: &Path, names: &str, why: &str) {
    let (code, stderr) = serve(state_dir);
    assert_eq!(code, Some(2), "{why}: serve must refuse; stderr:\n{stderr}");
    assert!(
        stderr.contains(names),
        "{why}: the message must name {names}; stderr:\n{stderr}"
    );
}

/// A config whose engine leaves `marker` behind if it ever runs.
fn planted_config(marker: &Path) -> serde_json::Value {
    json!({
        "bus": {"peers": "*", "secret": "s3cret-s3cret-s3cret"},
        "engine": {"command": ["/bin/sh", "-c", format!("id > {}", marker.display())], "output": "text"}
    })
}

#[test]
fn bug_a_world_writable_channel_root_was_only_warned_about() {
    let root = TestRoot::new("foreign-root-777");
    root.write_config("w", &open_config("s3cret-s3cret-s3cret"));
    set_mode(&root.path, 0o777);
    assert_refused(
        &root.state_dir("w"),
        "mode 777",
        "a channel root of mode 777",
    );
    let (_, stderr) = serve(&root.state_dir("w"));
    assert!(
        stderr.contains(&root.path.display().to_string()),
        "{stderr}"
    );
    assert!(stderr.contains("chmod go-w"), "the fix is named: {stderr}");
    assert_eq!(
        root.registry(),
        serde_json::Value::Null,
        "nothing registered"
    );
    // A state directory writable by its group is refused too.
    set_mode(&root.path, 0o755);
    set_mode(&root.state_dir("w"), 0o770);
    assert_refused(&root.state_dir("w"), "mode 770", "a state dir of mode 770");
}

#[test]
fn bug_a_planted_config_ran_its_engine_as_the_victim() {
    let root = TestRoot::new("foreign-config-666");
    let marker = root.path.join("pwned");
    let config = root.write_config("w", &planted_config(&marker));
    set_mode(&config, 0o666);
    assert_refused(
        &root.state_dir("w"),
        "mode 666",
        "a config.json of mode 666",
    );
    assert!(!marker.exists(), "the planted engine ran");
    if !is_root() {
        eprintln!("skipping the chown case: not root");
        return;
    }
    set_mode(&config, 0o600);
    give_to_nobody(&config);
    assert_refused(
        &root.state_dir("w"),
        "uid 65534",
        "a config.json of nobody's",
    );
    assert!(!marker.exists(), "the planted engine ran");
}

#[test]
fn bug_a_channel_root_of_another_user_was_trusted() {
    if !is_root() {
        eprintln!("skipping: giving files to nobody needs root");
        return;
    }
    let root = TestRoot::new("foreign-root-owner");
    root.write_config("w", &open_config("s3cret-s3cret-s3cret"));
    root.write_config("caller", &open_config("c4ller-c4ller-c4ller"));
    give_to_nobody(&root.path);
    assert_refused(&root.state_dir("w"), "uid 65534", "a root of nobody's");

    let caller = root.state_dir("caller");
    let args = [
        "talk",
        "--state-dir",
        caller.to_str().unwrap(),
        "w",
        "hello",
    ];
    let out = run(&args, &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&args, &out));
    assert!(stderr.contains("uid 65534"), "{}", describe(&args, &out));
    assert!(
        stderr.contains("not retryable"),
        "{}",
        describe(&args, &out)
    );

    let fresh = root.state_dir("fresh");
    let args = ["init", fresh.to_str().unwrap()];
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&args, &out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("uid 65534"),
        "{}",
        describe(&args, &out)
    );
    assert!(!fresh.exists(), "init wrote into nobody's root");
}

#[test]
fn bug_another_users_registry_file_redirected_talk() {
    if !is_root() {
        eprintln!("skipping: giving files to nobody needs root");
        return;
    }
    let root = TestRoot::new("foreign-registry");
    root.write_config("w", &open_config("s3cret-s3cret-s3cret"));
    root.write_config("caller", &open_config("c4ller-c4ller-c4ller"));
    set_mode(&root.path, 0o700);
    let registry = root.path.join(".bus-registry.json");
    let planted = json!({"instances": {"target": {
        "port": 9, "pid": 1, "secret": "n0body-n0body-n0body",
        "updatedAt": "2026-01-01T00:00:00.000Z", "proof": true
    }}});
    fs::write(&registry, planted.to_string()).unwrap();
    set_mode(&registry, 0o600);
    give_to_nobody(&registry);

    let caller = root.state_dir("caller");
    let args = [
        "talk",
        "--state-dir",
        caller.to_str().unwrap(),
        "target",
        "hello",
    ];
    let out = run(&args, &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&args, &out));
    assert!(
        stderr.contains("uid 65534") && stderr.contains(".bus-registry.json"),
        "{}",
        describe(&args, &out)
    );

    assert_refused(&root.state_dir("w"), "cannot register", "nobody's registry");
    let after: serde_json::Value = serde_json::from_slice(&fs::read(&registry).unwrap()).unwrap();
    assert_eq!(after, planted, "serve wrote into nobody's registry");
}

/// How a reload test breaks the trust in config.json after start-up, then plants the
/// engine config another user would write.
#[derive(Debug, Clone, Copy)]
enum Slip {
    /// config.json becomes writable by others, then is edited in place.
    ConfigMode,
    /// The state directory becomes writable by its group, then config.json is replaced.
    StateDirMode,
    /// config.json is replaced by a symlink to the planted file.
    Symlink,
    /// config.json is replaced by a file of another user (root only).
    OtherOwner,
}

/// Regression (high): config.json's 500 ms reload did not apply the start-up trust
/// checks, so after a mode slip another user's `engine.command` ran as the victim at the
/// next talk. Each slip: the old (echo) engine answers, the planted one never runs, and
/// the refusal is logged once, not at every look.
#[test]
fn bug_reload_skipped_the_trust_checks() {
    let mut slips = vec![Slip::ConfigMode, Slip::StateDirMode, Slip::Symlink];
    if is_root() {
        slips.push(Slip::OtherOwner);
    } else {
        eprintln!("skipping the other-owner case: giving files to nobody needs root");
    }
    std::thread::scope(|scope| {
        for slip in slips {
            scope.spawn(move || reload_refuses(slip));
        }
    });
}

fn reload_refuses(slip: Slip) {
    /// The warning of a refused reload.
    const KEPT: &str = "keeping the last good config";
    let root = TestRoot::new(&format!("foreign-reload-{slip:?}"));
    let w = root.start("w", &open_config("s3cret-s3cret-s3cret"));
    let config = w.state_dir.join("config.json");
    let marker = root.path.join("pwned");
    let planted = serde_json::to_vec(&planted_config(&marker)).unwrap();
    let context = format!("{slip:?}");
    let wait_for_refusal = || {
        assert!(
            w.wait_for_log(KEPT, EXIT_BOUND),
            "{context}: no refusal\n{}",
            w.describe()
        );
    };
    match slip {
        Slip::ConfigMode => {
            set_mode(&config, 0o666);
            wait_for_refusal();
            fs::write(&config, &planted).unwrap();
        }
        Slip::StateDirMode => {
            set_mode(&w.state_dir, 0o770);
            wait_for_refusal();
            common::write_file_atomic(&config, &planted);
        }
        Slip::Symlink => {
            let target = root.path.join("planted.json");
            fs::write(&target, &planted).unwrap();
            set_mode(&target, 0o600);
            let link = w.state_dir.join("config.json.link");
            std::os::unix::fs::symlink(&target, &link).unwrap();
            fs::rename(&link, &config).unwrap();
        }
        Slip::OtherOwner => {
            let theirs = w.state_dir.join("config.json.theirs");
            fs::write(&theirs, &planted).unwrap();
            set_mode(&theirs, 0o600);
            give_to_nobody(&theirs);
            fs::rename(&theirs, &config).unwrap();
        }
    }
    wait_for_refusal();
    // Several more looks at config.json (every 500 ms) while it stays refused.
    std::thread::sleep(Duration::from_millis(2000));
    let r = w.talk("c", "still echo", 0);
    common::assert_success(&r, "w", "still echo", &context);
    assert!(!marker.exists(), "{context}: the planted engine ran");
    let log = w.stderr();
    assert_eq!(
        log.matches(KEPT).count(),
        1,
        "{context}: warned once\n{log}"
    );
    let why = match slip {
        Slip::ConfigMode => "mode 666",
        Slip::StateDirMode => "mode 770",
        Slip::Symlink => "symbolic link",
        Slip::OtherOwner => "uid 65534",
    };
    assert!(log.contains(why), "{context}: the reason is named\n{log}");
    if let Slip::ConfigMode = slip {
        // Fixed (the good config back, then the mode), it reloads; broken again, it
        // warns again.
        fs::write(
            &config,
            serde_json::to_vec(&open_config("s3cret-s3cret-s3cret")).unwrap(),
        )
        .unwrap();
        set_mode(&config, 0o600);
        assert!(
            w.wait_for_log("reloaded: ", EXIT_BOUND),
            "{context}: no reload once fixed\n{}",
            w.describe()
        );
        set_mode(&config, 0o666);
        assert!(
            common::eventually(EXIT_BOUND, || w.stderr().matches(KEPT).count() == 2),
            "{context}: broken again, warned again\n{}",
            w.describe()
        );
    }
}

/// Regression: `talk` read its caller's own config.json without the trust check that
/// `serve` makes, so another user who could write it (or the state directory, to swap
/// it) decided the caller's `peers`, `maxDepth` and whether its bus is enabled.
#[test]
fn bug_talk_trusted_a_caller_config_others_could_write() {
    let root = TestRoot::new("foreign-caller");
    root.write_config("caller", &json!({"bus": {"peers": "*"}}));
    set_mode(&root.path, 0o700);
    let caller = root.state_dir("caller");
    let config = caller.join("config.json");
    let args = [
        "talk",
        "--state-dir",
        caller.to_str().unwrap(),
        "target",
        "hello",
    ];
    // (path, its mode, why)
    let cases = [
        (&config, 0o620, "a group-writable config.json"),
        (&config, 0o602, "an other-writable config.json"),
        (&caller, 0o770, "a group-writable state directory"),
        (&caller, 0o707, "an other-writable state directory"),
    ];
    for (path, mode, why) in cases {
        let old = fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        set_mode(path, mode);
        let out = run(&args, &[], None);
        set_mode(path, old);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{why}: {}",
            describe(&args, &out)
        );
        assert!(
            stderr.contains(&format!("refusing {}", path.display()))
                && stderr.contains("chmod go-w"),
            "{why}: {}",
            describe(&args, &out)
        );
    }
    // Tightened again: the talk goes as far as the registry (nothing is registered).
    let out = run(&args, &[], None);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&args, &out));
}
