//! An embedder's view: two instances started in this test process through the root
//! re-exports only, delegating to each other with `delegate`, then stopped.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use crate::common::eventually;
use loopbus::{
    delegate, load_config, DelegateOptions, EngineOverride, ErrorCode, Instance, InstanceName,
    InstanceOptions, ServeError,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A temp channel root, removed on drop.
struct Root(PathBuf);

impl Root {
    fn new(label: &str) -> Root {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "loopbus-embed-{label}-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&path).unwrap();
        Root(path)
    }

    /// A state directory `name` with a config.json allowing `peers`.
    fn instance_dir(&self, name: &str, peers: &str) -> PathBuf {
        let dir = self.0.join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("config.json"),
            format!(r#"{{"bus": {{"peers": {peers}, "maxDepth": 3, "port": 0}}}}"#),
        )
        .unwrap();
        dir
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn options(root: &Path, caller_dir: &Path, caller: &str, target: &str) -> DelegateOptions {
    let config = load_config(&caller_dir.join("config.json")).unwrap();
    DelegateOptions::new(
        root,
        caller.parse::<InstanceName>().unwrap(),
        config.bus,
        target.parse::<InstanceName>().unwrap(),
        format!("hello {target}, from {caller}"),
    )
    .with_timeout(Duration::from_secs(30))
}

#[test]
fn two_instances_in_one_process_delegate_to_each_other() {
    let root = Root::new("pair");
    let alpha_dir = root.instance_dir("alpha", r#"["beta"]"#);
    let beta_dir = root.instance_dir("beta", r#""*""#);

    let alpha = Instance::start(InstanceOptions::new(&alpha_dir).port(0)).unwrap();
    let beta =
        Instance::start(InstanceOptions::new(&beta_dir).engine(EngineOverride::Echo)).unwrap();
    assert_eq!(alpha.name(), "alpha");
    assert_eq!(beta.name(), "beta");
    assert!(alpha.addr().ip().is_loopback());
    assert_ne!(
        alpha.addr().port(),
        0,
        "port 0 is replaced by the one bound"
    );
    let stops = [alpha.shutdown_handle(), beta.shutdown_handle()];
    let serving: Vec<_> = [alpha, beta]
        .into_iter()
        .map(|instance| std::thread::spawn(move || instance.run()))
        .collect();

    let reply = delegate(&options(&root.0, &alpha_dir, "alpha", "beta")).unwrap();
    assert_eq!(reply.text, "hello beta, from alpha");
    assert_eq!(reply.from_instance, "beta");
    let reply = delegate(&options(&root.0, &beta_dir, "beta", "alpha")).unwrap();
    assert_eq!(reply.text, "hello alpha, from beta");
    assert_eq!(reply.from_instance, "alpha");

    // alpha's peers are ["beta"]: a third caller is refused by alpha itself.
    let stranger = options(&root.0, &beta_dir, "gamma", "alpha");
    let refused = delegate(&stranger).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::PeerNotAllowed);
    assert!(!refused.retryable());

    for stop in &stops {
        stop.shutdown();
    }
    for handle in serving {
        handle.join().unwrap().unwrap();
    }
    // Both deregistered on the way out.
    let registry = fs::read_to_string(root.0.join(".bus-registry.json")).unwrap();
    let registry: serde_json::Value = serde_json::from_str(&registry).unwrap();
    assert_eq!(registry["instances"], serde_json::json!({}), "{registry}");
}

#[test]
fn a_second_instance_for_one_state_dir_is_refused_with_a_typed_error() {
    let root = Root::new("twice");
    let dir = root.instance_dir("solo", r#""*""#);
    let first = Instance::start(InstanceOptions::new(&dir)).unwrap();
    match Instance::start(InstanceOptions::new(&dir)) {
        Err(ServeError::AlreadyServing(path)) => assert!(path.ends_with("solo"), "{path:?}"),
        other => panic!("expected AlreadyServing, got {other:?}"),
    }
    let missing = root.0.join("nobody-here");
    fs::create_dir_all(&missing).unwrap();
    match Instance::start(InstanceOptions::new(&missing)) {
        Err(e @ ServeError::Config(_)) => {
            assert!(e.to_string().contains("loopbus init"), "{e}");
            assert!(!e.while_serving());
        }
        other => panic!("expected ConfigRead, got {other:?}"),
    }
    match Instance::start(InstanceOptions::new(&dir).name("bad name")) {
        Err(ServeError::InvalidName(why)) => assert!(why.contains("bad name"), "{why}"),
        other => panic!("expected InvalidName, got {other:?}"),
    }
    let stop = first.shutdown_handle();
    let serving = std::thread::spawn(move || first.run());
    stop.shutdown();
    serving.join().unwrap().unwrap();
}

/// An instance dropped without `run` used to leave its registry entry (and its turn
/// workers blocked): dropping it deregisters and closes its port.
#[test]
fn bug_an_instance_dropped_without_run_stayed_registered() {
    let root = Root::new("dropped");
    let dir = root.instance_dir("dropped", r#""*""#);
    let instance = Instance::start(InstanceOptions::new(&dir)).unwrap();
    let addr = instance.addr();
    let registry_path = root.0.join(".bus-registry.json");
    let registry: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&registry_path).unwrap()).unwrap();
    assert!(registry["instances"]["dropped"].is_object(), "{registry}");
    drop(instance);
    let registry: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&registry_path).unwrap()).unwrap();
    assert_eq!(registry["instances"], serde_json::json!({}), "{registry}");
    // Other tests of this binary spawn processes from other threads: a fork copies
    // every descriptor, the listening socket's and the serve lock's too, until its exec
    // closes it, so either may outlive the drop by a moment.
    let refused = eventually(Duration::from_secs(5), || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
    });
    assert!(refused, "{addr} still accepts connections");
    // The state directory is free again: a new instance starts there.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let again = loop {
        match Instance::start(InstanceOptions::new(&dir)) {
            Err(ServeError::AlreadyServing(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            started => break started.unwrap(),
        }
    };
    drop(again);
}
