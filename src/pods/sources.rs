//! The source merge: every pod source (the API watch, the static pod dir,
//! the checkpoint read at start) sends whole snapshots; this keeps the
//! newest snapshot of each and merges them into one desired set by UID.
//!
//! `ready()` is upstream's `SourcesReady`: nothing may be torn down as
//! "gone" until every expected source has reported once, so a restart
//! re-adopts running pods instead of killing them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// A full snapshot of one source's pods.
#[derive(Debug)]
pub struct SourceUpdate {
    pub source: &'static str,
    pub pods: Vec<Pod>,
}

/// The newest snapshot of each source.
#[derive(Debug, Default)]
pub struct Sources {
    expected: Vec<&'static str>,
    snapshots: BTreeMap<&'static str, Vec<Pod>>,
}

impl Sources {
    /// Sources that must report before anything is treated as gone.
    pub fn new(expected: Vec<&'static str>) -> Self {
        Sources {
            expected,
            snapshots: BTreeMap::new(),
        }
    }

    /// Takes one source's snapshot in place of its previous one.
    pub fn update(&mut self, u: SourceUpdate) {
        self.snapshots.insert(u.source, u.pods);
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
        s.update(SourceUpdate {
            source: "file",
            pods: vec![pod("a")],
        });
        assert!(!s.ready());
        s.update(SourceUpdate {
            source: "api",
            pods: vec![],
        });
        assert!(s.ready());
    }

    #[test]
    fn snapshots_replace_and_merge() {
        let mut s = Sources::new(vec!["api", "file"]);
        s.update(SourceUpdate {
            source: "api",
            pods: vec![pod("a"), pod("b")],
        });
        s.update(SourceUpdate {
            source: "file",
            pods: vec![pod("c")],
        });
        assert_eq!(
            s.desired().keys().cloned().collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        s.update(SourceUpdate {
            source: "api",
            pods: vec![pod("b")],
        });
        assert_eq!(s.desired().keys().cloned().collect::<Vec<_>>(), ["b", "c"]);
        assert!(s.get("a").is_none() && s.get("c").is_some());
    }
}
