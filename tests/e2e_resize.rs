//! End to end: in-place pod resize (the `resize` subresource) on a kinglet
//! node joined to the real API server, on both runtimes: a running
//! container's cgroup changes without a restart (`resizePolicy`
//! `NotRequired`), a container whose memory resize restarts it restarts
//! once; the status shows what runs (`resources`, `allocatedResources`) and
//! no resize condition once done; a resize made while kinglet is down is
//! carried out when it starts again, without restarting the container; a
//! resize that does not fit next to another pod stays `PodResizePending`
//! (`Deferred`) until that pod is gone.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::pods::running;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const BB: &str = "kinglet.test/busybox:1";

crate::both_runtimes!(a_resize_is_actuated_in_place_and_survives_a_restart,);

fn from_yaml<T: serde::de::DeserializeOwned>(y: &str) -> T {
    let v: serde_json::Value = serde_saphyr::from_str(y).unwrap();
    serde_json::from_value(v).unwrap()
}

/// The cgroup dir named `id` (a container's) under `root`, searched a few
/// levels deep.
fn find_dir(root: &Path, id: &str, depth: u32) -> Option<PathBuf> {
    if depth == 0 {
        return None;
    }
    for e in std::fs::read_dir(root).ok()?.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name().to_string_lossy() == id {
            return Some(e.path());
        }
        if let Some(p) = find_dir(&e.path(), id, depth - 1) {
            return Some(p);
        }
    }
    None
}

/// The container's CPU quota and memory limit as its cgroup has them
/// (v1: `cpu.cfs_quota_us`, `memory.limit_in_bytes`; v2: `cpu.max`'s
/// quota, `memory.max`).
fn cgroup_limits(container_id: &str) -> (String, String) {
    let id = container_id.split_once("://").map_or(container_id, |p| p.1);
    let root = Path::new("/sys/fs/cgroup");
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    if root.join("cgroup.controllers").exists() {
        let dir = find_dir(root, id, 8).expect("container cgroup");
        let max = read(dir.join("cpu.max"));
        let quota = max.split_whitespace().next().unwrap_or("").to_string();
        (quota, read(dir.join("memory.max")))
    } else {
        let cpu = find_dir(&root.join("cpu"), id, 8).expect("container cpu cgroup");
        let mem = find_dir(&root.join("memory"), id, 8).expect("container memory cgroup");
        (
            read(cpu.join("cpu.cfs_quota_us")),
            read(mem.join("memory.limit_in_bytes")),
        )
    }
}

/// A container's status by name.
fn find_status(p: &Pod, name: &str) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    let st = p.status.clone()?;
    st.container_statuses?.into_iter().find(|c| c.name == name)
}

fn status_of(p: &Pod, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    find_status(p, name).expect("container status")
}

fn limit(s: &k8s_openapi::api::core::v1::ContainerStatus, r: &str) -> Option<String> {
    let res = s.resources.as_ref()?;
    Some(res.limits.as_ref()?.get(r)?.0.clone())
}

/// Waits for the pod's resize to be done: the status observed the
/// generation, reports no resize condition, every container runs and
/// `c`'s status shows `cpu` as its CPU limit.
async fn resized(pods: &Api<Pod>, name: &str, cpu: &str) -> Pod {
    wait_for(
        &format!("{name} resized to cpu {cpu}"),
        Duration::from_secs(60),
        || async {
            let p = pods.get_opt(name).await.ok().flatten()?;
            let st = p.status.as_ref()?;
            let observed = st.observed_generation == p.metadata.generation;
            let conditions = st.conditions.iter().flatten();
            let none = conditions
                .clone()
                .all(|c| !c.type_.starts_with("PodResize"));
            let c = find_status(&p, "c")?;
            let shown = limit(&c, "cpu").as_deref() == Some(cpu);
            (observed && none && shown && running(&p)).then_some(p)
        },
    )
    .await
}

async fn patch(pods: &Api<Pod>, name: &str, containers: serde_json::Value) {
    let body = serde_json::json!({"spec": {"containers": containers}});
    pods.patch_subresource(
        "resize",
        name,
        &PatchParams::default(),
        &Patch::Strategic(body),
    )
    .await
    .unwrap();
}

async fn a_resize_is_actuated_in_place_and_survives_a_restart(rt: Rt) {
    let admin = admin().await;
    let name = unique_name("kl-resize");
    let mut k = Kinglet::start_rt(
        rt,
        &name,
        FAST_CONFIG,
        true,
        &[],
        &[common::pods::busybox_archive()],
    );
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_ready(&nodes, &name, Duration::from_secs(20)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod = format!("{name}-rs");
    let p: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}}}\nspec:
  nodeName: {name}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BB}
    imagePullPolicy: Never
    command: [sleep, '1001']
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}, limits: {{cpu: 200m, memory: 64Mi}}}}
  - name: r
    image: {BB}
    imagePullPolicy: Never
    command: [sleep, '1002']
    resizePolicy: [{{resourceName: memory, restartPolicy: RestartContainer}}]
    resources: {{requests: {{cpu: 100m, memory: 32Mi}}, limits: {{cpu: 200m, memory: 64Mi}}}}
