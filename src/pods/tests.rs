//! The pod lifecycle end to end inside the process: the pod manager, its
//! workers, the PLEG and the status manager driven against the fake
//! runtime in paused time. Each bug the lifecycle once had is a test here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kinglet_runtime::fake::FakeRuntime;
use kinglet_runtime::{BoxFuture, ContainerState, Runtime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::worker::KillRequest;
use super::{PodKiller, PodManager, SourceUpdate, StatusManager, StatusView, admit};
use crate::pods::util::Clock;
use crate::pods::util::ObjectSource;
use crate::pods::util::{ObjectError, ObjectKind};
use crate::pods::worker::NodeContext;

struct Node {
    rt: Arc<FakeRuntime>,
    tx: mpsc::Sender<SourceUpdate>,
    killer: PodKiller,
    view: StatusView,
    stop: CancellationToken,
    dir: tempfile::TempDir,
}

fn node_with(rt: Arc<FakeRuntime>, objects: Option<Arc<dyn ObjectSource>>) -> Node {
    rt.follow_tokio_clock();
    let dir = tempfile::tempdir().unwrap();
    let ctx = NodeContext {
        facts: crate::pods::util::NodeFacts {
            node_name: "n".into(),
            node_ip: "192.0.2.1".into(),
            log_root: dir.path().join("logs").display().to_string(),
            volume_root: dir.path().join("volumes").display().to_string(),
            container_id_scheme: "fake://".into(),
            ..Default::default()
        },
        clock: Clock::following_tokio(),
        objects,
        ..Default::default()
    };
    let status = StatusManager::new(dir.path().join("pods"), None);
    let view = status.view();
    let alloc = admit::Allocatable {
        cpu_milli: 4000,
        memory: 8 << 30,
        pods: 110,
        labels: Default::default(),
        taints: Default::default(),
        sysctls: Default::default(),
        pressure: None,
    };
    let (m, killer, tx, inputs) = PodManager::new(rt.clone(), ctx, vec!["api"], status, alloc);
    let stop = CancellationToken::new();
    tokio::spawn(m.run(inputs, stop.clone()));
    Node {
        rt,
        tx,
        killer,
        view,
        stop,
        dir,
    }
}

fn node() -> Node {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image("busybox:1");
    node_with(rt, None)
}

fn pod(uid: &str, yaml_spec: &str) -> Pod {
    let text = format!(
        "metadata: {{name: p-{uid}, namespace: default, uid: {uid}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{yaml_spec}"
    );
    serde_saphyr::from_str(&text).unwrap()
}

const ONE: &str = "  containers: [{name: a, image: 'busybox:1'}]\n";

fn deleting(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
    p
}

impl Node {
    async fn send(&self, pods: Vec<Pod>) {
        self.tx.send(SourceUpdate::pods("api", pods)).await.unwrap();
    }

    /// Sends `p` alone and lets time run until it is Running (3 s at most).
    async fn run(&self, p: Pod) {
        let uid = p.metadata.uid.clone().unwrap_or_default();
        self.send(vec![p]).await;
        self.until(Duration::from_secs(3), |n| {
            n.phase(&uid).as_deref() == Some("Running")
        })
        .await;
    }

    fn calls(&self, prefix: &str) -> usize {
        self.rt
            .calls()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    fn status(&self, uid: &str) -> Option<PodStatus> {
        self.view.get(uid).map(|e| (*e.status).clone())
    }

    /// Lets paused time run in steps until `f` holds (at most `limit`).
    async fn until(&self, limit: Duration, f: impl Fn(&Node) -> bool) {
        let step = Duration::from_millis(100);
        let mut waited = Duration::ZERO;
        while !f(self) {
            assert!(
                waited < limit,
                "not reached within {limit:?}; calls: {:?}; statuses: {:?}",
                self.rt.calls(),
                self.view.pods()
            );
            tokio::time::sleep(step).await;
            waited += step;
        }
    }

    fn phase(&self, uid: &str) -> Option<String> {
        self.status(uid).and_then(|s| s.phase)
    }

    fn waiting_reason(&self, uid: &str) -> Option<String> {
        let s = self.status(uid)?;
        let c = s.container_statuses?.into_iter().next()?;
        c.state?.waiting?.reason
    }
}

#[tokio::test(start_paused = true)]
async fn a_pod_runs_and_a_deleted_pod_is_removed_exactly_once() {
    let n = node();
    let p = pod("u1", ONE);
    n.send(vec![p.clone()]).await;
    n.until(Duration::from_secs(5), |n| {
        n.phase("u1").as_deref() == Some("Running")
    })
    .await;
    let log_dir = n.dir.path().join("logs/default_p-u1_u1");
    std::fs::create_dir_all(&log_dir).unwrap();
    // The API keeps the pod, with a deletion timestamp, until the node's
    // DELETE lands; it is sent again and again meanwhile.
    let d = deleting(p);
    n.send(vec![d.clone()]).await;
    n.until(Duration::from_secs(10), |n| {
        n.calls("remove_pod_sandbox") == 1
    })
    .await;
    n.until(Duration::from_secs(5), |n| n.view.get("u1").is_none())
        .await;
    let lists = n.calls("list_pod_sandboxes");
    for _ in 0..20 {
        n.send(vec![d.clone()]).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The regression: each resend spawned a worker that terminated again.
    assert_eq!(n.calls("list_pod_sandboxes"), lists, "{:?}", n.rt.calls());
    assert_eq!(n.calls("run_pod_sandbox"), 1);
    assert_eq!(n.calls("create a"), 1);
    assert!(n.rt.containers().is_empty());
    assert!(
        log_dir.exists(),
        "logs stay readable for a while, as upstream's"
    );
    tokio::time::sleep(super::manager::LOG_DIR_GRACE).await;
    n.until(Duration::from_secs(2), |_| !log_dir.exists()).await;
    // Gone from the API at last, then (a new pod) with the same name.
    n.send(vec![]).await;
    n.send(vec![pod("u2", ONE)]).await;
    n.until(Duration::from_secs(5), |n| {
        n.phase("u2").as_deref() == Some("Running")
    })
    .await;
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn crash_loop_backs_off_10s_then_doubles() {
    let n = node();
    n.rt.exit_on_start("a", 1);
    n.send(vec![pod("u1", ONE)]).await;
    // First start, then an immediate restart, then 10 s, then 20 s.
    n.until(Duration::from_secs(2), |n| n.calls("create a") == 2)
        .await;
    n.until(Duration::from_secs(2), |n| {
        n.waiting_reason("u1").as_deref() == Some("CrashLoopBackOff")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(n.calls("create a"), 2, "no restart before 10 s");
    n.until(Duration::from_secs(2), |n| n.calls("create a") == 3)
        .await;
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert_eq!(n.calls("create a"), 3, "no restart before 20 s");
    n.until(Duration::from_secs(2), |n| n.calls("create a") == 4)
        .await;
    // Only the newest and the previous attempt are kept.
    assert!(n.rt.containers().len() <= 2);
    let s = n.status("u1").unwrap();
    assert_eq!(s.container_statuses.unwrap()[0].restart_count, 3);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn restart_policies_never_and_on_failure() {
    let n = node();
    n.rt.exit_on_start("a", 1);
    n.rt.exit_on_start("b", 0);
    let never = "  restartPolicy: Never\n  containers: [{name: a, image: 'busybox:1'}]\n";
    let on_failure = "  restartPolicy: OnFailure\n  containers: [{name: b, image: 'busybox:1'}]\n";
    n.send(vec![pod("u1", never), pod("u2", on_failure)]).await;
    n.until(Duration::from_secs(3), |n| {
        n.phase("u1").as_deref() == Some("Failed") && n.phase("u2").as_deref() == Some("Succeeded")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!((n.calls("create a"), n.calls("create b")), (1, 1));
    // Done for good: dead containers collected (disk-pressure reclaim)
    // start nothing again, and the statuses stay.
    for c in n.rt.containers() {
        kinglet_runtime::Runtime::remove_container(&*n.rt, &c.id)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!((n.calls("create a"), n.calls("create b")), (1, 1));
    assert_eq!(n.phase("u1").as_deref(), Some("Failed"));
    assert_eq!(n.phase("u2").as_deref(), Some("Succeeded"));
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn init_containers_then_sidecars_then_containers_in_order() {
    let n = node();
    n.rt.exit_on_start("i1", 0);
    let spec = "  initContainers:\n  - {name: i1, image: 'busybox:1'}\n  - {name: side, image: 'busybox:1', restartPolicy: Always}\n  containers: [{name: a, image: 'busybox:1'}]\n";
    n.run(pod("u1", spec)).await;
    let order: Vec<String> =
        n.rt.calls()
            .into_iter()
            .filter(|c| c.starts_with("start "))
            .collect();
    assert_eq!(order, ["start i1", "start side", "start a"]);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn an_ephemeral_container_gets_its_targets_id() {
    let n = node();
    n.run(pod("u1", ONE)).await;
    let a = n.rt.containers()[0].id.clone();
    let debug = "  ephemeralContainers:\n  - {name: dbg, image: 'busybox:1', targetContainerName: a}\n  - {name: lost, image: 'busybox:1', targetContainerName: gone}\n";
    n.send(vec![pod("u1", &format!("{ONE}{debug}"))]).await;
    let want = format!("create dbg 0 target={a}");
    n.until(Duration::from_secs(3), |n| n.calls(&want) == 1)
        .await;
    // A target the pod does not have: upstream's error, nothing created.
    n.until(Duration::from_secs(3), |n| {
        let s = n.status("u1").and_then(|s| s.ephemeral_container_statuses);
        let lost = s.iter().flatten().find(|c| c.name == "lost").cloned();
        let w = lost.and_then(|c| c.state?.waiting);
        w.is_some_and(|w| {
            w.reason.as_deref() == Some("CreateContainerConfigError")
                && w.message.as_deref() == Some("unable to find target container gone")
        })
    })
    .await;
    assert_eq!(n.calls("create lost"), 0);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_what_runs() {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image("busybox:1");
    let first = node_with(rt.clone(), None);
    first.run(pod("u1", ONE)).await;
    first.stop.cancel();
    let before = rt.calls().len();
    let second = node_with(rt.clone(), None);
    second.run(pod("u1", ONE)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Vec<String> = rt.calls()[before..].to_vec();
    assert!(
        after
            .iter()
            .all(|c| !c.starts_with("create") && !c.starts_with("run_pod_sandbox")),
        "{after:?}"
    );
    second.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_whose_removal_failed_is_collected_within_a_gc_period() {
    let n = node();
    n.run(pod("u1", ONE)).await;
    n.rt.fail_sandbox_removals(1);
    n.send(vec![]).await;
    n.until(Duration::from_secs(5), |n| {
        n.calls("remove_pod_sandbox") == 1
    })
    .await;
    assert_eq!(n.rt.sandboxes().len(), 1, "the failed removal left it");
    n.until(Duration::from_secs(70), |n| n.rt.sandboxes().is_empty())
        .await;
    assert_eq!(n.calls("remove_pod_sandbox"), 2);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_kill_request_fails_the_pod_and_keeps_it_until_removed() {
    let n = node();
    n.run(pod("u1", ONE)).await;
    let k = KillRequest {
        reason: "Evicted".into(),
        message: "The node was low on resource: memory.".into(),
        grace: Some(Duration::ZERO),
    };
    n.killer.kill("u1", k).await;
    n.until(Duration::from_secs(3), |n| {
        n.phase("u1").as_deref() == Some("Failed")
    })
    .await;
    let s = n.status("u1").unwrap();
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(n.calls("create a"), 1, "a killed pod never restarts");
    assert_eq!(n.calls("remove_pod_sandbox"), 0, "kept until it is removed");
    n.send(vec![]).await;
    n.until(Duration::from_secs(3), |n| {
        n.calls("remove_pod_sandbox") == 1
    })
    .await;
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn active_deadline_fails_the_pod() {
    let n = node();
    let spec = "  activeDeadlineSeconds: 5\n  containers: [{name: a, image: 'busybox:1'}]\n";
    n.run(pod("u1", spec)).await;
    n.until(Duration::from_secs(8), |n| {
        n.phase("u1").as_deref() == Some("Failed")
    })
    .await;
    assert_eq!(
        n.status("u1").unwrap().reason.as_deref(),
        Some("DeadlineExceeded")
    );
    n.stop.cancel();
}

/// Counts reads; finds nothing.
#[derive(Debug, Default)]
struct CountingObjects(AtomicUsize);

impl ObjectSource for CountingObjects {
    fn get<'a>(
        &'a self,
        _kind: ObjectKind,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, ObjectError>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(None) })
    }
}

#[tokio::test(start_paused = true)]
async fn creation_failures_retry_every_ten_seconds_not_every_second() {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image("busybox:1");
    let objects = Arc::new(CountingObjects::default());
    let n = node_with(rt, Some(objects.clone()));
    let spec = "  containers:\n  - name: a\n    image: 'busybox:1'\n    env: [{name: X, valueFrom: {configMapKeyRef: {name: missing, key: k}}}]\n";
    n.send(vec![pod("u1", spec)]).await;
    n.until(Duration::from_secs(3), |n| {
        n.waiting_reason("u1").as_deref() == Some("CreateContainerConfigError")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    // Upstream's pod worker back-off, flat: the first read and a retry
    // every 10 s (6 in 60 s), where one a second would be 60.
    let reads = objects.0.load(Ordering::Relaxed);
    assert!((5..=7).contains(&reads), "{reads} reads in 60 s");
    assert_eq!(n.calls("create a"), 0);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn conditions_keep_their_transition_time_while_unchanged() {
    let n = node();
    n.rt.exit_on_start("a", 1);
    n.send(vec![pod("u1", ONE)]).await;
    n.until(Duration::from_secs(3), |n| {
        n.waiting_reason("u1").as_deref() == Some("CrashLoopBackOff")
    })
    .await;
    let t = |n: &Node, ty: &str| {
        n.status("u1")
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == ty))
            .and_then(|c| c.last_transition_time)
    };
    let scheduled = t(&n, "PodScheduled");
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(t(&n, "PodScheduled"), scheduled);
    assert!(n.calls("create a") >= 3);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn runtime_down_at_start_makes_no_second_sandbox() {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image("busybox:1");
    let n = node_with(rt.clone(), None);
    rt.set_up(false);
    n.send(vec![pod("u1", ONE)]).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(n.calls("run_pod_sandbox"), 0);
    rt.set_up(true);
    n.until(Duration::from_secs(10), |n| {
        n.phase("u1").as_deref() == Some("Running")
    })
    .await;
    assert_eq!(n.calls("run_pod_sandbox"), 1);
    let _ = rt.version().await;
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn sidecars_stop_after_the_main_containers_in_reverse_order() {
    let n = node();
    let spec = "  initContainers:\n  - {name: s1, image: 'busybox:1', restartPolicy: Always}\n  - {name: s2, image: 'busybox:1', restartPolicy: Always}\n  containers: [{name: a, image: 'busybox:1'}]\n";
    let p = pod("u1", spec);
    n.send(vec![p.clone()]).await;
    n.until(Duration::from_secs(5), |n| {
        n.phase("u1").as_deref() == Some("Running") && n.rt.containers().len() == 3
    })
    .await;
    let id_of = |name: &str| {
        let c = n.rt.containers().into_iter().find(|c| c.name == name);
        c.unwrap().id
    };
    let ids = [id_of("a"), id_of("s2"), id_of("s1")];
    n.send(vec![deleting(p)]).await;
    n.until(Duration::from_secs(10), |n| {
        n.calls("remove_pod_sandbox") == 1
    })
    .await;
    // A main container's preStop may need a sidecar: main first, then the
    // sidecars, last started first stopped.
    let stops: Vec<String> =
        n.rt.calls()
            .into_iter()
            .filter_map(|c| c.strip_prefix("stop ").map(str::to_string))
            .collect();
    assert_eq!(stops, ids, "{:?}", n.rt.calls());
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_container_of_unknown_state_is_killed_and_replaced_once() {
    let n = node();
    n.run(pod("u1", ONE)).await;
    let first = n.rt.containers()[0].id.clone();
    n.rt.set_state("a", ContainerState::Unknown);
    n.until(Duration::from_secs(5), |n| {
        let cs = n.rt.containers();
        cs.len() == 1 && cs[0].state == ContainerState::Running && cs[0].id != first
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cs = n.rt.containers();
    assert_eq!((cs.len(), cs[0].attempt), (1, 1), "{cs:?}");
    assert_eq!(n.calls(&format!("stop {first}")), 1);
    assert_eq!(n.calls(&format!("remove {first}")), 1);
    assert_eq!(n.calls("create a"), 2);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_created_container_that_will_not_start_is_replaced_after_a_back_off() {
    let n = node();
    n.rt.refuse_starts(2);
    n.send(vec![pod("u1", ONE)]).await;
    n.until(Duration::from_secs(3), |n| {
        n.waiting_reason("u1").as_deref() == Some("RunContainerError")
    })
    .await;
    // The first refusal backs off 10 s: no second start meanwhile.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(n.calls("refused start"), 1, "{:?}", n.rt.calls());
    n.until(Duration::from_secs(10), |n| {
        n.phase("u1").as_deref() == Some("Running")
    })
    .await;
    // The second refusal removed the created container; a new one ran.
    assert_eq!(n.calls("refused start"), 2);
    assert_eq!(n.calls("create a"), 2);
    let cs = n.rt.containers();
    assert_eq!(cs.len(), 1, "{cs:?}");
    assert_eq!(cs[0].state, ContainerState::Running);
    n.stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pod_asking_its_own_user_namespace_is_not_run_in_the_hosts() {
    let n = node();
    let spec = format!("  hostUsers: false\n{ONE}");
    n.send(vec![pod("u1", &spec)]).await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    // No sandbox, no container: upstream refuses it in the sandbox config.
    assert_eq!(n.calls("run_pod_sandbox"), 0, "{:?}", n.rt.calls());
    assert_eq!(n.calls("create"), 0);
    assert_ne!(n.phase("u1").as_deref(), Some("Running"));
    // hostUsers: true (or unset) runs as before.
    n.run(pod("u2", &format!("  hostUsers: true\n{ONE}"))).await;
    n.stop.cancel();
}
