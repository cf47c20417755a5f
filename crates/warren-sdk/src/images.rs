//! Images: import, list, inspect, remove, read statistics, and commit a sandbox as a layer.

use reqwest::Method;
use warren_types::api::{
    CommitRequest, Gathered, Image, ImageDetail, ImageList, ImageStats, LayerList, LayerUse,
    PruneResult, PullRequest,
};

use crate::error::{Error, Result};
use crate::{Client, Sandbox};

/// How an image is imported ([`Client::import_image_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportOptions<'a> {
    /// What the client packed (`directory`), when the content does not show it.
    pub source: Option<&'a str>,
    /// Who owns every file: `user`, `root` or `UID:GID`; default: the archive's owners.
    pub owner: Option<&'a str>,
    /// The project the image belongs to; default: the key's.
    pub project: Option<&'a str>,
}

impl Client {
    /// The address of `/v1/images/<name>`, the name's `/` kept as path separators.
    fn image_url(&self, name: &str) -> Result<reqwest::Url> {
        if name.is_empty() {
            return Err(Error::Invalid("image name is empty".into()));
        }
        let mut url = self.endpoint("/v1/images", &[])?;
        {
            let mut seg = url
                .path_segments_mut()
                .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?;
            for part in name.split('/') {
                seg.push(part);
            }
        }
        Ok(url)
    }

    /// Imports an image under `name` (`POST /v1/images`) from `body`: a tar archive (plain,
    /// gzip or zstd) of a root file system, an OCI image layout or `docker save` archive as
    /// tar, or an EROFS file. `source` labels what the client packed (`directory`).
    pub async fn import_image(
        &self,
        name: &str,
        body: reqwest::Body,
        source: Option<&str>,
    ) -> Result<ImageDetail> {
        self.import_image_owned(name, body, source, None).await
    }

    /// [`Client::import_image`], every file of the new layers owned by `owner`: `user` (uid
    /// 1000, the sandbox's default user: a workspace an agent edits), `root`, or `UID:GID`.
    /// Without it the archive's owners are kept.
    pub async fn import_image_owned(
        &self,
        name: &str,
        body: reqwest::Body,
        source: Option<&str>,
        owner: Option<&str>,
    ) -> Result<ImageDetail> {
        let opts = ImportOptions {
            source,
            owner,
            project: None,
        };
        self.import_image_with(name, body, &opts).await
    }

    /// [`Client::import_image`] with every option: what the client packed, who owns the
    /// files, and the project the image belongs to (default: the key's; its sandboxes and
    /// those of projects below it may use the image).
    pub async fn import_image_with(
        &self,
        name: &str,
        body: reqwest::Body,
        opts: &ImportOptions<'_>,
    ) -> Result<ImageDetail> {
        let mut query = vec![("name", name)];
        if let Some(s) = opts.source {
            query.push(("source", s));
        }
        if let Some(o) = opts.owner {
            query.push(("owner", o));
        }
        if let Some(p) = opts.project {
            query.push(("project", p));
        }
        let rb = self
            .request(Method::POST, self.endpoint("/v1/images", &query)?)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.json(rb).await
    }

    /// Layers in the store with the images that name them (`GET /v1/layers`); with `orphans`
    /// only those no image names.
    pub async fn layers(&self, orphans: bool) -> Result<Vec<LayerUse>> {
        let q: &[(&str, &str)] = if orphans { &[("orphans", "true")] } else { &[] };
        let rb = self.request(Method::GET, self.endpoint("/v1/layers", q)?);
        let list: LayerList = self.json(rb).await?;
        Ok(list.layers)
    }

    /// Deletes every layer no image names and no sandbox runs on (`POST /v1/layers/prune`).
    pub async fn prune_layers(&self) -> Result<PruneResult> {
        let rb = self.request(Method::POST, self.endpoint("/v1/layers/prune", &[])?);
        self.json(rb).await
    }

    /// Pulls an image from an OCI registry into the store (`POST /v1/images/pull`).
    pub async fn pull_image(&self, req: &PullRequest) -> Result<ImageDetail> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/images/pull", &[])?)
            .json(req);
        self.json(rb).await
    }

    /// Named images (`GET /v1/images`), by name.
    pub async fn images(&self) -> Result<Vec<Image>> {
        let rb = self.request(Method::GET, self.endpoint("/v1/images", &[])?);
        let list: ImageList = self.json(rb).await?;
        Ok(list.images)
    }

    /// One image with its layers (`GET /v1/images/{name}`).
    pub async fn image(&self, name: &str) -> Result<ImageDetail> {
        let rb = self.request(Method::GET, self.image_url(name)?);
        self.json(rb).await
    }

    /// Removes an image name, or a layer by digest (`DELETE /v1/images/{name}`). Refused
    /// (conflict) while something uses it.
    pub async fn remove_image(&self, name: &str) -> Result<()> {
        let rb = self.request(Method::DELETE, self.image_url(name)?);
        self.empty(rb).await
    }

    /// How much of the mounted layers has been read, per node and per sandbox
    /// (`GET /v1/images/stats`); a node that did not answer is named in
    /// [`Gathered::unreachable`].
    pub async fn image_stats(&self) -> Result<Gathered<ImageStats>> {
        let rb = self.request(Method::GET, self.endpoint("/v1/images/stats", &[])?);
        self.json(rb).await
    }
}

impl Sandbox {
    /// Makes the sandbox's changes a new layer on top of its image, named `name`
    /// (`POST /v1/sandboxes/{id}/commit`). The sandbox must be made from imported images.
    pub async fn commit(&self, name: &str) -> Result<Image> {
        self.commit_in(name, None).await
    }

    /// [`Sandbox::commit`] into `project` (default: the sandbox's); the key needs
    /// `image.build` there.
    pub async fn commit_in(&self, name: &str, project: Option<&str>) -> Result<Image> {
        let rb = self
            .client()
            .request(Method::POST, self.endpoint("/commit", &[])?)
            .json(&CommitRequest {
                name: name.into(),
                project: project.map(str::to_string),
            });
        self.client().json(rb).await
    }
}
