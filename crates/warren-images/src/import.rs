//! Importing images: a root file system directory, a tarball (plain, gzip or zstd), an OCI
//! image layout (directory or archive), a `docker save` archive, or an EROFS file.
//!
//! The format is found from the content, not the name. Archives with several layers become
//! several layers, in order, so images that share a base share its layers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use warren_fs::Beneath;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use warren_types::api::Layer;

use crate::ImageError;
use crate::store::{Owner, Store, is_erofs};
use crate::unpack::{Budget, Limits, Mode, unpack};

/// What an import produced.
#[derive(Debug, Clone)]
pub struct Imported {
    /// The layers, bottom first.
    pub layers: Vec<Layer>,
    /// The source format: `directory`, `tar`, `tar+gzip`, `tar+zstd`, `oci`, `docker-save`
    /// or `erofs`.
    pub source: String,
    /// Default environment from the image's configuration.
    pub env: BTreeMap<String, String>,
    /// Default user.
    pub user: Option<String>,
    /// Default working directory.
    pub workdir: Option<String>,
}

impl Imported {
    fn plain(layers: Vec<Layer>, source: &str) -> Imported {
        Imported {
            layers,
            source: source.into(),
            env: BTreeMap::new(),
            user: None,
            workdir: None,
        }
    }
}

/// Imports a directory: an OCI image layout when it has an `oci-layout` file, else a root
/// file system taken as it is.
pub fn import_dir(store: &Store, dir: &Path, creator: &str) -> Result<Imported, ImageError> {
    let w = Writer {
        store,
        creator,
        owner: None,
    };
    let root = Beneath::open(dir).map_err(|e| ImageError::io("opening the directory", e))?;
    if is_file(&root, "oci-layout") {
        return import_oci(&w, &root, &mut Budget::new(Limits::default()));
    }
    let layer = w.layer_dir(dir, "directory")?;
    Ok(Imported::plain(vec![layer], "directory"))
}

/// How a stream is compressed, from its first bytes.
fn compression(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some("gzip")
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some("zstd")
    } else {
        None
    }
}

/// A reader that undoes the compression its first bytes announce.
fn decompressed<'a>(
    r: impl BufRead + 'a,
    what: &str,
) -> Result<(Box<dyn Read + 'a>, Option<&'static str>), ImageError> {
    let mut r = r;
    let head = r
        .fill_buf()
        .map_err(|e| ImageError::io(format!("reading {what}"), e))?
        .to_vec();
    Ok(match compression(&head) {
        Some("gzip") => (
            Box::new(flate2::bufread::MultiGzDecoder::new(r)),
            Some("gzip"),
        ),
        Some(_) => {
            let d = ruzstd::decoding::StreamingDecoder::new(r).map_err(|e| {
                ImageError::Invalid(format!("{what}: not a valid zstd stream: {e}"))
            })?;
            (Box::new(d), Some("zstd"))
        }
        None => (Box::new(r), None),
    })
}

fn looks_like_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// Imports an uploaded file, whatever its format.
pub fn import_file(
    store: &Store,
    file: &Path,
    creator: &str,
    limits: Limits,
) -> Result<Imported, ImageError> {
    import_file_owned(store, file, creator, limits, None)
}

/// Who writes an import's layers, and as whose.
struct Writer<'a> {
    store: &'a Store,
    creator: &'a str,
    owner: Option<Owner>,
}

impl Writer<'_> {
    fn layer_dir(&self, dir: &Path, source: &str) -> Result<Layer, ImageError> {
        self.store
            .add_layer_dir_owned(dir, source, self.creator, self.owner)
    }
}

