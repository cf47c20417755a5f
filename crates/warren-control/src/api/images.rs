//! Images: import, list, inspect, remove, read statistics, and commit (the last step of
//! `warren image build`).
//!
//! The layer store is a directory the control plane and every node see (one machine's
//! `<data-dir>/images`, or a shared file system in a cluster). Imports are written there by the
//! control plane; nodes mount the layers by digest.

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::StatusCode;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use warren_http::{Error, Json, Path, Query};
use warren_images::ImageError;
use warren_types::api::{
    CommitRequest, Gathered, Image, ImageDetail, ImageList, ImageStats, LayerList, LayerUse,
    PruneResult, PullRequest, Sandbox,
};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};

use super::S;
use super::forward::unavailable;
use super::iam::{Source, audited};
use crate::Control;
use crate::catalog::Replacing;
use crate::iam::{Perm, Principal};

type Who = axum::Extension<std::sync::Arc<Principal>>;

/// Whether `who` may read `image`: one of a project where it holds `image.read` or below, or
/// of an ancestor of one (images flow down the tree).
fn readable(who: &Principal, image: &Image) -> bool {
    warren_types::project::image_readable(&who.scope(Perm::ImageRead), &image.project)
}

/// An image `who` may read, else not found (names of other projects' images do not leak).
async fn readable_image(c: &Control, who: &Principal, name: &str) -> Result<Image, Error> {
    let image = c.catalog.get(name).await.map_err(image_error)?;
    if readable(who, &image) {
        Ok(image)
    } else {
        Err(image_error(ImageError::NotFound(format!(
            "image {name:?} not found; `warren image ls` lists the images your key may read"
        ))))
    }
}

fn forbidden(who: &Principal, p: Perm, project: &str, then: &str) -> Error {
    Error(ApiError::new(
        ErrorCode::PermissionDenied,
        format!(
            "identity {} (key {}) does not hold {p} on {project}{then}",
            who.identity, who.key_id
        ),
    ))
}

/// Where an image built under `name` goes (`asked`, else `default`) and which image of that
/// name it may replace: the key must hold `image.build` on the new image's project and on
/// the project of an image it replaces. A name held by an image of a project the key cannot
/// read is a conflict that does not say whose.
async fn build_target(
    c: &Control,
    who: &Principal,
    asked: Option<&str>,
    default: &str,
    name: &str,
) -> Result<(String, Option<String>), Error> {
    let project = asked.unwrap_or(default).to_string();
    warren_types::project::check_path(&project).map_err(|e| Error(ApiError::invalid(e)))?;
    if !who.allows(Perm::ImageBuild, &project) {
        return Err(forbidden(who, Perm::ImageBuild, &project, ""));
    }
    super::project_must_exist(c, &project).await?;
    match c.catalog.get(name).await {
        Ok(old) if who.allows(Perm::ImageBuild, &old.project) => Ok((project, Some(old.project))),
        Ok(old) if readable(who, &old) => Err(forbidden(
            who,
            Perm::ImageBuild,
            &old.project,
            &format!(", whose image {name} that name is: choose another name"),
        )),
        Ok(_) => Err(image_error(ImageError::Conflict(format!(
            "the name {name} is taken by an image of another project: choose another name"
        )))),
        Err(ImageError::NotFound(_)) => Ok((project, None)),
        Err(e) => Err(image_error(e)),
    }
}

fn replacing(old: &Option<String>) -> Replacing<'_> {
    match old {
        Some(p) => Replacing::OfProject(p),
        None => Replacing::Nothing,
    }
}
use crate::fanout::{self, Policy};
use crate::node_api::{CallError, SandboxFilter};

/// The API error for an image error: the image store's one mapping
/// ([`ImageError::code`]), which the nodes use too.
pub fn image_error(e: ImageError) -> Error {
    Error(e.to_api())
}

