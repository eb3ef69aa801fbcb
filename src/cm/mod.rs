//! The container manager, upstream's `cm`: the node's side of cgroups.
//! [`node_allocatable`] makes the pods' cgroup and enforces node
//! allocatable on it; [`qos`] gives each pod its QoS class, cgroup parent
//! and OOM scores; [`pod_cgroups`] removes the pod cgroups a pod that is
//! gone left; [`swap`] checks and measures the node's swap. The cgroup version is told once, by
//! `kinglet_runtime::podcgroup::Hierarchy`, which both runtimes share.

pub mod node_allocatable;
pub mod pod_cgroups;
pub mod qos;
pub mod swap;