/// [`import_file`], every entry of every layer owned by `owner` when one is given (a workspace
/// for the sandbox's user, say). An EROFS file is taken as it is, so it cannot have one.
pub fn import_file_owned(
    store: &Store,
    file: &Path,
    creator: &str,
    limits: Limits,
    owner: Option<Owner>,
) -> Result<Imported, ImageError> {
    let w = Writer {
        store,
        creator,
        owner,
    };
    let mut f = fs::File::open(file).map_err(|e| ImageError::io("opening the upload", e))?;
    let mut head = vec![0u8; 2048];
    let mut n = 0;
    while n < head.len() {
        let k = f
            .read(&mut head[n..])
            .map_err(|e| ImageError::io("reading the upload", e))?;
        if k == 0 {
            break;
        }
        n += k;
    }
    head.truncate(n);
    if is_erofs(&head) {
        if owner.is_some() {
            return Err(ImageError::Invalid(
                "an EROFS file is stored as it is, so it cannot be given an owner; import a tar \
                 archive or a directory to set one"
                    .into(),
            ));
        }
        let tmp = store.tmp()?;
        let copy = tmp.path().join("layer.erofs");
        fs::copy(file, &copy).map_err(|e| ImageError::io("copying the layer", e))?;
        crate::store::fsck(&copy)?;
        let layer = store.add_layer_file(&copy, "erofs", creator)?;
        return Ok(Imported::plain(vec![layer], "erofs"));
    }
    let comp = compression(&head);
    if comp.is_none() && !looks_like_tar(&head) {
        return Err(ImageError::Invalid(
            "the upload is not a tar archive (plain, gzip or zstd), an OCI image layout, a \
             docker save archive or an EROFS file"
                .into(),
        ));
    }
    let f = fs::File::open(file).map_err(|e| ImageError::io("opening the upload", e))?;
    let (r, comp) = decompressed(BufReader::with_capacity(1 << 20, f), "the upload")?;
    let staging = store.tmp()?;
    let root = staging.path().join("root");
    fs::create_dir(&root).map_err(|e| ImageError::io("making the staging directory", e))?;
    let mut budget = Budget::new(limits);
    unpack(r, &root, Mode { layer: true }, &mut budget)?;
    let tree =
        Beneath::open(&root).map_err(|e| ImageError::io("opening the staging directory", e))?;
    if is_file(&tree, "oci-layout") && is_file(&tree, "index.json") {
        return import_oci(&w, &tree, &mut budget);
    }
    if is_file(&tree, "manifest.json") && !exists(&tree, "etc") {
        return import_docker(&w, &tree, &mut budget);
    }
    let source = match comp {
        Some(c) => format!("tar+{c}"),
        None => "tar".into(),
    };
    let layer = w.layer_dir(&root, &source)?;
    Ok(Imported::plain(vec![layer], &source))
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: Read> BufRead for Hashing<BufReader<R>> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        if let Ok(buf) = self.inner.fill_buf() {
            let k = amt.min(buf.len());
            self.hash.update(&buf[..k]);
        }
        self.inner.consume(amt);
    }
}

/// Largest JSON document (index, manifest, config) read from an archive.
const MAX_JSON: u64 = 16 << 20;

/// Whether `rel` in `root` is a regular file (links are not followed).
fn is_file(root: &Beneath, rel: &str) -> bool {
    rustix::fs::statat(root.root(), rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file())
}

/// Whether anything is at `rel` in `root` (links are not followed).
fn exists(root: &Beneath, rel: &str) -> bool {
    rustix::fs::statat(root.root(), rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

/// Opens regular file `rel` of an unpacked archive. `links` says whether links in the archive
/// may be resolved (inside it only, as `docker save` archives use them for shared layers) or
/// are refused (OCI layouts name files by digest and have no use for them).
fn open_in(
    root: &Beneath,
    rel: &str,
    what: &str,
    links: warren_fs::Links,
) -> Result<fs::File, ImageError> {
    warren_fs::open_file(root.root(), Path::new(rel.trim_start_matches('/')), links).map_err(|e| {
        ImageError::Invalid(format!(
            "{what} {rel:?} is missing from the archive or is not a regular file: {e}"
        ))
    })
}

/// Unpacks one layer blob (any compression) into a staging directory and stores it.
fn layer_from_blob(
    w: &Writer<'_>,
    f: fs::File,
    expect: Option<&str>,
    source: &str,
    budget: &mut Budget,
) -> Result<Layer, ImageError> {
    let store = w.store;
    let mut hashing = Hashing {
        inner: BufReader::with_capacity(1 << 20, f),
        hash: Sha256::new(),
    };
    let staging = store.tmp()?;
    let root = staging.path().join("root");
    fs::create_dir(&root).map_err(|e| ImageError::io("making the staging directory", e))?;
    {
        let (mut r, _) = decompressed(&mut hashing, "a layer blob")?;
        unpack(&mut r, &root, Mode { layer: true }, budget)?;
        io::copy(&mut r, &mut io::sink())
            .map_err(|e| ImageError::Invalid(format!("a layer blob is corrupt: {e}")))?;
    }
    io::copy(&mut hashing, &mut io::sink())
        .map_err(|e| ImageError::io("reading a layer blob", e))?;
    if let Some(want) = expect {
        let got = format!("sha256:{:x}", hashing.hash.finalize());
        if got != want {
            return Err(ImageError::Invalid(format!(
                "layer blob {want} is corrupt: its content hashes to {got}"
            )));
        }
    }
    w.layer_dir(&root, source)
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ConfigFile {
    #[serde(default)]
    config: Option<RunConfig>,
}

#[derive(Deserialize, Default)]
struct RunConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "User", default)]
    user: Option<String>,
    #[serde(rename = "WorkingDir", default)]
    workdir: Option<String>,
}