fn store(c: &Control) -> Result<&warren_images::Store, Error> {
    c.store.as_ref().ok_or_else(|| {
        Error(ApiError::new(
            ErrorCode::Unavailable,
            format!(
                "the image store {} cannot be used (see the log of warren up)",
                c.cfg.image_store().display()
            ),
        ))
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ImageError> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error(ApiError::internal(format!("image task failed: {e}"))))?
        .map_err(image_error)
}

/// `POST /v1/images` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// Name for the image, e.g. `base/python:3.12`.
    #[param(
        pattern = "^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?$",
        max_length = 255
    )]
    pub name: String,
    /// What the upload was made from, when the client knows better than the content shows
    /// (`directory` for a directory the client packed as tar).
    pub source: Option<String>,
    /// Who owns every file of the imported layers: `user` (uid and gid 1000, the sandbox's
    /// default user: for a workspace an agent edits), `root`, or `UID:GID`. Without it the
    /// archive's owners are kept (what a root file system needs). Not for an EROFS file.
    #[param(pattern = "^(user|root|[0-9]{1,10}:[0-9]{1,10})$", max_length = 21)]
    pub owner: Option<String>,
    /// The project the image belongs to (default: the key's); the key needs `image.build`
    /// there. Its sandboxes and those of projects below it may use it.
    #[param(max_length = 1024)]
    pub project: Option<String>,
}

/// Import an image. The body is a tar archive (plain, gzip or zstd) of a root file system, an
/// OCI image layout or a `docker save` archive (as tar), or an EROFS file; the format is found
/// from the content. Each layer of the source becomes a layer in the store; the name then
/// points at them. Nothing is visible under the name until the whole import succeeded.
#[utoipa::path(post, path = "/v1/images", tag = "images", params(ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = ImageDetail),
        (status = 400, description = "Not an image, or an unsafe archive.", body = ErrorBody),
        (status = 404, description = "No such project.", body = ErrorBody),
        (status = 409, description = "The name is another project's image's.", body = ErrorBody),
        (status = 413, description = "Larger than max_image_upload.", body = ErrorBody),
        (status = 503, description = "The image store is full or unusable.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn import(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
    from: Source,
    Query(q): Query<ImportQuery>,
    body: Body,
) -> Result<(StatusCode, Json<ImageDetail>), Error> {
    warren_images::names::check_name(&q.name).map_err(image_error)?;
    let (project, old) =
        build_target(&c, &who, q.project.as_deref(), &who.project, &q.name).await?;
    let owner = q
        .owner
        .as_deref()
        .map(warren_images::store::parse_owner)
        .transpose()
        .map_err(image_error)?;
    let st = store(&c)?.clone();
    let gate = c.catalog.writing().await;
    let tmp = st.tmp().map_err(image_error)?;
    let path = tmp.path().join("upload");
    let max = c.cfg.max_image_upload.bytes();
    let mut f = tokio::fs::File::create(&path)
        .await
        .map_err(|e| image_error(ImageError::io("saving the upload", e)))?;
    let mut stream = body.into_data_stream();
    let mut n: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            Error(ApiError::new(
                ErrorCode::InvalidArgument,
                format!("the upload broke off: {e}"),
            ))
        })?;
        n += chunk.len() as u64;
        if n > max {
            return Err(Error(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "the upload is larger than max_image_upload ({}); raise it in the [control] configuration",
                    c.cfg.max_image_upload
                ),
            )));
        }
        f.write_all(&chunk)
            .await
            .map_err(|e| image_error(ImageError::io("saving the upload", e)))?;
    }
    f.flush()
        .await
        .map_err(|e| image_error(ImageError::io("saving the upload", e)))?;
    drop(f);
    if n == 0 {
        return Err(Error(ApiError::new(
            ErrorCode::InvalidArgument,
            "the upload is empty: send a tar archive, OCI layout, docker save archive or EROFS file",
        )));
    }
    let name = q.name.clone();
    let source_hint = q.source.clone();
    let creator = who.identity.clone();
    let imported = blocking(move || {
        let imported = warren_images::import::import_file_owned(
            &st,
            &path,
            &creator,
            warren_images::unpack::Limits::default(),
            owner,
        )?;
        drop(tmp);
        Ok(imported)
    })
    .await?;
    let source = match (source_hint.as_deref(), imported.source.as_str()) {
        (Some("directory"), "tar") => "directory".to_string(),
        (_, s) => s.to_string(),
    };
    let target = Target {
        who: &who,
        project,
        old,
    };
    let (detail, replaced) = name_imported(&c, name, imported, source, target).await?;
    drop(gate);
    audited(
        &c,
        &who,
        &from,
        "image.import",
        &detail.image.name,
        Some(&detail.image.project),
        Some(&format!("{} layers, {n} bytes", detail.layer_info.len())),
    )
    .await;
    drop_unused(&c, replaced).await;
    tracing::info!(image = %detail.image.name, layers = detail.layer_info.len(), bytes = n, "image imported");
    Ok((StatusCode::CREATED, Json(detail)))
}

