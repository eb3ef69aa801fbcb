//! From the pod spec to what the runtime is asked for, as upstream's
//! `kuberuntime`: what to do next ([`plan`], upstream's
//! `computePodActions`), the sandbox's config ([`sandbox`]) and each
//! container's ([`container`], with its environment from [`env`]), and what
//! an in-place resize does to running containers ([`resize`]). All of
//! it pure: the pod, the runtime's report, the node's facts and the time
//! in, configs and actions out, unit-tested without a runtime.

pub mod container;
pub mod env;
pub mod instrumented;
pub mod plan;
pub mod resize;
pub mod sandbox;
pub mod swap;
