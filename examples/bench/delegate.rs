//! The end-to-end cost of one delegation to an echo instance: `loopbus talk` as a
//! process, and the library client call.

use crate::load;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Longest one `loopbus talk` process may run before the bench kills it.
const TALK_TIMEOUT: Duration = Duration::from_secs(10);
/// The prompt delegated.
pub const PROMPT: &str = "ping from the bench";

/// The outcome of one delegation measurement.
#[derive(Debug, Clone)]
pub enum Delegation {
    /// Measured: the median, fastest and slowest of `samples` delegations.
    Measured {
        /// Delegations timed.
        samples: usize,
        /// Their median duration.
        median: Duration,
        /// The fastest.
        min: Duration,
        /// The slowest.
        max: Duration,
    },
    /// This build cannot do it (yet); the text says why.
    NotAvailable(String),
    /// It ran but failed; the text says how.
    Failed(String),
}

/// Times `samples` calls of `once` after one untimed call that decides availability.
fn measure(samples: usize, mut once: impl FnMut() -> Attempt) -> Delegation {
    match once() {
        Attempt::Unavailable(why) => return Delegation::NotAvailable(why),
        Attempt::Failed(why) => return Delegation::Failed(why),
        Attempt::Done(_) => {}
    }
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        match once() {
            Attempt::Done(took) => times.push(took),
            Attempt::Failed(why) | Attempt::Unavailable(why) => return Delegation::Failed(why),
        }
    }
    match (load::median(&times), times.iter().min(), times.iter().max()) {
        (Some(median), Some(&min), Some(&max)) => Delegation::Measured {
            samples,
            median,
            min,
            max,
        },
        _ => Delegation::Failed("no sample".to_owned()),
    }
}

/// One timed delegation.
enum Attempt {
    Done(Duration),
    Unavailable(String),
    Failed(String),
}

/// `loopbus talk TARGET PROMPT --state-dir CALLER_DIR`, `samples` times.
pub fn talk_process(bin: &Path, caller_dir: &Path, target: &str, samples: usize) -> Delegation {
    measure(samples, || talk_once(bin, caller_dir, target))
}

fn talk_once(bin: &Path, caller_dir: &Path, target: &str) -> Attempt {
    let mut command = Command::new(bin);
    command
        .arg("talk")
        .arg(target)
        .arg(PROMPT)
        .arg("--state-dir")
        .arg(caller_dir)
        .env_remove("RUST_LOG")
        .env_remove("LOOPBUS_STATE_DIR")
        .env_remove("LOOPBUS_DEPTH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The process is waited for on a helper thread so that a hung one can be killed
    // at the timeout; the clock runs around the spawn and the wait only.
    let (tx, rx) = mpsc::channel();
    let (pid_tx, pid_rx) = mpsc::channel();
    thread::spawn(move || {
        let started = Instant::now();
        let result = command.spawn().and_then(|child| {
            let _ = pid_tx.send(child.id());
            child.wait_with_output()
        });
        let _ = tx.send(result.map(|output| (output, started.elapsed())));
    });
    match rx.recv_timeout(TALK_TIMEOUT) {
        Ok(Ok((output, took))) => judge(&output, took),
        Ok(Err(e)) => Attempt::Failed(format!("cannot run {}: {e}", bin.display())),
        Err(_) => {
            if let Some(pid) = pid_rx
                .try_recv()
                .ok()
                .and_then(|pid| i32::try_from(pid).ok())
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            Attempt::Failed(format!(
                "`loopbus talk` did not finish within {TALK_TIMEOUT:?}"
            ))
        }
    }
}

/// Whether a `loopbus talk` run succeeded: exit 0 and the echoed prompt on stdout.
fn judge(output: &Output, took: Duration) -> Attempt {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() && stdout.trim_end() == PROMPT {
        return Attempt::Done(took);
    }
    if output.status.code() == Some(2) && stderr.contains("unknown command") {
        return Attempt::Unavailable("`loopbus talk` is not in this build yet".to_owned());
    }
    let first_line = stderr.lines().next().unwrap_or("").trim();
    Attempt::Failed(format!(
        "`loopbus talk` exited with {}: {first_line}",
        output.status
    ))
}

/// The library client call, `samples` times, from the instance at `caller_dir`.
/// The caller's config is read once; each sample is one `loopbus::delegate` call
/// (registry lookup, health probe, POST /api/talk).
pub fn library_call(caller_dir: &Path, target: &str, samples: usize) -> Delegation {
    let options = match delegate_options(caller_dir, target) {
        Ok(options) => options,
        Err(why) => return measure(1, || Attempt::Failed(why.clone())),
    };
    measure(samples, || {
        let started = Instant::now();
        match loopbus::delegate(&options) {
            Ok(reply) if reply.text == PROMPT => Attempt::Done(started.elapsed()),
            Ok(reply) => Attempt::Failed(format!("unexpected reply {:?}", reply.text)),
            Err(e) => Attempt::Failed(format!("delegate failed: {e}")),
        }
    })
}

/// The options `loopbus talk` would build for the instance at `caller_dir`.
fn delegate_options(caller_dir: &Path, target: &str) -> Result<loopbus::DelegateOptions, String> {
    let config =
        loopbus::load_config(&caller_dir.join("config.json")).map_err(|e| e.to_string())?;
    let caller = caller_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("caller directory has no name")?
        .parse::<loopbus::InstanceName>()
        .map_err(|e| e.to_string())?;
    let target = target
        .parse::<loopbus::InstanceName>()
        .map_err(|e| e.to_string())?;
    let root = caller_dir
        .parent()
        .ok_or("caller directory has no parent")?
        .to_path_buf();
    Ok(loopbus::DelegateOptions::new(
        root, caller, config.bus, target, PROMPT,
    ))
}
