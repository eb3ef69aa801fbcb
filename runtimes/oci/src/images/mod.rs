//! The image store (placeholder during construction).
pub mod unpack;
