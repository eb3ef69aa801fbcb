//! The image reference parser: never a panic, and normalising is stable
//! (the canonical name of a parsed reference parses to the same reference).
//! (The body of fuzz_targets/image_reference.rs, shared with tests/fuzz_corpus.rs,
//! which replays the corpus through it.)

/// One input; a panic is a finding.
pub fn run(data: &[u8]) {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = kinglet_runtime_oci::images::parse_reference(name) {
        let canonical = kinglet_runtime_oci::images::canonical(&r);
        assert!(
            !canonical.chars().any(char::is_whitespace),
            "{name:?} -> {canonical:?}"
        );
        let again = kinglet_runtime_oci::images::parse_reference(&canonical)
            .unwrap_or_else(|e| panic!("{name:?} -> {canonical:?} does not parse: {e}"));
        assert_eq!(
            kinglet_runtime_oci::images::canonical(&again),
            canonical,
            "from {name:?}"
        );
    }
}