"
    ));
    pods.create(&PostParams::default(), &p).await.unwrap();
    let first = resized(&pods, &pod, "200m").await;
    let c_id = status_of(&first, "c").container_id.unwrap();
    assert_eq!(
        cgroup_limits(&c_id),
        ("20000".into(), (64u64 << 20).to_string())
    );

    // In place for c; r's memory resize restarts it, once.
    patch(
        &pods,
        &pod,
        serde_json::json!([
            {"name": "c", "resources": {"limits": {"cpu": "300m", "memory": "96Mi"}}},
            {"name": "r", "resources": {"limits": {"memory": "80Mi"}}},
        ]),
    )
    .await;
    resized(&pods, &pod, "300m").await;
    // r's restart may be written a moment after c's resize shows.
    let p = wait_for(
        "r restarted for its memory resize",
        Duration::from_secs(30),
        || async {
            let p = pods.get_opt(&pod).await.ok().flatten()?;
            let r = find_status(&p, "r")?;
            (r.restart_count >= 1 && running(&p)).then_some(p)
        },
    )
    .await;
    let (c, r) = (status_of(&p, "c"), status_of(&p, "r"));
    assert_eq!(
        c.container_id.as_deref(),
        Some(c_id.as_str()),
        "c kept running"
    );
    assert_eq!((c.restart_count, r.restart_count), (0, 1));
    assert_eq!(
        cgroup_limits(&c_id),
        ("30000".into(), (96u64 << 20).to_string())
    );
    let r_id = r.container_id.clone().unwrap();
    assert_eq!(cgroup_limits(&r_id).1, (80u64 << 20).to_string());
    assert_eq!(limit(&r, "memory").as_deref(), Some("80Mi"));
    assert_eq!(c.allocated_resources.unwrap()["cpu"].0, "100m");

    // Resized while kinglet is down: carried out when it is back, in place.
    let _ = k.terminate(Duration::from_secs(10));
    patch(
        &pods,
        &pod,
        serde_json::json!([{"name": "c", "resources": {"limits": {"cpu": "400m"}}}]),
    )
    .await;
    k.spawn();
    let p = resized(&pods, &pod, "400m").await;
    let c = status_of(&p, "c");
    assert_eq!(c.container_id.as_deref(), Some(c_id.as_str()));
    assert_eq!(c.restart_count, 0);
    assert_eq!(cgroup_limits(&c_id).0, "40000");

    // More than is left next to another pod: deferred, with upstream's
    // condition and event, the container left as it runs; allocated once
    // the other pod is gone.
    let cpus: u32 = nodes
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .allocatable
        .unwrap()["cpu"]
        .0
        .parse()
        .unwrap();
    let half = cpus * 500;
    let filler = format!("{name}-filler");
    let f: Pod = from_yaml(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {filler}}}\nspec:\n  nodeName: {name}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {BB}, imagePullPolicy: Never, command: [sleep, '1003'], resources: {{requests: {{cpu: {half}m}}}}}}\n"
    ));
    pods.create(&PostParams::default(), &f).await.unwrap();
    wait_for("the other pod Running", Duration::from_secs(30), || async {
        pods.get_opt(&filler).await.ok().flatten().filter(running)
    })
    .await;
    let (want, want_limit) = (format!("{}m", half + 100), format!("{}m", half + 200));
    patch(
        &pods,
        &pod,
        serde_json::json!([{"name": "c", "resources": {"requests": {"cpu": want}, "limits": {"cpu": want_limit}}}]),
    )
    .await;
    let pending = wait_for("PodResizePending", Duration::from_secs(30), || async {
        let p = pods.get_opt(&pod).await.ok().flatten()?;
        let st = p.status?;
        st.conditions?
            .into_iter()
            .find(|c| c.type_ == "PodResizePending")
    })
    .await;
    assert_eq!(pending.reason.as_deref(), Some("Deferred"));
    assert_eq!(
        pending.message.as_deref(),
        Some(
            format!(
                "Node didn't have enough resource: cpu, requested: {}, used: {half}, capacity: {}",
                half + 200,
                cpus * 1000
            )
            .as_str()
        )
    );
    let events: Api<Event> = Api::namespaced(admin.clone(), "default");
    wait_for(
        "a ResizeDeferred event",
        Duration::from_secs(30),
        || async {
            let evs = events.list(&ListParams::default()).await.ok()?;
            evs.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod.as_str())
                    && e.reason.as_deref() == Some("ResizeDeferred")
            })
        },
    )
    .await;
    assert_eq!(cgroup_limits(&c_id).0, "40000");
    pods.delete(&filler, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let p = resized(&pods, &pod, &want_limit).await;
    assert_eq!(status_of(&p, "c").restart_count, 0);
    assert_eq!(
        cgroup_limits(&c_id).0,
        ((half + 200) * 100).to_string(),
        "the deferred resize is carried out once there is room"
    );
    let _ = pods
        .delete(&pod, &DeleteParams::default().grace_period(0))
        .await;
}
