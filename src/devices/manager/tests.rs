use super::*;
use crate::devices::allocate::DeviceSpec;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const R: &str = "example.com/resource";

/// A source answering with a device spec per ID; `fail` makes it refuse.
struct Fake {
    fail: bool,
}

impl Source for Fake {
    fn allocate<'a>(&'a self, ids: &'a [String]) -> BoxFuture<'a, Result<RunOptions, String>> {
        Box::pin(async move {
            if self.fail {
                return Err("plugin said no".into());
            }
            let devices = ids
                .iter()
                .map(|id| DeviceSpec {
                    container_path: format!("/dev/{id}"),
                    host_path: format!("/dev/{id}"),
                    permissions: "rw".into(),
                })
                .collect();
            let envs = [("DEVICES".to_string(), ids.join(","))].into();
            Ok(RunOptions {
                devices,
                envs,
                ..Default::default()
            })
        })
    }

    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        _: &'a [String],
        _: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        // Prefers the last ones.
        Box::pin(async move { Ok(available.iter().rev().cloned().collect()) })
    }
}

fn pod(uid: &str, n: &str) -> Pod {
    let limits = [(R.to_string(), Quantity(n.into()))].into();
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn devices(ids: &[&str], healthy: bool) -> BTreeMap<String, bool> {
    ids.iter().map(|id| (id.to_string(), healthy)).collect()
}

async fn manager(dir: &std::path::Path, fail: bool) -> DeviceManager {
    let m = DeviceManager::load(dir.join("checkpoint.json")).await;
    let g = m.serve(R, Arc::new(Fake { fail }));
    m.update(R, g, devices(&["d1", "d2", "d3"], true));
    m
}

#[tokio::test]
async fn devices_are_given_with_the_sources_answer_and_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), false).await;
    assert_eq!(m.capacity()[R], (3, 3));
    m.allocate(&pod("p1", "2"), None).await.unwrap();
    // The source preferred the last ones.
    let opts = m.run_options("p1", "c");
    assert_eq!(opts.envs["DEVICES"], "d3,d2");
    assert_eq!(opts.devices.len(), 2);
    let err = m.allocate(&pod("p2", "2"), None).await.unwrap_err();
    assert_eq!(
        err.admission_message(),
        "Allocate failed due to requested number of devices unavailable for example.com/resource. Requested: 2, Available: 1, which is unexpected"
    );
    // A restart: the pod keeps its devices; the resource has none until
    // its source is back (0 of 0, as upstream).
    drop(m);
    let m = DeviceManager::load(dir.path().join("checkpoint.json")).await;
    assert_eq!(m.capacity()[R], (0, 0));
    assert_eq!(m.run_options("p1", "c").envs["DEVICES"], "d3,d2");
    let g = m.serve(R, Arc::new(Fake { fail: false }));
    m.update(R, g, devices(&["d1", "d2", "d3"], true));
    m.allocate(&pod("p1", "2"), None).await.unwrap();
    assert_eq!(m.run_options("p1", "c").envs["DEVICES"], "d3,d2");
    let err = m.allocate(&pod("p2", "2"), None).await.unwrap_err();
    assert!(matches!(err, AllocateError::Unavailable(_)), "{err}");
    // p1 ends: its devices go to the next pod.
    let active: BTreeSet<String> = ["p2".to_string()].into();
    m.allocate(&pod("p2", "2"), Some(&active)).await.unwrap();
    assert!(m.run_options("p1", "c").devices.is_empty());
    assert_eq!(m.grants().len(), 1);
}

#[tokio::test]
async fn a_stopped_source_leaves_its_devices_unhealthy_and_a_refusal_is_unexpected() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), true).await;
    let err = m.allocate(&pod("p1", "1"), None).await.unwrap_err();
    assert_eq!(
        err.admission_message(),
        "Allocate failed due to allocating example.com/resource: plugin said no, which is unexpected"
    );
    assert!(m.grants().is_empty());
    m.stopped(R, 0);
    assert_eq!(
        m.capacity()[R],
        (3, 3),
        "an older registration's end is not this one's"
    );
    let g = m.serve(R, Arc::new(Fake { fail: true }));
    m.stopped(R, g);
    assert_eq!(m.capacity()[R], (3, 0));
    let err = m.allocate(&pod("p1", "1"), None).await.unwrap_err();
    assert!(
        err.to_string().contains("no healthy devices present"),
        "{err}"
    );
    // A pod asking for nothing the manager knows is not its business.
    let mut other = pod("p3", "1");
    let c = &mut other.spec.as_mut().unwrap().containers[0];
    c.resources = None;
    m.allocate(&other, None).await.unwrap();
}

#[tokio::test]
async fn health_changes_are_announced() {
    let dir = tempfile::tempdir().unwrap();
    let m = manager(dir.path(), false).await;
    let mut rx = m.subscribe();
    rx.borrow_and_update();
    let g = m.serve(R, Arc::new(Fake { fail: false }));
    rx.borrow_and_update();
    m.update(R, g, devices(&["d1", "d2", "d3"], true));
    assert!(!rx.has_changed().unwrap(), "nothing changed");
    m.update(R, g - 1, devices(&["d9"], true));
    assert!(!rx.has_changed().unwrap(), "an older registration's word");
    m.update(R, g, devices(&["d1"], false));
    assert!(rx.has_changed().unwrap());
    assert_eq!(m.capacity()[R], (1, 0));
}
