//! `kinglet pods ls`: the pod records the status manager writes, shown
//! as `kubectl get pods` does, under a line saying since when the node has
//! been offline, if it is (the `offline-since` file the lease task keeps).
//! Works with or without a running agent. A pod that was running when
//! the machine went down shows `Unknown` (as kubectl shows a pod of an
//! unreachable node) until the agent has seen it in this boot: its record
//! is older than the boot, and says nothing of what runs now (found in the
//! VM lab, where `Running` was shown for seconds before the container was
//! started again).

use std::path::Path;
use std::time::SystemTime;

use super::status::manager::PodRecord;

/// `kubectl get pods`-style listing of the pod records under `dir`.
pub fn table(dir: &Path) -> String {
    table_since(dir, booted_at())
}

/// When this machine booted (`btime` in /proc/stat).
fn booted_at() -> Option<SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let secs = stat.lines().find_map(|l| l.strip_prefix("btime "))?;
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs.trim().parse().ok()?))
}

/// [`table`], with records written before `boot` shown as of an earlier boot.
fn table_since(dir: &Path, boot: Option<SystemTime>) -> String {
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "NAME".into(),
        "READY".into(),
        "STATUS".into(),
        "RESTARTS".into(),
        "AGE".into(),
    ]];
    rows.extend(records(dir, boot).into_iter().map(|(r, old)| row(r, old)));
    let link = crate::health::ApiLink::new(dir.join("offline-since"));
    let offline = link.offline_since().map_or(String::new(), |since| {
        format!(
            "offline since {}: the API server is unreachable; pods run from the local store\n",
            crate::health::ApiLink::format(since)
        )
    });
    offline + &crate::table::render(&rows)
}

/// The pod records under `dir` by namespace and name, each with whether it
/// was written before `boot`.
fn records(dir: &Path, boot: Option<SystemTime>) -> Vec<(PodRecord, bool)> {
    let mut recs: Vec<(PodRecord, bool)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.path().extension().is_some_and(|x| x == "json")
                && !e.file_name().to_string_lossy().starts_with("api-")
        })
        .filter_map(|e| {
            let rec = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            let written = e.metadata().ok()?.modified().ok()?;
            Some((rec, boot.is_some_and(|b| written < b)))
        })
        .collect();
    recs.sort_by(|(a, _), (b, _)| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    recs
}

/// One pod's row; `before_boot`: its record is of an earlier boot.
fn row(r: PodRecord, before_boot: bool) -> [String; 6] {
    let cs = r.status.container_statuses.clone().unwrap_or_default();
    let terminal = matches!(r.status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let unknown = before_boot && !terminal;
    let ready = if unknown {
        0
    } else {
        cs.iter().filter(|c| c.ready).count()
    };
    let restarts: i32 = cs.iter().map(|c| c.restart_count).sum();
    // kubectl shows a waiting or terminated reason instead of the phase.
    let reason = cs
        .iter()
        .find_map(|c| {
            let st = c.state.as_ref()?;
            st.waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .or_else(|| {
                    st.terminated
                        .as_ref()
                        .and_then(|t| t.reason.clone())
                        .filter(|_| r.status.phase.as_deref() != Some("Succeeded"))
                })
        })
        .unwrap_or_else(|| r.status.phase.clone().unwrap_or_default());
    let status = if r.status.phase.as_deref() == Some("Succeeded") {
        "Completed".to_string()
    } else if unknown {
        "Unknown".to_string()
    } else {
        reason
    };
    let age = r
        .status
        .start_time
        .as_ref()
        .map(|t| age(t.0))
        .unwrap_or_default();
    [
        r.namespace,
        r.name,
        format!("{ready}/{}", cs.len()),
        status,
        restarts.to_string(),
        age,
    ]
}

/// `kubectl get pods`' AGE column.
fn age(since: jiff::Timestamp) -> String {
    let s = jiff::Timestamp::now()
        .duration_since(since)
        .as_secs()
        .max(0);
    if s < 120 {
        format!("{s}s")
    } else if s < 7200 {
        format!("{}m", s / 60)
    } else {
        format!("{}h", s / 3600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &Path, name: &str, phase: &str, written: SystemTime) {
        let rec = serde_json::json!({
            "namespace": "default",
            "name": name,
            "uid": format!("uid-{name}"),
            "source": "api",
            "status": {"phase": phase, "containerStatuses": [{
                "name": "c", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}
            }]}
        });
        let path = dir.join(format!("uid-{name}.json"));
        std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(written).unwrap();
    }

    fn row<'a>(table: &'a str, name: &str) -> Vec<&'a str> {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name));
        line.unwrap_or_else(|| panic!("{name} not in {table}"))
            .split_whitespace()
            .collect()
    }

    #[test]
    fn records_from_before_the_boot_show_unknown_unless_finished() {
        let dir = tempfile::tempdir().unwrap();
        let boot = SystemTime::now() - std::time::Duration::from_secs(60);
        let before = boot - std::time::Duration::from_secs(600);
        record(dir.path(), "stale", "Running", before);
        record(dir.path(), "done", "Succeeded", before);
        record(dir.path(), "fresh", "Running", SystemTime::now());
        let t = table_since(dir.path(), Some(boot));
        assert_eq!(row(&t, "stale")[2..4], ["0/1", "Unknown"], "{t}");
        assert_eq!(row(&t, "done")[3], "Completed", "{t}");
        assert_eq!(row(&t, "fresh")[2..4], ["1/1", "Running"], "{t}");
        // Without a boot time (no /proc), records are shown as they are.
        let t = table_since(dir.path(), None);
        assert_eq!(row(&t, "stale")[2..4], ["1/1", "Running"], "{t}");
    }
}
