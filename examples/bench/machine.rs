//! Where and how a run was made: the machine (from /proc), the date, the commit, the
//! command, and how busy the machine was with other work during the run.

/// Share of the machine's CPU time that other processes may use during a run before
/// the report calls its figures noisy.
const NOISY_FOREIGN_CPU: f64 = 0.10;

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
    /// 1-minute load average just before the run.
    pub load_before: String,
    /// CPU counters when the run started.
    cpu_at_start: Option<CpuTicks>,
    /// Share of all CPU time, during the run, used by processes other than the bench
    /// and its children (`None` until [`Machine::finish`], or if /proc said nothing).
    pub foreign_cpu: Option<f64>,
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
            date: loopbus::now_iso8601(),
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            memory,
            load_before: load_average(),
            cpu_at_start: CpuTicks::now(),
            foreign_cpu: None,
            commit: git_commit(),
            command,
            quick,
            timing: String::new(),
        }
    }

    /// Works out how much CPU other processes took during the run. Call it once every
    /// child process has been waited for, so that theirs counts as the bench's own.
    pub fn finish(&mut self) {
        self.foreign_cpu = match (self.cpu_at_start, CpuTicks::now()) {
            (Some(start), Some(end)) => {
                let all = end.all.saturating_sub(start.all);
                let busy = end.busy.saturating_sub(start.busy);
                let own = end.own.saturating_sub(start.own);
                (all > 0).then(|| busy.saturating_sub(own) as f64 / all as f64)
            }
            _ => None,
        };
    }

    /// Whether other work took enough CPU during the run to make its figures noisy.
    pub fn noisy(&self) -> bool {
        self.foreign_cpu
            .is_some_and(|share| share > NOISY_FOREIGN_CPU)
    }
}

/// CPU time counters, in clock ticks.
#[derive(Debug, Clone, Copy)]
struct CpuTicks {
    /// Every CPU's time, idle included.
    all: u64,
    /// Every CPU's time spent on processes (steal included: the hypervisor gave it to
    /// others).
    busy: u64,
    /// This process's and its waited-for children's user and system time.
    own: u64,
}

impl CpuTicks {
    fn now() -> Option<CpuTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        // cpu user nice system idle iowait irq softirq steal guest guest_nice; guest
        // time is already inside user time.
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .take(8)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = fields[..] else {
            return None;
        };
        // Interrupt time is left out of `busy`: with IRQ time accounting, the loopback
        // traffic the bench itself makes is charged there and not to any process.
        let busy = user + nice + system + steal;
        // /proc/self/stat: fields after the parenthesized name; utime, stime, cutime and
        // cstime are the 14th to 17th fields of the whole line.
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let after_name = own_stat.rsplit_once(')')?.1;
        let own: u64 = after_name
            .split_whitespace()
            .skip(11)
            .take(4)
            .map(|f| f.parse::<u64>().ok())
            .sum::<Option<u64>>()?;
        Some(CpuTicks {
            all: busy + idle + iowait + irq + softirq,
            busy,
            own,
        })
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
        // The results file itself does not count: every run rewrites it.
        Some(commit) => match git(&[
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            ".",
            ":!bench/results.md",
        ]) {
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
