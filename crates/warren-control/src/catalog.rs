//! The image catalog: names (`base/python:3.12`) pointing at ordered lists of layers, with
//! defaults for their sandboxes, in the control plane's database. The layers are files in the
//! layer store ([`warren_images::Store`]); a name is written only after all its layers are
//! there, so a name never points at a missing layer.

use std::collections::BTreeMap;

use crate::db::Db;
use warren_images::{ImageError, Store};
use warren_types::api::{Image, ResolvedImage};

/// What a new image is made of.
#[derive(Debug, Clone)]
pub struct NewImage {
    /// Its name.
    pub name: String,
    /// Layer digests, bottom first; each must be in the store.
    pub layers: Vec<String>,
    /// Who makes it.
    pub creator: String,
    /// The project it belongs to.
    pub project: String,
    /// Images it was built on.
    pub parents: Vec<String>,
    /// What it was made from.
    pub source: String,
    /// Default environment.
    pub env: BTreeMap<String, String>,
    /// Default user.
    pub user: Option<String>,
    /// Default working directory.
    pub workdir: Option<String>,
}

impl Default for NewImage {
    fn default() -> NewImage {
        NewImage {
            name: String::new(),
            layers: Vec::new(),
            creator: String::new(),
            project: warren_types::project::root(),
            parents: Vec::new(),
            source: String::new(),
            env: BTreeMap::new(),
            user: None,
            workdir: None,
        }
    }
}

/// What a new name may replace.
#[derive(Debug, Clone, Copy)]
pub enum Replacing<'a> {
    /// Whatever is there.
    Any,
    /// Nothing: the name must be free.
    Nothing,
    /// An image of this project.
    OfProject(&'a str),
}

/// Most names in one image list, and most layers after resolving it.
const MAX_NAMES: usize = 32;
const MAX_LAYERS: usize = 128;

/// The catalog.
#[derive(Debug, Clone)]
pub struct Catalog {
    db: Db,
    /// Held shared by whatever writes layers it will name (an import, a pull, a commit) until
    /// they are named, and exclusively by whatever deletes layers no name uses: a layer
    /// written but not yet named is never taken for an orphan. (One control plane process;
    /// replicas sharing a store would need this in the database.)
    gate: std::sync::Arc<tokio::sync::RwLock<()>>,
}

fn db_err(e: sqlx::Error) -> ImageError {
    ImageError::io("the image catalog", std::io::Error::other(e.to_string()))
}

