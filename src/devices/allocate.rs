//! Which devices each container of a pod gets, as upstream's device
//! manager chooses them at admission (`devicesToAllocate`): a container
//! asks for a device resource by its limit; an init container's devices
//! are handed on to the containers after it (they never run at once),
//! a sidecar's and an app container's are its own; a device in use by
//! another pod, or unhealthy, is never given. Pure: the manager holds the
//! state and asks the device sources afterwards.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use crate::pods::util::{is_sidecar, quantity_milli};

/// A resource name → device IDs.
pub type DeviceSets = BTreeMap<String, BTreeSet<String>>;

/// What one container was given of one resource, and what the device's
/// source answered to `Allocate` (kept: a restart or a container restart
/// uses it again without asking).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub ids: Vec<String>,
    pub options: RunOptions,
}

/// A pod's grants: container name → resource name → grant.
pub type PodGrants = BTreeMap<String, BTreeMap<String, Grant>>;

/// What a container needs to use its devices (the device plugin API's
/// `ContainerAllocateResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunOptions {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<MountSpec>,
    pub devices: Vec<DeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`vendor.com/class=name`).
    pub cdi_devices: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

impl RunOptions {
    /// Adds `other` to these (a container with devices of two resources)
    /// as upstream merges them: the first env value, device, mount (by
    /// container path) and annotation wins; CDI names once each.
    pub fn merge(&mut self, other: &RunOptions) {
        for (k, v) in &other.envs {
            self.envs.entry(k.clone()).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.annotations {
            self.annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        for m in &other.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for d in &other.devices {
            if !self
                .devices
                .iter()
                .any(|x| x.container_path == d.container_path)
            {
                self.devices.push(d.clone());
            }
        }
        for c in &other.cdi_devices {
            if !self.cdi_devices.contains(c) {
                self.cdi_devices.push(c.clone());
            }
        }
    }
}

/// Too few devices, in upstream's words (its admission wraps them as
/// `UnexpectedAdmissionError`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoneHealthy(String),
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    TooFew {
        resource: String,
        requested: usize,
        available: usize,
    },
}

/// The containers of `pod` in the order they start: init containers
/// (sidecars among them), then the app containers; `true` for an init
/// container that ends before the next starts.
fn in_start_order(pod: &Pod) -> Vec<(&Container, bool)> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let init = spec.init_containers.iter().flatten();
    let init = init.map(|c| (c, !is_sidecar(c)));
    init.chain(spec.containers.iter().map(|c| (c, false)))
        .collect()
}

/// The device resources `c` asks for (by limit; an extended resource's
/// request equals its limit), among those `known`.
pub fn requests(c: &Container, known: &dyn Fn(&str) -> bool) -> BTreeMap<String, usize> {
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    limits
        .into_iter()
        .flatten()
        .filter(|(name, _)| known(name))
        .map(|(name, q)| (name.clone(), (quantity_milli(&q.0) / 1000) as usize))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// One container's ask for one resource, as [`Planner::ask`] answers it.
#[derive(Debug, PartialEq, Eq)]
pub struct Ask {
    pub container: String,
    pub resource: String,
    pub wanted: usize,
    /// Handed on by an init container before it.
    pub reused: Vec<String>,
    /// Free and healthy: more to choose from if `reused` is short.
    pub available: Vec<String>,
    ends: bool,
}

impl Ask {
    pub fn needed(&self) -> usize {
        self.wanted - self.reused.len()
    }
}

/// Chooses the devices of a pod's containers one ask at a time (the
/// manager may ask a plugin for its preference between two steps).
pub struct Planner<'a> {
    healthy: &'a DeviceSets,
    in_use: &'a DeviceSets,
    /// Devices an init container had, for the containers after it.
    reusable: DeviceSets,
    /// Devices this pod's containers that run hold.
    taken: DeviceSets,
    asks: std::vec::IntoIter<(String, String, usize, bool)>,
}

impl<'a> Planner<'a> {
    /// For `pod`, from `healthy` less `in_use` (other pods' devices).
    pub fn new(pod: &Pod, healthy: &'a DeviceSets, in_use: &'a DeviceSets) -> Self {
        let known = |r: &str| healthy.contains_key(r);
        let mut asks = Vec::new();
        for (c, ends) in in_start_order(pod) {
            for (resource, wanted) in requests(c, &known) {
                asks.push((c.name.clone(), resource, wanted, ends));
            }
        }
        Planner {
            healthy,
            in_use,
            reusable: DeviceSets::new(),
            taken: DeviceSets::new(),
            asks: asks.into_iter(),
        }
    }

    /// The next ask, or `None` when every container has its devices.
    pub fn ask(&mut self) -> Option<Result<Ask, Unavailable>> {
        let (container, resource, wanted, ends) = self.asks.next()?;
        let reuse = self.reusable.entry(resource.clone()).or_default();
        let reused: Vec<String> = reuse.iter().take(wanted).cloned().collect();
        for id in &reused {
            reuse.remove(id);
        }
        let busy = |id: &String| {
            [self.in_use, &self.taken, &self.reusable]
                .iter()
                .any(|s| s.get(&resource).is_some_and(|s| s.contains(id)))
        };
        let available: Vec<String> = self.healthy[&resource]
            .iter()
            .filter(|id| !busy(id))
            .cloned()
            .collect();
        let ask = Ask {
            container,
            resource,
            wanted,
            reused,
            available,
            ends,
        };
        if ask.needed() > 0 && self.healthy[&ask.resource].is_empty() {
            return Some(Err(Unavailable::NoneHealthy(ask.resource)));
        }
        if ask.available.len() < ask.needed() {
            return Some(Err(Unavailable::TooFew {
                requested: ask.needed(),
                available: ask.available.len(),
                resource: ask.resource,
            }));
        }
        Some(Ok(ask))
    }

