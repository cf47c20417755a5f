//! The image importer's careful tar extractor (warren-images `unpack.rs`), as an import
//! runs it: a layer (owners, devices, attributes, OCI whiteouts) or an archive of files (OCI
//! layout, docker save), under a budget, into a fresh directory of the run's own temporary
//! directory, removed after each input. The first byte picks the mode (bit 0: a layer).
#![no_main]

use warren_images::unpack::{self, Budget, Limits, Mode};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&how, tar)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().join("root");
    std::fs::create_dir(&root).expect("the staging root");
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 256,
    };
    let mut budget = Budget::new(limits);
    let mode = Mode {
        layer: how & 1 == 1,
    };
    if let Ok(u) = unpack::unpack(tar, &root, mode, &mut budget) {
        assert!(u.entries <= limits.max_entries && u.bytes <= limits.max_bytes);
    }
    // Nothing was written outside the root.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("the temporary directory")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(names, ["root"], "the extractor wrote beside its root");
});
