//! The source merge: every pod source (the API watch, the static pod dir,
//! the checkpoint read at start) sends whole snapshots; this keeps the
//! newest snapshot of each and merges them into one desired set by UID,
//! and, beside it, the status the API shows of each pod (for a static pod,
//! its mirror pod's).
//!
//! `ready()` is upstream's `SourcesReady`: nothing may be torn down as
//! "gone" until every expected source has reported once, so a restart
//! re-adopts running pods instead of killing them.

pub mod api;
pub mod file;
pub mod validate;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// A full snapshot of one source's pods.
#[derive(Debug)]
pub struct SourceUpdate {
    pub source: &'static str,
    pub pods: Vec<Pod>,
    /// The mirror pods the API holds of this node's static pods (the API
    /// source only): not pods to run, but where their status is read back.
    pub mirrors: Vec<Pod>,
}

impl SourceUpdate {
    /// A snapshot of pods, with no mirror pods.
    pub fn pods(source: &'static str, pods: Vec<Pod>) -> Self {
        SourceUpdate {
            source,
            pods,
            mirrors: Vec::new(),
        }
    }
}

/// The newest snapshot of each source.
#[derive(Debug, Default)]
pub struct Sources {
    expected: Vec<&'static str>,
    snapshots: BTreeMap<&'static str, Vec<Pod>>,
    mirrors: BTreeMap<&'static str, Vec<Pod>>,
}

impl Sources {
    /// Sources that must report before anything is treated as gone.
    pub fn new(expected: Vec<&'static str>) -> Self {
        Sources {
            expected,
            snapshots: BTreeMap::new(),
            mirrors: BTreeMap::new(),
        }
    }

    /// Takes one source's snapshot in place of its previous one.
    pub fn update(&mut self, u: SourceUpdate) {
        self.snapshots.insert(u.source, u.pods);
        self.mirrors.insert(u.source, u.mirrors);
    }

    /// Each desired pod with the status the API last showed of it: an API
    /// pod's own, a static pod's mirror's (same namespace and name). What
    /// upstream's status manager compares its cache with (`needsReconcile`).
    pub fn api_statuses(&self) -> Vec<(&Pod, &PodStatus)> {
        let key = |p: &Pod| (p.metadata.namespace.clone(), p.metadata.name.clone());
        let mirrors: BTreeMap<_, &PodStatus> = self
            .mirrors
            .values()
            .flatten()
            .filter_map(|m| Some((key(m), m.status.as_ref()?)))
            .collect();
        let mut out = Vec::new();
        for (source, pods) in &self.snapshots {
            for p in pods {
                let status = match *source {
                    "api" => p.status.as_ref(),
                    _ => mirrors.get(&key(p)).copied(),
                };
                if let Some(s) = status {
                    out.push((p, s));
                }
            }
        }
        out
    }

    /// Every expected source has reported at least once.
    pub fn ready(&self) -> bool {
        self.expected.iter().all(|s| self.snapshots.contains_key(s))
    }

    /// The merged desired set, by UID (pods without a UID are skipped;
    /// every source sets one).
    pub fn desired(&self) -> BTreeMap<String, Pod> {
        self.snapshots
            .values()
            .flatten()
            .filter_map(|p| p.metadata.uid.clone().map(|u| (u, p.clone())))
            .collect()
    }

    /// The UIDs of the desired set, without cloning the pods.
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.snapshots
            .values()
            .flatten()
            .filter_map(|p| p.metadata.uid.as_ref())
    }

    /// The current spec of one UID, if any source has it.
    pub fn get(&self, uid: &str) -> Option<&Pod> {
        self.snapshots
            .values()
            .flatten()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::pods::test_pod as pod;

    #[test]
    fn ready_only_once_every_source_reported() {
        let mut s = Sources::new(vec!["api", "file"]);
        assert!(!s.ready());
        s.update(SourceUpdate::pods("file", vec![pod("a")]));
        assert!(!s.ready());
        s.update(SourceUpdate::pods("api", vec![]));
        assert!(s.ready());
    }

    #[test]
    fn snapshots_replace_and_merge() {
        let mut s = Sources::new(vec!["api", "file"]);
        s.update(SourceUpdate::pods("api", vec![pod("a"), pod("b")]));
        s.update(SourceUpdate::pods("file", vec![pod("c")]));
        assert_eq!(
            s.desired().keys().cloned().collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        s.update(SourceUpdate::pods("api", vec![pod("b")]));
        assert_eq!(s.desired().keys().cloned().collect::<Vec<_>>(), ["b", "c"]);
        assert!(s.get("a").is_none() && s.get("c").is_some());
    }

    #[test]
    fn api_statuses_are_the_pods_own_or_their_mirrors() {
        let named = |uid: &str, name: &str, phase: Option<&str>| {
            let mut p = pod(uid);
            p.metadata.namespace = Some("ns".into());
            p.metadata.name = Some(name.into());
            p.status = phase.map(|ph| PodStatus {
                phase: Some(ph.into()),
                ..Default::default()
            });
            p
        };
        let mut s = Sources::new(vec!["api", "file"]);
        s.update(SourceUpdate {
            source: "api",
            pods: vec![
                named("a", "api-pod", Some("Running")),
                named("n", "new", None),
            ],
            mirrors: vec![named("m", "static", Some("Pending"))],
        });
        s.update(SourceUpdate::pods(
            "file",
            vec![named("s", "static", None), named("t", "no-mirror", None)],
        ));
        let got: Vec<(String, String)> = s
            .api_statuses()
            .iter()
            .map(|(p, st)| (p.metadata.uid.clone().unwrap(), st.phase.clone().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), "Running".into()),
                ("s".into(), "Pending".into())
            ]
        );
    }
}