    /// Records the devices `ask` got: the reused ones and [`choose`]'s.
    pub fn give(&mut self, ask: &Ask, ids: &[String]) {
        let to = if ask.ends {
            &mut self.reusable
        } else {
            &mut self.taken
        };
        to.entry(ask.resource.clone())
            .or_default()
            .extend(ids.iter().cloned());
    }
}

/// Every container's devices without preferences: container → resource →
/// IDs.
#[cfg(test)]
fn plan(
    pod: &Pod,
    healthy: &DeviceSets,
    in_use: &DeviceSets,
) -> Result<BTreeMap<String, BTreeMap<String, Vec<String>>>, Unavailable> {
    let mut planner = Planner::new(pod, healthy, in_use);
    let mut out: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    while let Some(ask) = planner.ask() {
        let ask = ask?;
        let ids = choose(&ask, &[]);
        planner.give(&ask, &ids);
        out.entry(ask.container)
            .or_default()
            .insert(ask.resource, ids);
    }
    Ok(out)
}

/// The devices `ask` gets: those reused, then the `preferred` ones if
/// available (a plugin's answer is not trusted: unknown, busy or repeated
/// IDs are skipped), then the first available.
pub fn choose(ask: &Ask, preferred: &[String]) -> Vec<String> {
    let mut picked = ask.reused.clone();
    let candidates = preferred
        .iter()
        .filter(|id| ask.available.contains(id))
        .chain(&ask.available);
    for id in candidates {
        if picked.len() == ask.wanted {
            break;
        }
        if !picked.contains(id) {
            picked.push(id.clone());
        }
    }
    picked
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const R: &str = "example.com/resource";

    fn container(name: &str, n: &str) -> Container {
        let limits = [(R.to_string(), Quantity(n.into()))].into();
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                limits: Some(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(init),
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sets(ids: &[&str]) -> DeviceSets {
        [(R.to_string(), ids.iter().map(|s| s.to_string()).collect())].into()
    }

    #[test]
    fn free_healthy_devices_are_given_and_shortage_is_told_as_upstream() {
        let p = pod(vec![], vec![container("a", "1"), container("b", "1")]);
        let got = plan(&p, &sets(&["d1", "d2", "d3"]), &sets(&["d1"])).unwrap();
        assert_eq!(got["a"][R], ["d2"]);
        assert_eq!(got["b"][R], ["d3"]);
        let err = plan(&p, &sets(&["d1", "d2"]), &sets(&["d1"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "requested number of devices unavailable for example.com/resource. Requested: 1, Available: 0"
        );
        let err = plan(&p, &sets(&[]), &DeviceSets::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no healthy devices present; cannot allocate unhealthy devices example.com/resource"
        );
    }

    #[test]
    fn an_init_containers_devices_go_on_to_the_next_but_a_sidecars_do_not() {
        let p = pod(vec![container("init", "2")], vec![container("app", "1")]);
        let got = plan(&p, &sets(&["d1", "d2"]), &DeviceSets::new()).unwrap();
        assert_eq!(got["init"][R], ["d1", "d2"]);
        assert_eq!(got["app"][R], ["d1"]);
        let mut sidecar = container("side", "1");
        sidecar.restart_policy = Some("Always".into());
        let p = pod(vec![sidecar], vec![container("app", "2")]);
        let err = plan(&p, &sets(&["d1", "d2"]), &DeviceSets::new()).unwrap_err();
        assert!(
            matches!(err, Unavailable::TooFew { available: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn unknown_resources_are_not_the_device_managers() {
        let mut c = container("a", "1");
        c.resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap()
            .insert("cpu".into(), Quantity("2".into()));
        let p = pod(vec![], vec![c]);
        let got = plan(&p, &DeviceSets::new(), &DeviceSets::new()).unwrap();
        assert!(got.is_empty());
    }

    #[test]
    fn merged_options_keep_the_first_of_each_as_upstream() {
        let a = RunOptions {
            envs: [("K".into(), "a".into())].into(),
            devices: vec![DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/a".into(),
                permissions: "rw".into(),
            }],
            cdi_devices: vec!["v.io/c=1".into()],
            ..Default::default()
        };
        let mut b = a.clone();
        b.envs.insert("K".into(), "b".into());
        b.envs.insert("L".into(), "b".into());
        b.devices[0].host_path = "/dev/b".into();
        let mut merged = a.clone();
        merged.merge(&b);
        assert_eq!(merged.envs["K"], "a");
        assert_eq!(merged.envs["L"], "b");
        assert_eq!(merged.devices.len(), 1);
        assert_eq!(merged.devices[0].host_path, "/dev/a");
        assert_eq!(merged.cdi_devices.len(), 1);
    }

    #[test]
    fn a_valid_preference_is_followed_and_an_invalid_one_ignored() {
        let p = pod(vec![], vec![container("a", "2")]);
        let healthy = sets(&["d1", "d2", "d3"]);
        let none = DeviceSets::new();
        let mut planner = Planner::new(&p, &healthy, &none);
        let ask = planner.ask().unwrap().unwrap();
        let preferred = ["d3", "nope", "d3", "d2"].map(String::from);
        assert_eq!(choose(&ask, &preferred), ["d3", "d2"]);
        assert_eq!(choose(&ask, &[]), ["d1", "d2"]);
    }
}
