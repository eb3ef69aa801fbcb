//! The manager's decisions against the fake runtime: which pod a met
//! threshold evicts, with what message and grace, what reaches the pod
//! killer, and what node-level reclaim removes before any pod is evicted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kinglet_runtime::fake::FakeRuntime;
use kinglet_runtime::{ContainerState, ContainerStatus};

use super::thresholds::{Observation, Observations, Threshold};
use super::{Manager, Settings, signals, storage};
use crate::config::ThresholdValue;
use crate::pods::{PodKiller, StatusManager};

const MI: u64 = 1 << 20;

/// A pod `name` (UID `u-<name>`) with one container `c` requesting
/// `request` of memory (none when empty).
fn pod(name: &str, request: &str) -> Pod {
    let resources = if request.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({"requests": {"memory": request}})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}")},
        "spec": {"containers": [{"name": "c", "image": "busybox:1", "resources": resources}]},
    }))
    .unwrap()
}

/// The status a worker would have written: `phase`, and container `c`
/// with runtime ID `ctr-<name>`.
fn status(name: &str, phase: &str) -> PodStatus {
    serde_json::from_value(serde_json::json!({
        "phase": phase,
        "containerStatuses": [{
            "name": "c", "image": "busybox:1", "imageID": "", "ready": phase == "Running",
            "restartCount": 0, "containerID": format!("fake://ctr-{name}"),
        }],
    }))
    .unwrap()
}

/// Container `ctr-<name>` of pod `u-<name>`, in `state`.
fn container(name: &str, state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        id: format!("ctr-{name}"),
        sandbox_id: format!("sb-{name}"),
        pod_uid: format!("u-{name}"),
        name: "c".into(),
        attempt: 0,
        image: "busybox:1".into(),
        image_ref: String::new(),
        image_id: String::new(),
        state,
        created_at: 1,
        started_at: 1,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        log_path: String::new(),
        pid: 0,
    }
}

struct Lab {
    manager: Manager,
    rt: Arc<FakeRuntime>,
    kills: tokio::sync::mpsc::Receiver<(String, crate::pods::KillRequest)>,
    dir: tempfile::TempDir,
}

/// A manager with `thresholds` over `pods` (pod, phase), each with its
/// container in the fake runtime.
fn lab(thresholds: Vec<Threshold>, pods: &[(Pod, &str)]) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let mut statuses = StatusManager::new(dir.path().join("pods"), None);
    for (p, phase) in pods {
        let name = p.metadata.name.clone().unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        statuses.set(&uid, p, status(&name, phase));
        let state = match *phase {
            "Running" => ContainerState::Running,
            _ => ContainerState::Exited,
        };
        rt.insert_container(container(&name, state));
    }
    let (killer, kills) = PodKiller::for_test();
    let memcg = signals::MemCgroup {
        dir: dir.path().join("cgroup"),
        hierarchy: kinglet_runtime::podcgroup::Hierarchy::V2,
    };
    let settings = Settings {
        thresholds,
        transition: Duration::ZERO,
        max_pod_grace: Duration::from_secs(30),
        sources: signals::Sources {
            host: Default::default(),
            root: memcg,
            pods: None,
            pods_capacity: 0,
            nodefs: dir.path().into(),
            imagefs: dir.path().into(),
        },
        housekeeping: Duration::from_secs(10),
        storage: storage::Roots {
            volumes: dir.path().join("volumes"),
            logs: dir.path().join("logs"),
        },
        pids_root: dir.path().join("pids"),
        pods_cgroup: "kubepods".into(),
        image_gc: None,
    };
    let manager = Manager {
        settings,
        view: statuses.view(),
        runtime: rt.clone(),
        killer,
        metrics: Arc::new(crate::metrics::Metrics::new("n")),
        pressure: Default::default(),
    };
    Lab {
        manager,
        rt,
        kills,
        dir,
    }
}

/// `memory.available` as measured: `available` of `capacity` bytes.
fn memory_observed(available: u64, capacity: u64) -> Observations {
    [(
        "memory.available",
        Observation {
            available,
            capacity,
        },
    )]
    .into()
}

