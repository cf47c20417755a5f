//! IAM: who this key is, projects, identities, grants, keys and the audit log. A training
//! launcher typically makes a project per job and a key scoped to it:
//!
//! ```no_run
//! # async fn f(admin: &warren_sdk::Client) -> warren_sdk::Result<()> {
//! admin.create_project("root/rl/job-42").await?;
//! let key = admin
//!     .create_key(&warren_sdk::CreateKey {
//!         name: "job-42".into(),
//!         project: Some("root/rl/job-42".into()),
//!         role: Some("runner".into()),
//!         ..Default::default()
//!     })
//!     .await?;
//! let job = warren_sdk::Client::new("http://127.0.0.1:7700", Some(&key.secret))?;
//! # Ok(()) }
//! ```

use reqwest::Method;
use reqwest::Url;
use warren_types::api::{
    ApiKey, ApiKeyList, AuditList, Binding, BindingList, CreateIdentity, CreateKey, CreateProject,
    GrantRequest, Identity, IdentityList, NewApiKey, Project, ProjectList, ProjectQuota, WhoAmI,
};

use crate::client::Client;
use crate::error::{Error, Result};

impl Client {
    fn project_url(&self, path: &str) -> Result<Url> {
        if path.is_empty() {
            return Err(Error::Invalid("project path is empty".into()));
        }
        let mut url = self.endpoint("/v1/projects", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .extend(path.split('/'));
        Ok(url)
    }

    /// The key this client sends: its identity, project and grants (`GET /v1/whoami`).
    pub async fn whoami(&self) -> Result<WhoAmI> {
        self.json(self.request(Method::GET, self.endpoint("/v1/whoami", &[])?))
            .await
    }

    /// Projects the key may see (`GET /v1/projects`).
    pub async fn projects(&self) -> Result<Vec<Project>> {
        let l: ProjectList = self
            .json(self.request(Method::GET, self.endpoint("/v1/projects", &[])?))
            .await?;
        Ok(l.projects)
    }

    /// Creates project `path` under its parent (`POST /v1/projects`).
    pub async fn create_project(&self, path: &str) -> Result<Project> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/projects", &[])?)
            .json(&CreateProject { path: path.into() });
        self.json(rb).await
    }

    /// Deletes project `path`; `force` kills its sandboxes first
    /// (`DELETE /v1/projects/{path}`).
    pub async fn delete_project(&self, path: &str, force: bool) -> Result<()> {
        let mut url = self.project_url(path)?;
        if force {
            url.query_pairs_mut().append_pair("force", "true");
        }
        self.empty(self.request(Method::DELETE, url)).await
    }

    /// Sets project `path`'s quotas (`PUT /v1/projects/{path}`).
    pub async fn set_quota(&self, path: &str, quota: &ProjectQuota) -> Result<()> {
        let rb = self
            .request(Method::PUT, self.project_url(path)?)
            .json(quota);
        self.empty(rb).await
    }

    /// Identities the key manages (`GET /v1/identities`).
    pub async fn identities(&self) -> Result<Vec<Identity>> {
        let l: IdentityList = self
            .json(self.request(Method::GET, self.endpoint("/v1/identities", &[])?))
            .await?;
        Ok(l.identities)
    }

    /// Creates an identity (`POST /v1/identities`).
    pub async fn create_identity(&self, req: &CreateIdentity) -> Result<Identity> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/identities", &[])?)
            .json(req);
        self.json(rb).await
    }

    /// Bindings of the identities the key manages (`GET /v1/bindings`).
    pub async fn bindings(&self) -> Result<Vec<Binding>> {
        let l: BindingList = self
            .json(self.request(Method::GET, self.endpoint("/v1/bindings", &[])?))
            .await?;
        Ok(l.bindings)
    }

    /// Grants `identity` a role or permission on `project`'s subtree (`POST /v1/bindings`).
    pub async fn grant(&self, identity: &str, project: &str, grant: &str) -> Result<Binding> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/bindings", &[])?)
            .json(&GrantRequest {
                identity: identity.into(),
                project: project.into(),
                grant: grant.into(),
            });
        self.json(rb).await
    }

    /// Removes a binding (`DELETE /v1/bindings`).
    pub async fn revoke_grant(&self, identity: &str, project: &str, grant: &str) -> Result<()> {
        let rb = self
            .request(Method::DELETE, self.endpoint("/v1/bindings", &[])?)
            .json(&GrantRequest {
                identity: identity.into(),
                project: project.into(),
                grant: grant.into(),
            });
        self.empty(rb).await
    }

    /// Keys the key manages, never their secrets (`GET /v1/keys`).
    pub async fn keys(&self) -> Result<Vec<ApiKey>> {
        let l: ApiKeyList = self
            .json(self.request(Method::GET, self.endpoint("/v1/keys", &[])?))
            .await?;
        Ok(l.keys)
    }

    /// Makes a key; its secret is in the answer only (`POST /v1/keys`).
    pub async fn create_key(&self, req: &CreateKey) -> Result<NewApiKey> {
        let rb = self
            .request(Method::POST, self.endpoint("/v1/keys", &[])?)
            .json(req);
        self.json(rb).await
    }

    /// Revokes key `id` (`DELETE /v1/keys/{id}`).
    pub async fn revoke_key(&self, id: &str) -> Result<ApiKey> {
        if id.is_empty() {
            return Err(Error::Invalid("key id is empty".into()));
        }
        let mut url = self.endpoint("/v1/keys", &[])?;
        url.path_segments_mut()
            .map_err(|_| Error::Invalid("the base URL cannot take a path".into()))?
            .push(id);
        self.json(self.request(Method::DELETE, url)).await
    }

    /// The audit log, newest first (`GET /v1/audit`).
    pub async fn audit(&self, since_ms: Option<u64>, limit: Option<u64>) -> Result<AuditList> {
        let since = since_ms.map(|s| s.to_string());
        let limit = limit.map(|s| s.to_string());
        let mut q: Vec<(&str, &str)> = Vec::new();
        if let Some(s) = &since {
            q.push(("since_ms", s));
        }
        if let Some(l) = &limit {
            q.push(("limit", l));
        }
        self.json(self.request(Method::GET, self.endpoint("/v1/audit", &q)?))
            .await
    }
}
