//! Who a process is, across monitor restarts and reboots. A PID alone is
//! not an identity: PIDs are reused, and after a reboot a recorded PID
//! names some unrelated process. Records therefore keep the boot they were
//! made in and the process's start time, and a PID is trusted only while
//! both still match. The same boot ID tells a sandbox of this boot from one
//! a reboot left behind.

use std::path::Path;

/// This boot's ID (`/proc/sys/kernel/random/boot_id`), or empty where the
/// kernel does not say (then only start times are compared).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether something recorded in boot `recorded` belongs to boot
/// `current`; where either is unknown (empty), the boot cannot tell.
pub fn same_boot(recorded: &str, current: &str) -> bool {
    recorded.is_empty() || current.is_empty() || recorded == current
}

/// The start time of `pid` in clock ticks since boot (`/proc/<pid>/stat`,
/// field 22), if the process exists.
pub fn start_ticks(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    parse_start_ticks(&stat)
}

/// Field 22 of a `stat` line. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted from its closing parenthesis.
fn parse_start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")" come fields 3, 4, …: field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A process as a record remembers it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub pid: i32,
    pub boot_id: String,
    pub start_ticks: u64,
}

impl Identity {
    /// The identity of a live `pid` now (start time 0 if it is gone).
    pub fn of(pid: i32) -> Identity {
        Identity {
            pid,
            boot_id: boot_id(),
            start_ticks: start_ticks(pid).unwrap_or(0),
        }
    }

    /// Whether the process is still alive and is the one recorded: same
    /// boot, same start time. A record without a start time (written by an
    /// older monitor) is trusted on the boot alone, and only if it has one.
    pub fn is_alive(&self, current_boot: &str) -> bool {
        if !same_boot(&self.boot_id, current_boot) {
            return false;
        }
        match start_ticks(self.pid) {
            None => false,
            Some(t) if self.start_ticks != 0 => t == self.start_ticks,
            Some(_) => !self.boot_id.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_are_counted_past_the_command_name() {
        let line = "4242 (we ird) (name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(parse_start_ticks(line), Some(987654));
        assert_eq!(parse_start_ticks("garbage"), None);
    }

    #[test]
    fn a_pid_is_trusted_only_with_its_boot_and_start_time() {
        let me = Identity::of(std::process::id() as i32);
        let boot = boot_id();
        assert!(me.start_ticks > 0);
        assert!(me.is_alive(&boot), "this very process");
        let reused = Identity {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(!reused.is_alive(&boot), "same pid, another process");
        let other_boot = Identity {
            boot_id: "another-boot".into(),
            ..me.clone()
        };
        assert!(!other_boot.is_alive(&boot), "a pid from another boot");
        let legacy = Identity {
            start_ticks: 0,
            boot_id: String::new(),
            ..me.clone()
        };
        assert!(!legacy.is_alive(&boot), "nothing to compare: not trusted");
        assert!(!Identity::of(-1).is_alive(&boot));
    }
}