fn memory_available(value: ThresholdValue, grace: Duration) -> Threshold {
    Threshold {
        signal: "memory.available".into(),
        value,
        grace,
        minimum_reclaim: None,
    }
}

#[tokio::test]
async fn memory_pressure_evicts_the_pod_furthest_over_its_request_at_once() {
    let hard = memory_available(ThresholdValue::Quantity(100 * MI), Duration::ZERO);
    let pods = [
        (pod("hog", ""), "Running"),
        (pod("within", "512Mi"), "Running"),
        (pod("small", ""), "Running"),
    ];
    let mut l = lab(vec![hard], &pods);
    l.rt.set_usage("ctr-hog", 300 * MI);
    l.rt.set_usage("ctr-within", 400 * MI);
    l.rt.set_usage("ctr-small", 10 * MI);
    let obs = memory_observed(50 * MI, 1024 * MI);
    let v = l.manager.threshold_victim(&[0], &obs).await.unwrap();
    // Both BestEffort pods are over their (zero) requests; the larger
    // user goes first. The pod within its request is spared.
    assert_eq!(v.uid, "u-hog");
    assert_eq!(
        v.grace,
        Duration::ZERO,
        "a hard memory eviction waits for nothing"
    );
    assert_eq!(
        v.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 300Mi, request is 0, has larger consumption of memory. "
    );
    l.manager
        .evict(v, ("test", tokio::time::Instant::now()))
        .await;
    let (uid, k) = l.kills.recv().await.unwrap();
    assert_eq!((uid.as_str(), k.reason.as_str()), ("u-hog", "Evicted"));
    assert_eq!(k.grace, Some(Duration::ZERO));
}

#[tokio::test]
async fn a_soft_threshold_gives_the_pod_its_grace_up_to_the_maximum() {
    let soft = memory_available(ThresholdValue::Percent(0.25), Duration::from_secs(30));
    let mut l = lab(vec![soft], &[(pod("hog", ""), "Running")]);
    l.manager.settings.max_pod_grace = Duration::from_secs(5);
    l.rt.set_usage("ctr-hog", 300 * MI);
    let obs = memory_observed(100 * MI, 1024 * MI);
    let v = l.manager.threshold_victim(&[0], &obs).await.unwrap();
    // The pod's own 30 s, capped by evictionMaxPodGracePeriod; the
    // percentage shown as the quantity it resolves to.
    assert_eq!(v.grace, Duration::from_secs(5));
    assert!(
        v.message.contains("Threshold quantity: 256Mi"),
        "{}",
        v.message
    );
}

#[tokio::test]
async fn disk_reclaim_removes_only_finished_pods_dead_containers_and_their_logs() {
    let pods = [
        (pod("done", ""), "Succeeded"),
        (pod("crashed", ""), "Running"),
    ];
    let l = lab(vec![], &pods);
    // The running pod's last dead container stays (`logs --previous`).
    l.rt.insert_container(container("crashed", ContainerState::Exited));
    let log_dir = |name: &str| {
        l.dir
            .path()
            .join("logs")
            .join(format!("default_{name}_u-{name}"))
            .join("c")
    };
    for name in ["done", "crashed"] {
        std::fs::create_dir_all(log_dir(name)).unwrap();
        std::fs::write(log_dir(name).join("0.log"), "x").unwrap();
        std::fs::write(log_dir(name).join("0.log.20261206-120000"), "x").unwrap();
    }
    assert!(l.manager.reclaim_dead_containers().await);
    let left: Vec<String> = l.rt.containers().into_iter().map(|c| c.id).collect();
    assert_eq!(left, ["ctr-crashed"]);
    assert!(!log_dir("done").join("0.log").exists());
    assert!(!log_dir("done").join("0.log.20261206-120000").exists());
    assert!(log_dir("crashed").join("0.log").exists());
    // Nothing more to reclaim: said so, so the pods are ranked next.
    assert!(!l.manager.reclaim_dead_containers().await);
}