/// Names an image (replacing one of the same name); returns it with the layers the name
/// pointed at before that it does not now, for [`drop_unused`].
async fn put_name(
    c: &Control,
    new: crate::catalog::NewImage,
    old_project: &Option<String>,
) -> Result<(Image, Vec<String>), Error> {
    let old = c.catalog.get(&new.name).await.ok();
    let image = c
        .catalog
        .put_replacing(store(c)?, new, replacing(old_project))
        .await
        .map_err(image_error)?;
    let replaced = old
        .map(|o| o.layers)
        .unwrap_or_default()
        .into_iter()
        .filter(|d| !image.layers.contains(d))
        .collect();
    Ok((image, replaced))
}

/// Deletes those of `digests` that no image names and no sandbox runs on: what re-importing
/// or re-committing a name left behind. Best effort: when a node does not answer (so who
/// uses them is unknown) they stay, orphans that `GET /v1/layers?orphans=true` lists and
/// `POST /v1/layers/prune` removes.
async fn drop_unused(c: &Control, digests: Vec<String>) {
    if digests.is_empty() {
        return;
    }
    let Ok(st) = store(c).cloned() else {
        return;
    };
    let _removing = c.catalog.removing().await;
    let sandboxes = match all_sandboxes(c, "removing layers a new image replaced").await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("replaced layers kept as orphans: {}", e.0.message);
            return;
        }
    };
    let Ok(images) = c.catalog.list().await else {
        return;
    };
    let used: BTreeSet<String> = images
        .into_iter()
        .flat_map(|i| i.layers)
        .chain(sandboxes.into_iter().flat_map(|s| s.layers))
        .collect();
    let gone: Vec<String> = digests.into_iter().filter(|d| !used.contains(d)).collect();
    let r = blocking(move || {
        for d in &gone {
            st.remove_layer(d)?;
            tracing::info!(layer = %d, "removed a layer its image no longer names");
        }
        Ok(())
    })
    .await;
    if let Err(e) = r {
        tracing::warn!("removing replaced layers: {}", e.0.message);
    }
}

/// Who builds an image, into which project, replacing which project's image of its name.
struct Target<'a> {
    who: &'a Principal,
    project: String,
    old: Option<String>,
}

/// Names the layers an import or a pull made, in the catalog; also returns the layers the
/// name pointed at before that it does not now.
async fn name_imported(
    c: &Control,
    name: String,
    imported: warren_images::import::Imported,
    source: String,
    to: Target<'_>,
) -> Result<(ImageDetail, Vec<String>), Error> {
    let (image, replaced) = put_name(
        c,
        crate::catalog::NewImage {
            name,
            layers: imported.layers.iter().map(|l| l.digest.clone()).collect(),
            creator: to.who.identity.clone(),
            project: to.project,
            parents: Vec::new(),
            source,
            env: imported.env,
            user: imported.user,
            workdir: imported.workdir,
        },
        &to.old,
    )
    .await?;
    Ok((
        ImageDetail {
            image,
            layer_info: imported.layers,
        },
        replaced,
    ))
}

/// List named images.
#[utoipa::path(get, path = "/v1/images", tag = "images",
    responses((status = 200, body = ImageList)), security(("api_key" = [])))]
