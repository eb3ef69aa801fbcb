//! kinglet as a library: every part of the agent. The binary (`main.rs`)
//! is the edge that runs them; the fuzz targets (`fuzz/`) reach the
//! parsers here that take untrusted input.

pub use kinglet_runtime::backoff;
pub mod cadvisor;
pub mod certificate;
pub mod cm;
pub mod config;
pub mod demo;
pub mod devices;
mod dirwatch;
mod eviction;
mod fsutil;
pub mod health;
pub mod images;
pub mod kubelet;
mod metrics;
mod node;
pub mod pods;
pub mod server;
mod store;
mod table;
pub mod upgrade;
