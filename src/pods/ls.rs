//! `kinglet pods ls`: the pod records the status manager writes, shown
//! as `kubectl get pods` does, under a line saying since when the node has
//! been offline, if it is (the `offline-since` file the lease task keeps).
//! Works with or without a running agent.

use std::path::Path;

use super::status_manager::PodRecord;

/// `kubectl get pods`-style listing of the pod records under `dir`.
pub fn table(dir: &Path) -> String {
    let mut recs: Vec<PodRecord> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.path().extension().is_some_and(|x| x == "json")
                && !e.file_name().to_string_lossy().starts_with("api-")
        })
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect();
    recs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut rows = vec![[
        "NAMESPACE".to_string(),
        "NAME".into(),
        "READY".into(),
        "STATUS".into(),
        "RESTARTS".into(),
        "AGE".into(),
    ]];
    for r in recs {
        let cs = r.status.container_statuses.clone().unwrap_or_default();
        let ready = cs.iter().filter(|c| c.ready).count();
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
        } else {
            reason
        };
        let age = r
            .status
            .start_time
            .as_ref()
            .map(|t| {
                let s = jiff::Timestamp::now().duration_since(t.0).as_secs().max(0);
                if s < 120 {
                    format!("{s}s")
                } else if s < 7200 {
                    format!("{}m", s / 60)
                } else {
                    format!("{}h", s / 3600)
                }
            })
            .unwrap_or_default();
        rows.push([
            r.namespace,
            r.name,
            format!("{ready}/{}", cs.len()),
            status,
            restarts.to_string(),
            age,
        ]);
    }
    let link = crate::health::ApiLink::new(dir.join("offline-since"));
    let offline = link.offline_since().map_or(String::new(), |since| {
        format!(
            "offline since {}: the API server is unreachable; pods run from the local store\n",
            crate::health::ApiLink::format(since)
        )
    });
    offline + &crate::table::render(&rows)
}