pub async fn list(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
) -> Result<Json<ImageList>, Error> {
    let mut images = c.catalog.list().await.map_err(image_error)?;
    images.retain(|i| readable(&who, i));
    Ok(Json(ImageList { images }))
}

/// An image with its layers.
#[utoipa::path(get, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path, description = "Image name (may contain `/`).", pattern = "^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?$", max_length = 255)),
    responses((status = 200, body = ImageDetail), (status = 404, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
    Path(name): Path<String>,
) -> Result<Json<ImageDetail>, Error> {
    let image = readable_image(&c, &who, &name).await?;
    let st = store(&c)?.clone();
    let digests = image.layers.clone();
    let layer_info = blocking(move || digests.iter().map(|d| st.layer(d)).collect()).await?;
    Ok(Json(ImageDetail { image, layer_info }))
}

/// Every sandbox on every node (to know who uses what). A node that does not answer makes
/// the answer unknowable, so it fails the call: `what` says what needed it.
async fn all_sandboxes(c: &Control, what: &str) -> Result<Vec<Sandbox>, Error> {
    let filter = &SandboxFilter::default();
    let parts = fanout::ask(
        c.nodes.all(),
        |n| async move { n.api().sandboxes(filter).await },
    )
    .await
    .under(Policy::AllOrFail, what)?;
    Ok(parts.answer.into_iter().flat_map(|l| l.sandboxes).collect())
}

/// Remove an image name (`base/python:3.12`) or a layer (`sha256:…`). An image that running
/// sandboxes were made from, or a layer that a sandbox or another image uses, is refused with
/// the list of users. Removing a name also deletes its layers that nothing else uses.
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images",
    params(("name" = String, Path, description = "Image name, or a layer digest.", pattern = "^([a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*([:@][A-Za-z0-9._-]{1,128})?|sha256:[0-9a-f]{64})$", max_length = 255)),
    responses((status = 204, description = "Removed."), (status = 404, body = ErrorBody),
        (status = 409, description = "In use: the message lists the users.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn remove(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
    from: Source,
    Path(name): Path<String>,
) -> Result<StatusCode, Error> {
    // A layer is anyone's to use: removing one by digest is the cluster's (root's) to do. An
    // image is its project's.
    let project = if name.starts_with("sha256:") {
        if !who.allows(Perm::ImageDelete, warren_types::project::ROOT) {
            return Err(forbidden(
                &who,
                Perm::ImageDelete,
                warren_types::project::ROOT,
                " (layers are removed cluster-wide): remove the image that names it instead",
            ));
        }
        warren_types::project::root()
    } else {
        let image = readable_image(&c, &who, &name).await?;
        if !who.allows(Perm::ImageDelete, &image.project) {
            return Err(forbidden(&who, Perm::ImageDelete, &image.project, ""));
        }
        image.project
    };
    let st = store(&c)?.clone();
    let _removing = c.catalog.removing().await;
    // The nodes' view of who uses which layer; a node that does not answer makes the answer
    // unknowable, so the removal is refused rather than risked.
    let sandboxes =
        all_sandboxes(&c, &format!("removing {name} (to know no sandbox uses it)")).await?;
    let images = c.catalog.list().await.map_err(image_error)?;
    if name.starts_with("sha256:") {
        let mut users: Vec<String> = images
            .iter()
            .filter(|i| i.layers.contains(&name))
            .map(|i| format!("image {}", i.name))
            .collect();
        users.extend(
            sandboxes
                .iter()
                .filter(|s| s.layers.contains(&name))
                .map(|s| format!("sandbox {}", s.id)),
        );
        if !users.is_empty() {
            return Err(image_error(ImageError::Conflict(format!(
                "layer {name} is in use by {}; remove those first",
                users.join(", ")
            ))));
        }
        let digest = name.clone();
        blocking(move || {
            st.layer(&digest)?;
            st.remove_layer(&digest)
        })
        .await?;
        audited(&c, &who, &from, "layer.remove", &name, Some(&project), None).await;
        return Ok(StatusCode::NO_CONTENT);
    }
    let image = c.catalog.get(&name).await.map_err(image_error)?;
    if image.project != project {
        return Err(image_error(ImageError::Conflict(format!(
            "image {name} changed meanwhile; look again (warren image ls) and retry"
        ))));
    }
    let users: Vec<String> = sandboxes
        .iter()
        .filter(|s| s.image.split(',').any(|n| n.trim() == name))
        .map(|s| s.id.to_string())
        .collect();
    if !users.is_empty() {
        return Err(image_error(ImageError::Conflict(format!(
            "image {name} is in use by running sandboxes {}; kill them first",
            users.join(", ")
        ))));
    }
    c.catalog.remove(&name).await.map_err(image_error)?;
    // Its layers that no other image and no sandbox uses go too.
    let still: BTreeSet<String> = images
        .iter()
        .filter(|i| i.name != name)
        .flat_map(|i| i.layers.iter().cloned())
        .chain(sandboxes.iter().flat_map(|s| s.layers.iter().cloned()))
        .collect();
    blocking(move || {
        for d in image.layers.iter().filter(|d| !still.contains(*d)) {
            st.remove_layer(d)?;
        }
        Ok(())
    })
    .await?;
    audited(&c, &who, &from, "image.delete", &name, Some(&project), None).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/layers` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LayersQuery {
    /// Only orphans: layers no image names (a sandbox may still run on one).
    #[serde(default)]
    pub orphans: bool,
}

/// Every layer in the store with the images that name it; `orphans=true` keeps only those no
/// image names (left by an interrupted import, or by a name replaced while a node was away).
#[utoipa::path(get, path = "/v1/layers", tag = "images", params(LayersQuery),
    responses((status = 200, body = LayerList), (status = 503, body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn layers(
    axum::extract::State(c): S,
    Query(q): Query<LayersQuery>,
) -> Result<Json<LayerList>, Error> {
    let st = store(&c)?.clone();
    let images = c.catalog.list().await.map_err(image_error)?;
    let all = blocking(move || Ok(st.layers())).await?;
    let layers = all
        .into_iter()
        .map(|layer| LayerUse {
            images: images
                .iter()
                .filter(|i| i.layers.contains(&layer.digest))
                .map(|i| i.name.clone())
                .collect(),
            layer,
        })
        .filter(|u| !q.orphans || u.images.is_empty())
        .collect();
    Ok(Json(LayerList { layers }))
}

/// Delete every orphan layer (one no image names) that no sandbox runs on. Every node must
/// answer, so that no layer in use is deleted; imports, pulls and commits in progress finish
/// first, so their layers are named before this looks.
#[utoipa::path(post, path = "/v1/layers/prune", tag = "images",
    responses((status = 200, body = PruneResult),
        (status = 503, description = "A node did not answer, or the store is unusable.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn prune(axum::extract::State(c): S) -> Result<Json<PruneResult>, Error> {
    let st = store(&c)?.clone();
    let _removing = c.catalog.removing().await;
    let sandboxes = all_sandboxes(&c, "pruning layers (to know no sandbox uses them)").await?;
    let named: BTreeSet<String> = c
        .catalog
        .list()
        .await
        .map_err(image_error)?
        .into_iter()
        .flat_map(|i| i.layers)
        .collect();
    let r = blocking(move || {
        let mut out = PruneResult {
            removed: Vec::new(),
            freed: 0,
            kept: Vec::new(),
        };
        for l in st
            .layers()
            .into_iter()
            .filter(|l| !named.contains(&l.digest))
        {
            let users: Vec<&str> = sandboxes
                .iter()
                .filter(|s| s.layers.contains(&l.digest))
                .map(|s| s.id.as_str())
                .collect();
            if users.is_empty() {
                st.remove_layer(&l.digest)?;
                out.freed += l.size;
                out.removed.push(l);
            } else {
                out.kept
                    .push(format!("{} ({})", l.digest, users.join(", ")));
            }
        }
        Ok(out)
    })
    .await?;
    tracing::info!(
        removed = r.removed.len(),
        freed = r.freed,
        "pruned orphan layers"
    );
    Ok(Json(r))
}

/// How much of each mounted layer has been read, per node, and how much each sandbox made from
/// layered images has read: the share of an image a sandbox really uses. A node that does not
/// answer is named in `unreachable`, and when no node answers the call fails with 503.
#[utoipa::path(get, path = "/v1/images/stats", tag = "images",
    responses((status = 200, body = Gathered<ImageStats>),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn stats(axum::extract::State(c): S) -> Result<Json<Gathered<ImageStats>>, Error> {
    let parts = fanout::ask(
        c.nodes.all(),
        |n| async move { n.api().image_stats().await },
    )
    .await
    .under(Policy::Partial, "gathering image statistics")?;
    let mut out = ImageStats {
        layers: Vec::new(),
        sandboxes: Vec::new(),
    };
    for s in parts.answer {
        out.layers.extend(s.layers);
        out.sandboxes.extend(s.sandboxes);
    }
    Ok(Json(Gathered {
        answer: out,
        unreachable: parts.unreachable,
    }))
}

/// Turn a sandbox's changes into a new layer: the image `name` is the sandbox's layers plus
/// the new one. The sandbox is frozen while its writable layer is read, then resumed. Only
/// sandboxes made from imported images can be committed (not `host`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/commit", tag = "images",
    params(("id" = String, Path, description = "Sandbox id.")),
    request_body = CommitRequest,
    responses((status = 201, body = Image), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The name is another project's image's.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn commit(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
    from: Source,
    Path(id): Path<String>,
    Json(req): Json<CommitRequest>,
) -> Result<(StatusCode, Json<Image>), Error> {
    warren_images::names::check_name(&req.name).map_err(image_error)?;
    let (id, node) = super::forward::route(&c, &id)?;
    // Only a sandbox the key may read files of (a commit is a copy of its files).
    let files = who.scope(crate::iam::Perm::SandboxFiles).join(",");
    let visible = who.scope(Perm::SandboxRead).join(",");
    let sb = node
        .api()
        .sandbox_scoped(&id, &files, &visible)
        .await
        .map_err(|e| one(&node, e))?;
    let (project, old) =
        build_target(&c, &who, req.project.as_deref(), &sb.project, &req.name).await?;
    let gate = c.catalog.writing().await;
    let layer = node
        .api()
        .commit_scoped(&id, &who.identity, &files, &visible)
        .await
        .map_err(|e| one(&node, e))?;
    // The new image keeps the defaults of the images it was built on.
    let base = c.catalog.resolve(&sb.image).await.unwrap_or_default();
    let mut layers = sb.layers.clone();
    layers.push(layer.digest);
    let (image, replaced) = put_name(
        &c,
        crate::catalog::NewImage {
            name: req.name,
            layers,
            creator: who.identity.clone(),
            project,
            parents: sb.image.split(',').map(|s| s.trim().to_string()).collect(),
            source: "build".into(),
            env: base.env,
            user: base.user,
            workdir: base.workdir,
        },
        &old,
    )
    .await?;
    drop(gate);
    audited(
        &c,
        &who,
        &from,
        "image.commit",
        &image.name,
        Some(&image.project),
        Some(&format!("from sandbox {id}")),
    )
    .await;
    drop_unused(&c, replaced).await;
    Ok((StatusCode::CREATED, Json(image)))
}

/// A single node's failure as the caller sees it: its own error passes through as it is.
fn one(node: &crate::nodes::NodeEntry, e: CallError) -> Error {
    match e {
        CallError::Refused(e) => Error(e),
        CallError::Unreachable(why) => unavailable(node, &why),
    }
}

/// Pull an image from an OCI registry (`docker.io/library/python:3.12`): its manifest for this
/// machine's platform, its config and its layers (digests checked) become layers in the store,
/// exactly as an import of the same image as an OCI layout would.
#[utoipa::path(post, path = "/v1/images/pull", tag = "images",
    request_body = PullRequest,
    responses((status = 201, body = ImageDetail),
        (status = 400, description = "A bad reference or name.", body = ErrorBody),
        (status = 403, description = "The key does not hold the permission this needs there (the message names it); `insecure` from a key that is not the administrator's, or a registry, token service or redirect at a private, loopback, link-local or metadata address (see `[control] registry_exempt`).", body = ErrorBody),
        (status = 404, description = "No such project.", body = ErrorBody),
        (status = 409, description = "The name is another project's image's.", body = ErrorBody),
        (status = 413, description = "The image is larger than max_image_upload, or a blob longer than its manifest says.", body = ErrorBody),
        (status = 503, description = "The registry failed or refused: its status and what to check, never its answer's body.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn pull(
    axum::extract::State(c): S,
    axum::Extension(who): Who,
    from: Source,
    Json(req): Json<PullRequest>,
) -> Result<(StatusCode, Json<ImageDetail>), Error> {
    use crate::registry::{PullError, Registry};
    let bad = |m: String| Error(ApiError::new(ErrorCode::InvalidArgument, m));
    let reference: oci_client::Reference = req.reference.parse().map_err(|e| {
        bad(format!(
            "{:?} is not an image reference ({e}); e.g. docker.io/library/python:3.12",
            req.reference
        ))
    })?;
    let name = match &req.name {
        Some(n) => n.clone(),
        None => match (reference.tag(), reference.digest()) {
            (Some(t), _) => format!("{}:{t}", reference.repository()),
            (None, Some(d)) => format!(
                "{}@{}",
                reference.repository(),
                d.trim_start_matches("sha256:")
                    .chars()
                    .take(12)
                    .collect::<String>()
            ),
            (None, None) => format!("{}:latest", reference.repository()),
        },
    };
    warren_images::names::check_name(&name).map_err(|e| {
        bad(format!(
            "{e} (the name comes from the reference: give one with `name`)"
        ))
    })?;
    let (project, old) =
        build_target(&c, &who, req.project.as_deref(), &who.project, &name).await?;
    let basic = match (&req.username, &req.password) {
        (Some(u), Some(p)) => Some((u.clone(), p.clone())),
        (None, None) => None,
        _ => return Err(bad("give both username and password, or neither".into())),
    };
    // Plain HTTP reaches whatever answers on a port; it is the administrator's to use.
    if req.insecure && !who.allows(crate::iam::Perm::ClusterAdmin, crate::iam::model::ROOT) {
        return Err(Error(ApiError::new(
            ErrorCode::PermissionDenied,
            "`insecure` (plain HTTP to the registry) is for the administrator only: pull over \
             HTTPS, or ask an administrator to pull the image",
        )));
    }
    let mut denied = c
        .cfg
        .registry_denied()
        .map_err(|e| Error(ApiError::internal(e)))?;
    // The cluster's own machines (its nodes, its database), whatever `registry_exempt` opens:
    // a registry name must not lead a pull to a node's API or a kubelet beside it.
    denied.pin(
        crate::cluster::cluster_addresses(&c)
            .await
            .into_iter()
            .map(|a| warren_types::net::Cidr {
                addr: a,
                prefix: if a.is_ipv4() { 32 } else { 128 },
            }),
    );
    let registry = |e: PullError| {
        Error(match e {
            PullError::Internal(m) => ApiError::new(
                ErrorCode::PermissionDenied,
                format!("pulling {}: {m}", req.reference),
            ),
            PullError::Remote(m) => ApiError::new(
                ErrorCode::Unavailable,
                format!("pulling {}: {m}", req.reference),
            ),
            PullError::Write(e) => ApiError::new(
                ErrorCode::Unavailable,
                format!("pulling {}: {e}", req.reference),
            ),
        })
    };
    let mut client = Registry::new(reference, denied, req.insecure, basic).map_err(registry)?;
    let (manifest, config) = client.manifest_and_config().await.map_err(registry)?;

    // Lay the image out as an OCI image layout in the store's tmp, then import that.
    let st = store(&c)?.clone();
    let gate = c.catalog.writing().await;
    let tmp = st.tmp().map_err(image_error)?;
    let blobs = tmp.path().join("blobs/sha256");
    let io = |e: std::io::Error| image_error(ImageError::io("writing the pulled image", e));
    tokio::fs::create_dir_all(&blobs).await.map_err(io)?;
    let blob_path = |d: &str| -> Result<std::path::PathBuf, Error> {
        let hex = warren_images::names::check_digest(d).map_err(image_error)?;
        Ok(blobs.join(hex))
    };
    tokio::fs::write(blob_path(&manifest.config.digest)?, config.as_bytes())
        .await
        .map_err(io)?;
    // Pulled bytes are bounded like an upload (max_image_upload, all blobs together), and no
    // blob may be longer than its manifest says.
    let max = c.cfg.max_image_upload.bytes();
    let too_large = || {
        Error(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "{} is larger than max_image_upload ({}); raise it in the [control] configuration",
                req.reference, c.cfg.max_image_upload
            ),
        ))
    };
    let declared = manifest
        .layers
        .iter()
        .try_fold(config.len() as u64, |n, l| {
            n.checked_add(l.size.max(0) as u64)
        });
    if declared.is_none_or(|n| n > max) {
        return Err(too_large());
    }
    let mut left = max - config.len() as u64;
    for layer in &manifest.layers {
        let path = blob_path(&layer.digest)?;
        let f = tokio::fs::File::create(&path).await.map_err(io)?;
        let cap = if layer.size > 0 {
            (layer.size as u64).min(left)
        } else {
            left
        };
        let mut w = Capped::new(f, cap);
        let r = client.blob(&layer.digest, &mut w, None).await;
        if w.over {
            return Err(too_large());
        }
        r.map_err(registry)?;
        w.inner.flush().await.map_err(io)?;
        left -= w.written;
    }
    let manifest_bytes = serde_json::to_vec(&manifest)
        .map_err(|e| Error(ApiError::internal(format!("manifest: {e}"))))?;
    let manifest_digest = {
        use sha2::Digest as _;
        format!("sha256:{:x}", sha2::Sha256::digest(&manifest_bytes))
    };
    tokio::fs::write(blob_path(&manifest_digest)?, &manifest_bytes)
        .await
        .map_err(io)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_bytes.len(),
        }],
    });
    tokio::fs::write(tmp.path().join("index.json"), index.to_string())
        .await
        .map_err(io)?;
    tokio::fs::write(
        tmp.path().join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .await
    .map_err(io)?;
    let source = req.reference.clone();
    let creator = who.identity.clone();
    let imported = blocking(move || {
        let imported = warren_images::import::import_dir(&st, tmp.path(), &creator)?;
        drop(tmp);
        Ok(imported)
    })
    .await?;
    let target = Target {
        who: &who,
        project,
        old,
    };
    let (detail, replaced) =
        name_imported(&c, name, imported, format!("pull {source}"), target).await?;
    drop(gate);
    audited(
        &c,
        &who,
        &from,
        "image.pull",
        &detail.image.name,
        Some(&detail.image.project),
        Some(&format!("from {}", req.reference)),
    )
    .await;
    drop_unused(&c, replaced).await;
    tracing::info!(image = %detail.image.name, reference = %req.reference, "image pulled");
    Ok((StatusCode::CREATED, Json(detail)))
}

/// A writer that refuses to grow past `cap` bytes (and says so in `over`).
struct Capped<W> {
    inner: W,
    cap: u64,
    written: u64,
    over: bool,
}

impl<W> Capped<W> {
    fn new(inner: W, cap: u64) -> Self {
        Capped {
            inner,
            cap,
            written: 0,
            over: false,
        }
    }
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.written.saturating_add(buf.len() as u64) > self.cap {
            self.over = true;
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "the blob is larger than allowed",
            )));
        }
        let me = &mut *self;
        let r = std::pin::Pin::new(&mut me.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = &r {
            me.written += *n as u64;
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