type Row = (
    String,
    String,
    String,
    i64,
    i64,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

fn from_row(r: Row) -> Image {
    let (name, project, layers, size, created_ms, creator, parents, source, env, user, workdir) = r;
    Image {
        name,
        project,
        layers: serde_json::from_str(&layers).unwrap_or_default(),
        size: size as u64,
        created_at: warren_images::rfc3339(created_ms as u64),
        creator,
        parents: serde_json::from_str(&parents).unwrap_or_default(),
        source,
        env: serde_json::from_str(&env).unwrap_or_default(),
        user,
        workdir,
    }
}

/// The columns, in [`Row`]'s order.
macro_rules! columns {
    () => {
        "name, project, layers, size, created_ms, creator, parents, source, env, user_name, \
         workdir"
    };
}

impl Catalog {
    /// The catalog in `db` (migrated by [`crate::Control::start`]).
    pub fn new(db: Db) -> Catalog {
        Catalog {
            db,
            gate: Default::default(),
        }
    }

    /// Held while layers are written and named (see the field).
    pub async fn writing(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    /// Held while unnamed layers are deleted.
    pub async fn removing(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// Names `new.layers` (replacing an image of the same name). Every layer must be in
    /// `store`.
    pub async fn put(&self, store: &Store, new: NewImage) -> Result<Image, ImageError> {
        self.put_replacing(store, new, Replacing::Any).await
    }

    /// Names `new.layers`, replacing only what `replacing` allows: the caller checked its
    /// rights on the image it saw under the name (none, or one of a project), and a name taken
    /// or moved to another project since then is refused (409), never overwritten.
    pub async fn put_replacing(
        &self,
        store: &Store,
        new: NewImage,
        replacing: Replacing<'_>,
    ) -> Result<Image, ImageError> {
        warren_images::names::check_name(&new.name)?;
        if new.layers.is_empty() {
            return Err(ImageError::Invalid(format!(
                "image {:?} would have no layers",
                new.name
            )));
        }
        let mut size = 0;
        for d in &new.layers {
            size += store.layer(d)?.size;
        }
        macro_rules! insert {
            ($on_conflict:expr) => {
                concat!(
                    "INSERT INTO images (",
                    columns!(),
                    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ",
                    "ON CONFLICT (name) ",
                    $on_conflict
                )
            };
        }
        macro_rules! update {
            () => {
                concat!(
                    "DO UPDATE SET project = excluded.project, ",
                    "layers = excluded.layers, size = excluded.size, ",
                    "created_ms = excluded.created_ms, creator = excluded.creator, ",
                    "parents = excluded.parents, source = excluded.source, env = excluded.env, ",
                    "user_name = excluded.user_name, workdir = excluded.workdir"
                )
            };
        }
        let sql: &'static str = match replacing {
            Replacing::Any => insert!(update!()),
            Replacing::Nothing => insert!("DO NOTHING"),
            Replacing::OfProject(_) => insert!(concat!(update!(), " WHERE images.project = $12")),
        };
        let mut q = sqlx::query(sql)
            .bind(&new.name)
            .bind(&new.project)
            .bind(json(&new.layers))
            .bind(size as i64)
            .bind(warren_images::now_ms() as i64)
            .bind(&new.creator)
            .bind(json(&new.parents))
            .bind(&new.source)
            .bind(json(&new.env))
            .bind(&new.user)
            .bind(&new.workdir);
        if let Replacing::OfProject(p) = replacing {
            q = q.bind(p);
        }
        let done = q.execute(&self.db).await.map_err(db_err)?;
        if done.rows_affected() == 0 {
            return Err(ImageError::Conflict(format!(
                "the name {:?} was taken or changed meanwhile; look again (warren image ls) \
                 and retry",
                new.name
            )));
        }
        self.get(&new.name).await
    }

    /// A named image.
    pub async fn get(&self, name: &str) -> Result<Image, ImageError> {
        warren_images::names::check_name(name)?;
        let row: Option<Row> = sqlx::query_as(concat!(
            "SELECT ",
            columns!(),
            " FROM images WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.db)
        .await
        .map_err(db_err)?;
        row.map(from_row).ok_or_else(|| {
            ImageError::NotFound(format!(
                "image {name:?} not found; `warren image ls` lists the images there are \
                 (besides the built-in `host`), `warren image import` adds one"
            ))
        })
    }

    /// Every named image, by name.
    pub async fn list(&self) -> Result<Vec<Image>, ImageError> {
        let rows: Vec<Row> =
            sqlx::query_as(concat!("SELECT ", columns!(), " FROM images ORDER BY name"))
                .fetch_all(&self.db)
                .await
                .map_err(db_err)?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    /// Removes a name (not its layers).
    pub async fn remove(&self, name: &str) -> Result<(), ImageError> {
        self.get(name).await?;
        sqlx::query("DELETE FROM images WHERE name = $1")
            .bind(name)
            .execute(&self.db)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Resolves an image list for a sandbox of `project`: each image must be that project's
    /// or an ancestor's (images flow down the tree; a sibling's are not there to use). One
    /// that is not is reported as not found (names of other projects' images do not leak).
    pub async fn resolve_for(
        &self,
        spec: &str,
        project: &str,
    ) -> Result<ResolvedImage, ImageError> {
        self.resolve_checked(spec, Some(project)).await
    }

    /// Resolves an image list (`a,b,c`, bottom first): layers bottom first, a layer listed
    /// twice kept once at its upper place; defaults merged, upper images winning.
    pub async fn resolve(&self, spec: &str) -> Result<ResolvedImage, ImageError> {
        self.resolve_checked(spec, None).await
    }

    async fn resolve_checked(
        &self,
        spec: &str,
        project: Option<&str>,
    ) -> Result<ResolvedImage, ImageError> {
        let names: Vec<&str> = spec.split(',').map(str::trim).collect();
        if names.len() > MAX_NAMES {
            return Err(ImageError::Invalid(format!(
                "{} images in one list; at most {MAX_NAMES}",
                names.len()
            )));
        }
        let mut images = Vec::new();
        for name in names {
            let image = self.get(name).await?;
            if let Some(p) = project
                && !warren_types::project::within(p, &image.project)
            {
                return Err(ImageError::NotFound(format!(
                    "image {name:?} not found for project {p}: its sandboxes may use images of \
                     {p} and of the projects above it (`warren image ls` lists those you may \
                     read)"
                )));
            }
            images.push(image);
        }
        let r = merge(images);
        if r.layers.len() > MAX_LAYERS {
            return Err(ImageError::Invalid(format!(
                "{} layers; overlayfs stacks at most {MAX_LAYERS} here",
                r.layers.len()
            )));
        }
        Ok(r)
    }
}

/// Merges images, bottom first.
fn merge(images: Vec<Image>) -> ResolvedImage {
    let mut r = ResolvedImage::default();
    for img in images {
        for d in img.layers {
            r.layers.retain(|x| x != &d);
            r.layers.push(d);
        }
        r.env.extend(img.env);
        if img.user.is_some() {
            r.user = img.user;
        }
        if img.workdir.is_some() {
            r.workdir = img.workdir;
        }
    }
    r
}

/// JSON text of a value, for a column.
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog on each database this machine has (SQLite, and PostgreSQL where installed),
    /// with what keeps it alive.
    async fn catalogs() -> Vec<(impl Sized, Store, Catalog)> {
        let mut out = Vec::new();
        for keep in crate::db::testing::each().await {
            let d = tempfile::tempdir().unwrap();
            let store = Store::open(&d.path().join("store")).unwrap();
            let c = Catalog::new(keep.db.clone());
            out.push(((keep, d), store, c));
        }
        out
    }

    fn layer(store: &Store, marker: &str) -> String {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("etc")).unwrap();
        std::fs::write(src.path().join("etc/marker"), marker).unwrap();
        store
            .add_layer_dir(src.path(), "directory", "test")
            .unwrap()
            .digest
    }

    #[tokio::test]
    async fn names_resolve_bottom_first_with_upper_defaults_winning() {
        for (_keep, store, c) in catalogs().await {
            names_resolve_on(store, c).await;
        }
    }

    async fn names_resolve_on(store: Store, c: Catalog) {
        let (a, b) = (layer(&store, "a"), layer(&store, "b"));
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "1".to_string());
        c.put(
            &store,
            NewImage {
                name: "t/a:1".into(),
                layers: vec![a.clone()],
                source: "directory".into(),
                env,
                user: Some("root".into()),
                ..NewImage::default()
            },
        )
        .await
        .unwrap();
        let img = c
            .put(
                &store,
                NewImage {
                    name: "t/b".into(),
                    layers: vec![b.clone(), a.clone()],
                    source: "directory".into(),
                    user: Some("1000".into()),
                    ..NewImage::default()
                },
            )
            .await
            .unwrap();
        let size = |d: &str| store.layer(d).unwrap().size;
        assert_eq!(img.size, size(&a) + size(&b));
        let r = c.resolve("t/a:1,t/b").await.unwrap();
        assert_eq!(
            r.layers,
            vec![b.clone(), a.clone()],
            "a layer twice counts once, upper"
        );
        assert_eq!(
            r.user.as_deref(),
            Some("1000"),
            "the upper image's user wins"
        );
        assert_eq!(r.env["A"], "1");
        assert!(matches!(
            c.resolve("t/zz").await,
            Err(ImageError::NotFound(_))
        ));
        assert_eq!(c.list().await.unwrap().len(), 2);
        c.remove("t/a:1").await.unwrap();
        assert_eq!(c.list().await.unwrap().len(), 1);
        // A name cannot point at a layer that is not in the store.
        let missing = format!("sha256:{}", "0".repeat(64));
        let e = c
            .put(
                &store,
                NewImage {
                    name: "t/x".into(),
                    layers: vec![missing],
                    ..NewImage::default()
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
        // Naming again replaces (one row, the new layers).
        let img = c
            .put(
                &store,
                NewImage {
                    name: "t/b".into(),
                    layers: vec![a.clone()],
                    source: "directory".into(),
                    ..NewImage::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(img.layers, vec![a.clone()]);
        assert_eq!(img.user, None);
        assert_eq!(c.list().await.unwrap().len(), 1);
        // Images flow down the project tree: root's to all, a project's to it and below.
        assert_eq!(img.project, "root");
        c.put(
            &store,
            NewImage {
                name: "t/job".into(),
                layers: vec![b.clone()],
                project: "root/rl".into(),
                ..NewImage::default()
            },
        )
        .await
        .unwrap();
        for (spec, project, ok) in [
            ("t/b", "root/x", true),
            ("t/job", "root/rl", true),
            ("t/job", "root/rl/job-1", true),
            ("t/b,t/job", "root/rl/job-1", true),
            ("t/job", "root", false),
            ("t/job", "root/rlx", false),
            ("t/b,t/job", "root/other", false),
        ] {
            let r = c.resolve_for(spec, project).await;
            assert_eq!(r.is_ok(), ok, "{spec} for {project}: {r:?}");
            if let Err(e) = r {
                assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
            }
        }
        assert_eq!(c.get("t/job").await.unwrap().project, "root/rl");
        // A name is replaced only as the caller saw it.
        let named = |project: &str| NewImage {
            name: "t/job".into(),
            layers: vec![a.clone()],
            project: project.into(),
            ..NewImage::default()
        };
        for replacing in [Replacing::Nothing, Replacing::OfProject("root/other")] {
            let e = c
                .put_replacing(&store, named("root/other"), replacing)
                .await
                .unwrap_err();
            assert!(matches!(e, ImageError::Conflict(_)), "{e:?}");
        }
        assert_eq!(c.get("t/job").await.unwrap().layers, vec![b.clone()]);
        let img = c
            .put_replacing(&store, named("root/rl/x"), Replacing::OfProject("root/rl"))
            .await
            .unwrap();
        assert_eq!(
            (img.project.as_str(), img.layers),
            ("root/rl/x", vec![a.clone()])
        );
        c.put_replacing(&store, named("root"), Replacing::Nothing)
            .await
            .unwrap_err();
        let fresh = NewImage {
            name: "t/new".into(),
            ..named("root/rl")
        };
        c.put_replacing(&store, fresh, Replacing::Nothing)
            .await
            .unwrap();
    }
}
