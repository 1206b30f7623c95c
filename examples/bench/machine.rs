//! Where and how a run was made: the machine (from /proc), the date, the load
//! average, the commit and the command.

/// The machine, the date, and how the run was made.
pub struct Machine {
    /// When the run started (UTC, ISO-8601).
    pub date: String,
    /// Usable CPUs.
    pub nproc: usize,
    /// The CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// The kernel release.
    pub kernel: String,
    /// Total memory.
    pub memory: String,
    /// 1-minute load average when the run started and when it ended.
    pub load_start: String,
    pub load_end: String,
    /// The commit measured.
    pub commit: String,
    /// The command that made the run.
    pub command: String,
    /// Whether measurements were shortened (`--quick`).
    pub quick: bool,
    /// How long each load point ran.
    pub timing: String,
}

impl Machine {
    /// Reads what /proc says about this machine, and the load average now.
    pub fn probe(command: String, quick: bool) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or("unknown", |(_, model)| model.trim())
            .to_owned();
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or_else(
                || "unknown".to_owned(),
                |kib| format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0)),
            );
        Machine {
            date: loopbus::state::now_iso8601(),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            memory,
            load_start: load_average(),
            load_end: String::new(),
            commit: git_commit(),
            command,
            quick,
            timing: String::new(),
        }
    }

    /// Notes the load average at the end of the run.
    pub fn finish(&mut self) {
        self.load_end = load_average();
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The 1-minute load average.
fn load_average() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .next()
        .unwrap_or("unknown")
        .to_owned()
}

/// The checked-out commit, marked when the tree has local changes.
fn git_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(commit) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{commit} with local changes"),
            _ => commit,
        },
        None => "unknown".to_owned(),
    }
}

/// The soft limit on open files of this process, from /proc.
pub fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
