//! The image importer (warren-images `import.rs`) end to end on an uploaded file: format
//! detection, gzip and zstd, the tar extractor, OCI layouts (index, nested index, manifest,
//! config, blobs by digest, their hashes) and docker-save archives (manifest, layers found
//! through links inside the archive). The store is in the run's own temporary directory, and
//! `mkfs.erofs` is a stub (`fuzz/stub/`) that writes an empty image: the parsers are what is
//! fuzzed here, not erofs-utils.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use warren_images::Store;
use warren_images::import;
use warren_images::unpack::Limits;

/// The store, made at the first input; the stubs go first in PATH.
fn store() -> &'static (tempfile::TempDir, Store) {
    static STORE: OnceLock<(tempfile::TempDir, Store)> = OnceLock::new();
    STORE.get_or_init(|| {
        let stub = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("stub");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![stub];
        dirs.extend(std::env::split_paths(&path));
        let joined = std::env::join_paths(dirs).expect("a PATH");
        // SAFETY: set once, before any thread of this process reads the environment (the
        // importer starts none, and libFuzzer runs inputs on its main thread).
        unsafe { std::env::set_var("PATH", joined) };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path()).expect("the store");
        (dir, store)
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (dir, store) = store();
    let upload = dir.path().join("upload");
    std::fs::write(&upload, data).expect("the upload");
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 256,
    };
    if let Ok(i) = import::import_file(store, &upload, "fuzz", limits) {
        assert!(!i.layers.is_empty());
    }
    // Every staging directory is gone again.
    let left = std::fs::read_dir(dir.path().join("tmp"))
        .expect("the store's tmp")
        .count();
    assert_eq!(left, 0, "an import left a staging directory");
});
