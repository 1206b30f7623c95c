//! What the `loopbus` binary takes from the library, used as an embedder (or the MCP
//! front door) would: the registry of a channel root and its liveness, an instance's
//! usage and audit log, the trust rule of state files, the engine checks and the
//! timestamps, all through the crate root.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests fail loudly on purpose"
)]

use loopbus::{
    channel_root, check_trusted, delegate, engine_findings, list_instances, load_config,
    now_iso8601, parse_iso8601, probe_instance, probe_port, read_audit_log, read_registry,
    read_usage, registry_path, running_instance, untrusted, DelegateOptions, EngineOverride,
    Instance, InstanceName, InstanceOptions, ProbeError, TrustKind, AUDIT_FILE, CONFIG_FILE,
};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A private temp channel root, removed on drop.
struct Root(PathBuf);

impl Root {
    fn new(label: &str) -> Root {
        let path = std::env::temp_dir().join(format!(
            "loopbus-api-{label}-{}-{}",
            std::process::id(),
            now_iso8601().replace([':', '.'], "")
        ));
        loopbus::create_dir_private(&path).unwrap();
        Root(path)
    }

    /// A state directory `name` whose config.json lets every peer call it.
    fn instance_dir(&self, name: &str) -> PathBuf {
        let dir = self.0.join(name);
        loopbus::create_dir_private(&dir).unwrap();
        let config = br#"{"bus": {"peers": "*", "maxDepth": 3, "port": 0}}"#;
        loopbus::write_atomic(&dir.join(CONFIG_FILE), config, loopbus::PRIVATE_FILE_MODE).unwrap();
        dir
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn name(text: &str) -> InstanceName {
    text.parse().unwrap()
}

#[test]
fn an_embedder_reads_the_registry_probes_it_and_reads_the_records() {
    let root = Root::new("registry");
    let dir = root.instance_dir("worker");
    let caller_dir = root.instance_dir("caller");
    assert_eq!(channel_root(&dir), root.0);
    let instance =
        Instance::start(InstanceOptions::new(&dir).engine(EngineOverride::Echo)).unwrap();
    let port = instance.addr().port();
    let stop = instance.shutdown_handle();
    let serving = std::thread::spawn(move || instance.run());

    // The registry: one entry, where the instance listens, proving itself.
    let entries = read_registry(&root.0).unwrap();
    let entry = entries.get(&name("worker")).expect("worker is registered");
    assert_eq!(entry.port, port);
    assert_eq!(entry.pid, std::process::id());
    assert!(entry.proof);
    assert!(parse_iso8601(&entry.updated_at).is_some());
    assert!(registry_path(&root.0).is_file());

    // Liveness: the listing, one entry's probe, a bare port, and "is it running".
    let listed = list_instances(&root.0, None).unwrap();
    assert_eq!(listed.len(), 1);
    let alive = &listed[0];
    assert_eq!(alive.name, name("worker"));
    assert!(!alive.is_stale() && !alive.process_is_gone());
    let answer = alive.liveness.as_ref().expect("alive");
    assert_eq!(answer.health.instance, "worker");
    assert_eq!(answer.health.bus_enabled, Some(true));
    assert_eq!(answer.body["instance"], "worker");
    let probed = probe_instance(&name("worker"), entry, None).unwrap();
    assert_eq!(probed.health.pid, std::process::id());
    assert_eq!(
        probe_port(port, None, None).unwrap().health.instance,
        "worker"
    );
    match probe_port(port, Some(&name("other")), None) {
        Err(e @ ProbeError::OtherInstance(_)) => assert!(e.is_stale(), "{e}"),
        other => panic!("expected OtherInstance, got {other:?}"),
    }
    assert_eq!(
        running_instance(&root.0, &name("worker"))
            .unwrap()
            .map(|e| e.port),
        Some(port)
    );
    assert!(running_instance(&root.0, &name("nobody"))
        .unwrap()
        .is_none());

    // One talk, then its records: usage (the echo engine reports none) and the audit log.
    let config = load_config(&caller_dir.join(CONFIG_FILE)).unwrap();
    let options = DelegateOptions::new(&root.0, name("caller"), config.bus, name("worker"), "hi")
        .with_timeout(Duration::from_secs(30));
    assert_eq!(delegate(&options).unwrap().text, "hi");
    assert_eq!(read_usage(&dir).unwrap().request_count, 0);
    stop.shutdown();
    serving.join().unwrap().unwrap();
    let audit = fs::read_to_string(dir.join(AUDIT_FILE)).unwrap();
    let mut records = Vec::new();
    assert_eq!(read_audit_log(&dir, |r| records.push(r)), 0, "{audit}");
    let last = records.last().unwrap();
    assert_eq!(
        last.metadata.from_instance.as_deref(),
        Some("caller"),
        "{audit}"
    );
    assert_eq!(last.outcome, "success", "{audit}");
    assert!(read_registry(&root.0).unwrap().is_empty(), "deregistered");
}

#[test]
fn an_embedder_checks_state_files_and_engines_as_serve_does() {
    let root = Root::new("trust");
    let dir = root.instance_dir("solo");
    check_trusted(&dir, TrustKind::Dir).unwrap();
    check_trusted(&dir.join(CONFIG_FILE), TrustKind::File).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let refused = check_trusted(&dir, TrustKind::Dir).unwrap_err();
    let why = untrusted(&refused).expect("an untrusted directory, with the reason");
    assert_eq!(why.path, dir);
    assert_eq!(why.mode & 0o777, 0o777);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();

    // The echo engine: nothing to check but `loopbus` on our PATH.
    let echo = engine_findings(None);
    assert_eq!(echo.cwd, None);
    assert_eq!(echo.program, Ok(None));
    // A command that is nowhere.
    let mut engine = loopbus::EngineConfig::new(vec!["/nonexistent/engine".to_owned()]);
    engine.cwd = Some(Path::new("/nonexistent/cwd").to_path_buf());
    let found = engine_findings(Some(&engine));
    assert!(found
        .cwd
        .is_some_and(|why| why.contains("/nonexistent/cwd")));
    assert!(found.program.is_err());
}

#[test]
fn timestamps_round_trip() {
    let now = now_iso8601();
    assert!(now.ends_with('Z'), "{now}");
    assert!(parse_iso8601(&now).is_some());
    assert_eq!(parse_iso8601("2026-02-30T00:00:00Z"), None);
}
