//! The KubeletConfiguration parser (`--config`): any bytes, as YAML or JSON.
//! Never a panic; a config it accepts also yields its eviction thresholds
//! and its derived values without one.
//! (The body of fuzz_targets/config.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

/// One input; a panic is a finding.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = kinglet::config::parse(text, "fuzz.yaml", &mut |_| {}) {
        let _ = cfg.eviction_thresholds();
        let _ = cfg.eviction_hard_effective();
        let _ = cfg.pods_cgroup();
    }
}