/// Reads a JSON document of at most [`MAX_JSON`] bytes.
fn parse_json<T: for<'de> Deserialize<'de>>(f: fs::File, what: &str) -> Result<T, ImageError> {
    let mut bytes = Vec::new();
    f.take(MAX_JSON + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(format!("reading {what}"), e))?;
    if bytes.len() as u64 > MAX_JSON {
        return Err(ImageError::TooLarge(format!(
            "{what} is larger than {MAX_JSON} bytes"
        )));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| ImageError::Invalid(format!("{what} is not valid: {e}")))
}

/// A JSON file of an OCI layout (no links followed).
fn read_json<T: for<'de> Deserialize<'de>>(
    root: &Beneath,
    rel: &str,
    what: &str,
) -> Result<T, ImageError> {
    parse_json(open_in(root, rel, what, warren_fs::Links::Refuse)?, what)
}

/// A blob of an OCI layout, by digest.
fn blob(root: &Beneath, digest: &str) -> Result<fs::File, ImageError> {
    let hex = crate::names::check_digest(digest)?;
    open_in(
        root,
        &format!("blobs/sha256/{hex}"),
        "blob",
        warren_fs::Links::Refuse,
    )
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn pick(manifests: Vec<Descriptor>) -> Result<Descriptor, ImageError> {
    let mut fallback = None;
    for m in manifests {
        match &m.platform {
            Some(p) if p.os == "linux" && p.architecture == go_arch() => return Ok(m),
            Some(p) if p.os == "unknown" => {} // attestations
            None if fallback.is_none() => fallback = Some(m),
            _ => {}
        }
    }
    fallback.ok_or_else(|| {
        ImageError::Invalid(format!(
            "the image index has no manifest for linux/{}",
            go_arch()
        ))
    })
}

fn apply_config(out: &mut Imported, cfg: ConfigFile) {
    let Some(c) = cfg.config else { return };
    for kv in c.env.unwrap_or_default() {
        if let Some((k, v)) = kv.split_once('=') {
            out.env.insert(k.to_string(), v.to_string());
        }
    }
    out.user = c.user.filter(|u| !u.is_empty());
    out.workdir = c.workdir.filter(|w| !w.is_empty());
}

/// Imports an OCI image layout (unpacked at `root`).
fn import_oci(w: &Writer<'_>, root: &Beneath, budget: &mut Budget) -> Result<Imported, ImageError> {
    let index: Index = read_json(root, "index.json", "index.json")?;
    let mut desc = pick(index.manifests)?;
    for _ in 0..2 {
        if desc.media_type.contains("index") || desc.media_type.contains("manifest.list") {
            let inner: Index = parse_json(blob(root, &desc.digest)?, "the image index")?;
            desc = pick(inner.manifests)?;
        }
    }
    let manifest: Manifest = parse_json(blob(root, &desc.digest)?, "the image manifest")?;
    let mut out = Imported::plain(Vec::new(), "oci");
    for l in &manifest.layers {
        out.layers.push(layer_from_blob(
            w,
            blob(root, &l.digest)?,
            Some(&l.digest),
            "oci",
            budget,
        )?);
    }
    let cfg: ConfigFile = parse_json(blob(root, &manifest.config.digest)?, "the image config")?;
    apply_config(&mut out, cfg);
    if out.layers.is_empty() {
        return Err(ImageError::Invalid("the image has no layers".into()));
    }
    Ok(out)
}

#[derive(Deserialize)]
struct DockerManifest {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// Imports a `docker save` archive (unpacked at `root`).
fn import_docker(
    w: &Writer<'_>,
    root: &Beneath,
    budget: &mut Budget,
) -> Result<Imported, ImageError> {
    let manifests: Vec<DockerManifest> = read_json(root, "manifest.json", "manifest.json")?;
    let Some(m) = manifests.into_iter().next() else {
        return Err(ImageError::Invalid("manifest.json lists no image".into()));
    };
    let mut out = Imported::plain(Vec::new(), "docker-save");
    let inside = warren_fs::Links::InsideRoot;
    for rel in &m.layers {
        out.layers.push(layer_from_blob(
            w,
            open_in(root, rel, "layer", inside)?,
            None,
            "docker-save",
            budget,
        )?);
    }
    let cfg: ConfigFile = parse_json(
        open_in(root, &m.config, "config", inside)?,
        "the image config",
    )?;
    apply_config(&mut out, cfg);
    if out.layers.is_empty() {
        return Err(ImageError::Invalid("the image has no layers".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tar_files(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (p, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_uid(1000);
            h.set_gid(1000);
            b.append_data(&mut h, p, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    fn sha(data: &[u8]) -> String {
        format!("sha256:{:x}", Sha256::digest(data))
    }

    /// Extracts a layer with fsck.erofs to look at it.
    fn extract(store: &Store, digest: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("fsck.erofs")
            .arg(format!("--extract={}", d.path().join("x").display()))
            .arg(store.layer_path(digest).unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        d
    }

    fn write(dir: &Path, rel: &str, data: &[u8]) {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, data).unwrap();
    }

    /// An OCI layout with two layers (gzip, then zstd with a whiteout) and a config.
    fn oci_layout(dir: &Path) {
        let l1 = gzip(&tar_files(&[("etc/a", b"one"), ("etc/b", b"bee")]));
        let l2 = zstd(&tar_files(&[("etc/a", b"two"), ("etc/.wh.b", b"")]));
        let cfg = br#"{"config":{"Env":["PATH=/usr/bin:/bin","LANG=C.UTF-8"],"User":"1000","WorkingDir":"/work"}}"#;
        for blob in [&l1[..], &l2[..], &cfg[..]] {
            write(dir, &format!("blobs/sha256/{}", &sha(blob)[7..]), blob);
        }
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}},{{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"{}","size":{}}}]}}"#,
            sha(cfg),
            cfg.len(),
            sha(&l1),
            l1.len(),
            sha(&l2),
            l2.len()
        );
        write(
            dir,
            &format!("blobs/sha256/{}", &sha(manifest.as_bytes())[7..]),
            manifest.as_bytes(),
        );
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":{},"platform":{{"architecture":"{}","os":"linux"}}}}]}}"#,
            sha(manifest.as_bytes()),
            manifest.len(),
            go_arch()
        );
        write(dir, "index.json", index.as_bytes());
        write(dir, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    }

    fn tar_dir(dir: &Path) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        b.append_dir_all(".", dir).unwrap();
        b.into_inner().unwrap()
    }

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        (d, s)
    }

    fn upload(s: &Store, bytes: &[u8]) -> Result<Imported, ImageError> {
        let t = s.tmp().unwrap();
        fs::write(t.path().join("upload"), bytes).unwrap();
        import_file(s, &t.path().join("upload"), "test", Limits::default())
    }

    #[test]
    fn the_same_content_is_the_same_layer_and_an_owner_owns_every_entry() {
        let (_d, s) = store();
        let t = tar_files(&[("work/a", b"a"), ("work/sub/b", b"b")]);
        let first = upload(&s, &t).unwrap().layers[0].digest.clone();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        // A second import a second later, and the same archive compressed: one layer.
        assert_eq!(upload(&s, &t).unwrap().layers[0].digest, first);
        assert_eq!(upload(&s, &gzip(&t)).unwrap().layers[0].digest, first);
        assert_eq!(s.layers().len(), 1);

        let up = s.tmp().unwrap();
        fs::write(up.path().join("upload"), &t).unwrap();
        let owned = |o: &str| {
            import_file_owned(
                &s,
                &up.path().join("upload"),
                "test",
                Limits::default(),
                Some(Owner::parse(o).unwrap()),
            )
            .unwrap()
            .layers[0]
                .digest
                .clone()
        };
        let as_root = owned("root");
        assert_ne!(as_root, first, "the owner is part of the content");
        let x = extract(&s, &owned("4242:77"));
        use std::os::unix::fs::MetadataExt;
        for rel in ["x/work", "x/work/a", "x/work/sub/b"] {
            let md = fs::metadata(x.path().join(rel)).unwrap();
            assert_eq!((md.uid(), md.gid()), (4242, 77), "{rel}");
        }
        let x = extract(&s, &as_root);
        assert_eq!(fs::metadata(x.path().join("x/work/a")).unwrap().uid(), 0);
        // Bad owners are a clear 400 (the parsing is tested in warren-types).
        let e = crate::store::parse_owner("nobody").unwrap_err();
        assert!(matches!(e, ImageError::Invalid(_)), "{e}");
        // An EROFS file is stored as it is: it cannot take an owner.
        let erofs = s.tmp().unwrap();
        fs::copy(s.layer_path(&first).unwrap(), erofs.path().join("upload")).unwrap();
        let e = import_file_owned(
            &s,
            &erofs.path().join("upload"),
            "test",
            Limits::default(),
            Some(Owner::parse("user").unwrap()),
        )
        .unwrap_err();
        assert!(matches!(e, ImageError::Invalid(_)), "{e}");
    }

    #[test]
    fn tarballs_plain_gzip_and_zstd() {
        let (_d, s) = store();
        let t = tar_files(&[("etc/marker", b"m"), ("bin/x", b"x")]);
        for (bytes, source) in [
            (t.clone(), "tar"),
            (gzip(&t), "tar+gzip"),
            (zstd(&t), "tar+zstd"),
        ] {
            let i = upload(&s, &bytes).unwrap();
            assert_eq!(i.source, source);
            assert_eq!(i.layers.len(), 1);
            let x = extract(&s, &i.layers[0].digest);
            assert_eq!(fs::read(x.path().join("x/etc/marker")).unwrap(), b"m");
            use std::os::unix::fs::MetadataExt;
            assert_eq!(fs::metadata(x.path().join("x/bin/x")).unwrap().uid(), 1000);
        }
    }

    #[test]
    fn oci_layouts_as_directory_and_archive_keep_layers_whiteouts_and_config() {
        let (_d, s) = store();
        let dir = tempfile::tempdir().unwrap();
        oci_layout(dir.path());
        for i in [
            import_dir(&s, dir.path(), "test").unwrap(),
            upload(&s, &tar_dir(dir.path())).unwrap(),
        ] {
            assert_eq!(i.source, "oci");
            assert_eq!(i.layers.len(), 2);
            assert_eq!(i.env["LANG"], "C.UTF-8");
            assert_eq!(i.user.as_deref(), Some("1000"));
            assert_eq!(i.workdir.as_deref(), Some("/work"));
            let top = extract(&s, &i.layers[1].digest);
            assert_eq!(fs::read(top.path().join("x/etc/a")).unwrap(), b"two");
            use std::os::unix::fs::FileTypeExt;
            let wh = fs::symlink_metadata(top.path().join("x/etc/b")).unwrap();
            assert!(
                wh.file_type().is_char_device(),
                "whiteout kept as 0/0 device"
            );
        }
    }

    #[test]
    fn corrupt_oci_blobs_are_refused() {
        let (_d, s) = store();
        let dir = tempfile::tempdir().unwrap();
        oci_layout(dir.path());
        // Flip a byte of the zstd layer... any layer blob: rewrite the first one found.
        let blobs = dir.path().join("blobs/sha256");
        let mut victim = None;
        for e in fs::read_dir(&blobs).unwrap().flatten() {
            let b = fs::read(e.path()).unwrap();
            if b.starts_with(&[0x1f, 0x8b]) {
                victim = Some(e.path());
            }
        }
        let victim = victim.unwrap();
        let mut b = fs::read(&victim).unwrap();
        let n = b.len();
        b[n - 5] ^= 0xff;
        fs::write(&victim, b).unwrap();
        let r = import_dir(&s, dir.path(), "test");
        assert!(matches!(r, Err(ImageError::Invalid(_))), "{r:?}");
    }

    #[test]
    fn docker_save_archives() {
        let (_d, s) = store();
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "aaa/layer.tar",
            &tar_files(&[("etc/a", b"one")]),
        );
        write(
            dir.path(),
            "bbb/layer.tar",
            &tar_files(&[("etc/.wh.a", b""), ("etc/c", b"c")]),
        );
        write(dir.path(), "cfg.json", br#"{"config":{"Env":["X=1"]}}"#);
        write(
            dir.path(),
            "manifest.json",
            br#"[{"Config":"cfg.json","RepoTags":["x:1"],"Layers":["aaa/layer.tar","bbb/layer.tar"]}]"#,
        );
        let i = upload(&s, &gzip(&tar_dir(dir.path()))).unwrap();
        assert_eq!(i.source, "docker-save");
        assert_eq!(i.layers.len(), 2);
        assert_eq!(i.env["X"], "1");
    }

    #[test]
    fn other_files_are_refused_clearly() {
        let (_d, s) = store();
        let e = upload(&s, b"hello, this is not an image").unwrap_err();
        assert!(e.to_string().contains("not a tar archive"), "{e}");
        // A truncated gzip tarball.
        let t = gzip(&tar_files(&[("big", &[7u8; 100_000])]));
        let e = upload(&s, &t[..t.len() / 2]).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(_)), "{e:?}");
        assert!(s.layers().is_empty(), "nothing half-written is visible");
    }

    /// An OCI layout whose index.json is a link to a host file is refused, not read.
    #[test]
    fn oci_layout_files_are_never_read_through_links() {
        let (_d, s) = store();
        let dir = tempfile::tempdir().unwrap();
        oci_layout(dir.path());
        let secret = tempfile::NamedTempFile::new().unwrap();
        fs::write(secret.path(), br#"{"manifests":[]}"#).unwrap();
        fs::remove_file(dir.path().join("index.json")).unwrap();
        std::os::unix::fs::symlink(secret.path(), dir.path().join("index.json")).unwrap();
        let e = import_dir(&s, dir.path(), "test").unwrap_err();
        assert!(
            matches!(&e, ImageError::Invalid(m) if m.contains("index.json")),
            "{e:?}"
        );
        // A blob that is a link: refused too.
        let dir = tempfile::tempdir().unwrap();
        oci_layout(dir.path());
        let blobs = dir.path().join("blobs/sha256");
        let first = fs::read_dir(&blobs)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        fs::rename(&first, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("moved"), &first).unwrap();
        assert!(import_dir(&s, dir.path(), "test").is_err());
    }

    /// docker save shares identical layers through links inside the archive; those resolve
    /// inside it, and a link out of it finds nothing.
    #[test]
    fn docker_save_links_resolve_inside_the_archive_only() {
        let (_d, s) = store();
        let layer = tar_files(&[("etc/a", b"one")]);
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |path: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, path, data).unwrap();
        };
        add("aaa/layer.tar", &layer);
        add("cfg.json", br#"{"config":{}}"#);
        add(
            "manifest.json",
            br#"[{"Config":"cfg.json","Layers":["aaa/layer.tar","bbb/layer.tar"]}]"#,
        );
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "bbb/layer.tar", "../aaa/layer.tar")
            .unwrap();
        let ok = b.into_inner().unwrap();
        assert_eq!(upload(&s, &ok).unwrap().layers.len(), 2);

        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(13);
        h.set_mode(0o644);
        b.append_data(&mut h, "cfg.json", &br#"{"config":{}}"#[..])
            .unwrap();
        let m = br#"[{"Config":"cfg.json","Layers":["l/layer.tar"]}]"#;
        let mut h = tar::Header::new_gnu();
        h.set_size(m.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "manifest.json", &m[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "l/layer.tar", "/etc/passwd").unwrap();
        let out = b.into_inner().unwrap();
        let e = upload(&s, &out).unwrap_err();
        assert!(matches!(e, ImageError::Invalid(_)), "{e:?}");
    }
}
