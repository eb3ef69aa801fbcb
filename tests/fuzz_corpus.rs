//! The fuzz corpus replayed in the ordinary test build: every input kept in
//! `fuzz/corpus/<target>` (what libFuzzer found interesting, and every
//! crash once fixed) goes through the fuzz target's own body
//! (`fuzz/bodies/<target>.rs`), so a regression fails `cargo test` without
//! the nightly sanitizer build. Finding new inputs is `tests/fuzz.sh`'s job,
//! a separate command.

#[path = "../fuzz/bodies/api_request.rs"]
mod api_request;
#[path = "../fuzz/bodies/cert_der.rs"]
mod cert_der;
#[path = "../fuzz/bodies/config.rs"]
mod config;
#[path = "../fuzz/bodies/image_reference.rs"]
mod image_reference;
#[path = "../fuzz/bodies/layer.rs"]
mod layer;
#[path = "../fuzz/bodies/manifest.rs"]
mod manifest;
#[path = "../fuzz/bodies/spdy_frame.rs"]
mod spdy_frame;

/// Runs every input of `target`'s corpus through `run`; prints how many.
fn replay(target: &str, run: fn(&[u8])) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "{}: an empty corpus replays nothing",
        dir.display()
    );
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if std::panic::catch_unwind(|| run(&data)).is_err() {
            panic!("{} fails its fuzz target", f.display());
        }
    }
    println!(
        "figure: fuzz corpus {target}: {} inputs replayed",
        files.len()
    );
}

#[test]
fn api_request_corpus() {
    replay("api_request", api_request::run);
}

#[test]
fn config_corpus() {
    replay("config", config::run);
}

#[test]
fn image_reference_corpus() {
    replay("image_reference", image_reference::run);
}

#[test]
fn layer_corpus() {
    replay("layer", layer::run);
}

#[test]
fn manifest_corpus() {
    replay("manifest", manifest::run);
}

#[test]
fn spdy_frame_corpus() {
    replay("spdy_frame", spdy_frame::run);
}

#[test]
fn cert_der_corpus() {
    replay("cert_der", cert_der::run);
}
