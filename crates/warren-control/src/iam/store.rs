//! IAM in the database: projects, identities, bindings, keys and the audit log, each change
//! in one transaction with its audit record and a bump of `iam_version` (so every replica
//! drops its cache), and every change checked against the actor's own grants — bounded
//! delegation: an actor creates child projects only where it holds `project.admin`, and
//! identities, keys and bindings only where it holds `iam.delegate`, of permissions it holds
//! there itself.

use sqlx::Row;
use warren_types::error::{ApiError, ErrorCode};

use super::model::{
    self, Perm, Perms, Principal, ROOT, check_identity, check_path, grant_perms, within,
};
use crate::db::Db;

/// Why an IAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IamError {
    /// Bad input: the message says which.
    #[error("{0}")]
    Invalid(String),
    /// No such object (or not one the actor may see).
    #[error("{0}")]
    NotFound(String),
    /// The actor may not.
    #[error("{0}")]
    Forbidden(String),
    /// It exists, or something still depends on it.
    #[error("{0}")]
    Conflict(String),
    /// The database.
    #[error("the IAM database does not answer: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<IamError> for ApiError {
    fn from(e: IamError) -> ApiError {
        let code = match &e {
            IamError::Invalid(_) => ErrorCode::InvalidArgument,
            IamError::NotFound(_) => ErrorCode::NotFound,
            IamError::Forbidden(_) => ErrorCode::PermissionDenied,
            IamError::Conflict(_) => ErrorCode::Conflict,
            IamError::Db(_) => ErrorCode::Unavailable,
        };
        ApiError::new(code, e.to_string())
    }
}

type Result<T> = std::result::Result<T, IamError>;

/// Who acts, and from where (for the audit log).
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// Its principal.
    pub who: &'a Principal,
    /// The client's address.
    pub source: Option<&'a str>,
}

/// A project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectRow {
    /// Its path.
    pub path: String,
    /// When it was made, ms since the epoch.
    pub created_ms: i64,
    /// Which identity made it.
    pub created_by: String,
    /// Its quotas.
    pub quota: Quota,
}

/// A project's limits (none: no limit of its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Most sandboxes at once.
    pub max_sandboxes: Option<i64>,
    /// Most CPU requested, millicores.
    pub max_cpu: Option<i64>,
    /// Most memory requested, bytes.
    pub max_memory: Option<i64>,
    /// Most function calls in flight at once.
    pub max_fncalls: Option<i64>,
}

/// An identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityRow {
    /// Its name.
    pub name: String,
    /// `user` or `service`.
    pub kind: String,
    /// The project it was made in.
    pub project: String,
    /// When, ms since the epoch.
    pub created_ms: i64,
    /// By whom.
    pub created_by: String,
}

/// A binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    /// Whose.
    pub identity: String,
    /// Where (its subtree).
    pub project: String,
    /// A role or a permission.
    pub grant: String,
    /// When, ms since the epoch.
    pub created_ms: i64,
    /// By whom.
    pub created_by: String,
}

/// A key, never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// Its id (`key_` + 12 hex characters of its hash).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The identity it acts as.
    pub identity: String,
    /// The subtree it acts in.
    pub project: String,
    /// Its role (or permission).
    pub role: String,
    /// When, ms since the epoch.
    pub created_ms: i64,
    /// By whom.
    pub created_by: String,
    /// When it expires.
    pub expires_ms: Option<i64>,
    /// When it was revoked.
    pub revoked_ms: Option<i64>,
    /// When it was last used (to within a minute).
    pub last_used_ms: Option<i64>,
}

/// An audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Its number.
    pub id: i64,
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// With which key.
    pub key_id: Option<String>,
    /// What (`key.create`, ...).
    pub action: String,
    /// On what.
    pub target: String,
    /// In which project.
    pub project: Option<String>,
    /// From where.
    pub source: Option<String>,
    /// More.
    pub detail: Option<String>,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn need(actor: &Actor, p: Perm, project: &str) -> Result<()> {
    if actor.who.allows(p, project) {
        Ok(())
    } else {
        Err(IamError::Forbidden(format!(
            "identity {} (key {}) does not hold {p} on {project}",
            actor.who.identity, actor.who.key_id
        )))
    }
}

/// Whether the actor may see `project` at all (holds anything on it or below it).
fn sees(actor: &Actor, project: &str) -> bool {
    actor
        .who
        .grants
        .iter()
        .any(|(g, _)| within(project, g) || within(g, project))
}

type Tx<'c> = sqlx::Transaction<'c, sqlx::Any>;

async fn audit(
    tx: &mut Tx<'_>,
    actor: &Actor<'_>,
    action: &str,
    target: &str,
    project: Option<&str>,
    detail: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO audit (at_ms, actor, key_id, action, target, project, source, detail) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(now_ms())
    .bind(&actor.who.identity)
    .bind(&actor.who.key_id)
    .bind(action)
    .bind(target)
    .bind(project)
    .bind(actor.source)
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records an action taken outside IAM (an image built or deleted, a network policy
/// changed) in the audit log.
pub async fn record(
    db: &Db,
    actor: Actor<'_>,
    action: &str,
    target: &str,
    project: Option<&str>,
    detail: Option<&str>,
) -> Result<()> {
    let mut tx = crate::db::begin_write(db).await?;
    audit(&mut tx, &actor, action, target, project, detail).await?;
    tx.commit().await?;
    Ok(())
}

async fn bump(tx: &mut Tx<'_>) -> Result<()> {
    sqlx::query("UPDATE iam_version SET version = version + 1 WHERE id = 1")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The current IAM version (bumped by every change).
pub async fn version(db: &Db) -> Result<i64> {
    let (v,): (i64,) = sqlx::query_as("SELECT version FROM iam_version WHERE id = 1")
        .fetch_one(db)
        .await?;
    Ok(v)
}

async fn project_exists(tx: &mut Tx<'_>, path: &str) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM projects WHERE path = $1")
        .bind(path)
        .fetch_optional(&mut **tx)
        .await?
        .is_some())
}

/// Creates project `path` under its parent, which must exist; the actor needs
/// `project.admin` on the parent.
pub async fn create_project(db: &Db, actor: Actor<'_>, path: &str) -> Result<ProjectRow> {
    check_path(path).map_err(IamError::Invalid)?;
    if model::parent(path).is_none() {
        return Err(IamError::Conflict("the root project always exists".into()));
    }
    let mut tx = crate::db::begin_write(db).await?;
    // Missing ancestors are made too (as `mkdir -p` does), each only where the actor holds
    // project.admin on its parent; all of them or none.
    let mut missing = vec![path];
    let mut up = model::parent(path);
    while let Some(p) = up {
        if project_exists(&mut tx, p).await? {
            break;
        }
        missing.push(p);
        up = model::parent(p);
    }
    let now = now_ms();
    for p in missing.iter().rev() {
        let parent = model::parent(p).unwrap_or(ROOT);
        need(&actor, Perm::ProjectAdmin, parent)?;
        let done = sqlx::query(
            "INSERT INTO projects (path, parent, created_ms, created_by) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (path) DO NOTHING",
        )
        .bind(*p)
        .bind(parent)
        .bind(now)
        .bind(&actor.who.identity)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(IamError::Conflict(format!("project {p} exists")));
        }
        audit(&mut tx, &actor, "project.create", p, Some(p), None).await?;
    }
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(ProjectRow {
        path: path.to_string(),
        created_ms: now,
        created_by: actor.who.identity.clone(),
        quota: Quota::default(),
    })
}

fn project_row(r: &sqlx::any::AnyRow) -> Result<ProjectRow> {
    Ok(ProjectRow {
        path: r.try_get(0)?,
        created_ms: r.try_get(1)?,
        created_by: r.try_get(2)?,
        quota: Quota {
            max_sandboxes: r.try_get(3)?,
            max_cpu: r.try_get(4)?,
            max_memory: r.try_get(5)?,
            max_fncalls: r.try_get(6)?,
        },
    })
}

/// Every project the actor may see, by path.
pub async fn list_projects(db: &Db, actor: Actor<'_>) -> Result<Vec<ProjectRow>> {
    let rows = sqlx::query(
        "SELECT path, created_ms, created_by, max_sandboxes, max_cpu, max_memory, max_fncalls \
         FROM projects ORDER BY path",
    )
    .fetch_all(db)
    .await?;
    let mut out = Vec::new();
    for r in &rows {
        let p = project_row(r)?;
        if sees(&actor, &p.path) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Every project's quota, for checks on create.
pub async fn quotas(db: &Db) -> Result<Vec<(String, Quota)>> {
    let rows = sqlx::query(
        "SELECT path, created_ms, created_by, max_sandboxes, max_cpu, max_memory, max_fncalls \
         FROM projects WHERE max_sandboxes IS NOT NULL OR max_cpu IS NOT NULL \
         OR max_memory IS NOT NULL OR max_fncalls IS NOT NULL",
    )
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| project_row(r).map(|p| (p.path, p.quota)))
        .collect()
}

/// Sets project `path`'s quota; the actor needs `project.admin` on its parent (on root for
/// root's own).
pub async fn set_quota(db: &Db, actor: Actor<'_>, path: &str, q: Quota) -> Result<()> {
    check_path(path).map_err(IamError::Invalid)?;
    for (what, v) in [
        ("max_sandboxes", q.max_sandboxes),
        ("max_cpu", q.max_cpu),
        ("max_memory", q.max_memory),
        ("max_fncalls", q.max_fncalls),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(IamError::Invalid(format!("{what} must be 0 or more")));
        }
    }
    need(
        &actor,
        Perm::ProjectAdmin,
        model::parent(path).unwrap_or(ROOT),
    )?;
    let mut tx = crate::db::begin_write(db).await?;
    let done = sqlx::query(
        "UPDATE projects SET max_sandboxes = $1, max_cpu = $2, max_memory = $3, \
         max_fncalls = $4 WHERE path = $5",
    )
    .bind(q.max_sandboxes)
    .bind(q.max_cpu)
    .bind(q.max_memory)
    .bind(q.max_fncalls)
    .bind(path)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(IamError::NotFound(format!("no project {path}")));
    }
    let detail = format!(
        "max_sandboxes={:?} max_cpu={:?} max_memory={:?} max_fncalls={:?}",
        q.max_sandboxes, q.max_cpu, q.max_memory, q.max_fncalls
    );
    audit(
        &mut tx,
        &actor,
        "project.quota",
        path,
        Some(path),
        Some(&detail),
    )
    .await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// What keeps project `path` from being deleted, other than sandboxes: it does not exist, it
/// has child projects, or identities were made in it.
async fn deletable(tx: &mut Tx<'_>, path: &str) -> Result<()> {
    if !project_exists(tx, path).await? {
        return Err(IamError::NotFound(format!("no project {path}")));
    }
    let (children,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM projects WHERE parent = $1")
        .bind(path)
        .fetch_one(&mut **tx)
        .await?;
    if children > 0 {
        return Err(IamError::Conflict(format!(
            "project {path} has {children} child projects: delete them first"
        )));
    }
    let ids: Vec<(String,)> = sqlx::query_as("SELECT name FROM identities WHERE project = $1")
        .bind(path)
        .fetch_all(&mut **tx)
        .await?;
    if !ids.is_empty() {
        return Err(IamError::Conflict(format!(
            "identities were made in project {path} ({}): delete them first",
            ids.into_iter().map(|(n,)| n).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

/// Checks, before anything is done, that the actor may delete project `path` and that only its
/// sandboxes (if any) stand in the way.
pub async fn check_delete_project(db: &Db, actor: Actor<'_>, path: &str) -> Result<()> {
    check_path(path).map_err(IamError::Invalid)?;
    let Some(parent) = model::parent(path) else {
        return Err(IamError::Conflict(
            "the root project cannot be deleted".into(),
        ));
    };
    need(&actor, Perm::ProjectAdmin, parent)?;
    let mut tx = crate::db::begin_write(db).await?;
    deletable(&mut tx, path).await
}

/// Deletes project `path` (never root); the actor needs `project.admin` on its parent. It
/// must have no child projects and no identities made in it; `sandboxes` is how many
/// sandboxes it holds now (the caller asks the nodes): none, or the delete is refused. Its
/// bindings go, and keys acting in it are revoked.
pub async fn delete_project(db: &Db, actor: Actor<'_>, path: &str, sandboxes: usize) -> Result<()> {
    check_path(path).map_err(IamError::Invalid)?;
    let Some(parent) = model::parent(path) else {
        return Err(IamError::Conflict(
            "the root project cannot be deleted".into(),
        ));
    };
    need(&actor, Perm::ProjectAdmin, parent)?;
    if sandboxes > 0 {
        return Err(IamError::Conflict(format!(
            "project {path} still has {sandboxes} sandboxes: kill them first (warren project rm \
             --force kills them)"
        )));
    }
    let mut tx = crate::db::begin_write(db).await?;
    deletable(&mut tx, path).await?;
    sqlx::query("DELETE FROM bindings WHERE project = $1")
        .bind(path)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE api_keys SET revoked_ms = $1 WHERE project = $2 AND revoked_ms IS NULL")
        .bind(now_ms())
        .bind(path)
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM projects WHERE path = $1")
        .bind(path)
        .execute(&mut *tx)
        .await?;
    audit(&mut tx, &actor, "project.delete", path, Some(path), None).await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Creates an identity (`user` or `service`) in `project`; the actor needs `iam.delegate`
/// there.
pub async fn create_identity(
    db: &Db,
    actor: Actor<'_>,
    name: &str,
    kind: &str,
    project: &str,
) -> Result<IdentityRow> {
    check_identity(name).map_err(IamError::Invalid)?;
    check_path(project).map_err(IamError::Invalid)?;
    if !matches!(kind, "user" | "service") {
        return Err(IamError::Invalid(format!(
            "identity kind {kind:?} is not user or service"
        )));
    }
    need(&actor, Perm::IamDelegate, project)?;
    let mut tx = crate::db::begin_write(db).await?;
    if !project_exists(&mut tx, project).await? {
        return Err(IamError::NotFound(format!("no project {project}")));
    }
    let now = now_ms();
    let done = sqlx::query(
        "INSERT INTO identities (name, kind, project, created_ms, created_by) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(kind)
    .bind(project)
    .bind(now)
    .bind(&actor.who.identity)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(IamError::Conflict(format!("identity {name} exists")));
    }
    audit(
        &mut tx,
        &actor,
        "identity.create",
        name,
        Some(project),
        Some(kind),
    )
    .await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(IdentityRow {
        name: name.into(),
        kind: kind.into(),
        project: project.into(),
        created_ms: now,
        created_by: actor.who.identity.clone(),
    })
}

fn identity_row(r: &sqlx::any::AnyRow) -> Result<IdentityRow> {
    Ok(IdentityRow {
        name: r.try_get(0)?,
        kind: r.try_get(1)?,
        project: r.try_get(2)?,
        created_ms: r.try_get(3)?,
        created_by: r.try_get(4)?,
    })
}

async fn identity(tx: &mut Tx<'_>, name: &str) -> Result<Option<IdentityRow>> {
    let r = sqlx::query(
        "SELECT name, kind, project, created_ms, created_by FROM identities WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(&mut **tx)
    .await?;
    r.as_ref().map(identity_row).transpose()
}

/// Whether the actor manages identity `i`: itself, or one made where it holds `iam.delegate`.
fn manages(actor: &Actor, i: &IdentityRow) -> bool {
    i.name == actor.who.identity || actor.who.allows(Perm::IamDelegate, &i.project)
}

/// The identities the actor manages (itself included).
pub async fn list_identities(db: &Db, actor: Actor<'_>) -> Result<Vec<IdentityRow>> {
    let rows = sqlx::query(
        "SELECT name, kind, project, created_ms, created_by FROM identities ORDER BY name",
    )
    .fetch_all(db)
    .await?;
    let mut out = Vec::new();
    for r in &rows {
        let i = identity_row(r)?;
        if manages(&actor, &i) {
            out.push(i);
        }
    }
    Ok(out)
}

/// Binds `identity` to `project` with `grant` (a role or one permission). The actor needs
/// `iam.delegate` on `project` and must hold every permission of the grant there itself, and
/// must manage the identity.
pub async fn grant(
    db: &Db,
    actor: Actor<'_>,
    identity_name: &str,
    project: &str,
    grant: &str,
) -> Result<BindingRow> {
    check_identity(identity_name).map_err(IamError::Invalid)?;
    check_path(project).map_err(IamError::Invalid)?;
    let perms = grant_perms(grant).map_err(IamError::Invalid)?;
    need(&actor, Perm::IamDelegate, project)?;
    let held = actor.who.perms_at(project);
    if !held.contains(perms) {
        return Err(IamError::Forbidden(format!(
            "{grant} on {project} needs {}, and identity {} holds only {} there: one can grant \
             only what one holds",
            perms.names().join(", "),
            actor.who.identity,
            held.names().join(", ")
        )));
    }
    let mut tx = crate::db::begin_write(db).await?;
    let Some(i) = identity(&mut tx, identity_name)
        .await?
        .filter(|i| manages(&actor, i))
    else {
        return Err(IamError::NotFound(format!("no identity {identity_name}")));
    };
    if !project_exists(&mut tx, project).await? {
        return Err(IamError::NotFound(format!("no project {project}")));
    }
    let now = now_ms();
    sqlx::query(
        "INSERT INTO bindings (identity, project, grant_name, created_ms, created_by) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (identity, project, grant_name) DO NOTHING",
    )
    .bind(&i.name)
    .bind(project)
    .bind(grant)
    .bind(now)
    .bind(&actor.who.identity)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        &actor,
        "binding.create",
        &i.name,
        Some(project),
        Some(grant),
    )
    .await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(BindingRow {
        identity: i.name,
        project: project.into(),
        grant: grant.into(),
        created_ms: now,
        created_by: actor.who.identity.clone(),
    })
}

/// Removes a binding; the actor needs `iam.delegate` on its project and must manage the
/// identity.
pub async fn revoke_grant(
    db: &Db,
    actor: Actor<'_>,
    identity_name: &str,
    project: &str,
    grant: &str,
) -> Result<()> {
    check_path(project).map_err(IamError::Invalid)?;
    need(&actor, Perm::IamDelegate, project)?;
    // The bootstrap admin's grant on root is what every other grant comes from: without it
    // no key could ever manage the cluster again.
    if identity_name == "admin" && project == ROOT && grant == "admin" {
        return Err(IamError::Conflict(
            "the admin identity's admin grant on root cannot be revoked: it is what every \
             other grant comes from (revoke its keys instead, after making another admin's)"
                .into(),
        ));
    }
    let mut tx = crate::db::begin_write(db).await?;
    if identity(&mut tx, identity_name)
        .await?
        .filter(|i| manages(&actor, i))
        .is_none()
    {
        return Err(IamError::NotFound(format!("no identity {identity_name}")));
    }
    let done = sqlx::query(
        "DELETE FROM bindings WHERE identity = $1 AND project = $2 AND grant_name = $3",
    )
    .bind(identity_name)
    .bind(project)
    .bind(grant)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 0 {
        return Err(IamError::NotFound(format!(
            "identity {identity_name} has no {grant} on {project}"
        )));
    }
    audit(
        &mut tx,
        &actor,
        "binding.delete",
        identity_name,
        Some(project),
        Some(grant),
    )
    .await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// The bindings of identities the actor manages.
pub async fn list_bindings(db: &Db, actor: Actor<'_>) -> Result<Vec<BindingRow>> {
    let ids = list_identities(db, actor).await?;
    let rows = sqlx::query(
        "SELECT identity, project, grant_name, created_ms, created_by FROM bindings \
         ORDER BY identity, project, grant_name",
    )
    .fetch_all(db)
    .await?;
    let mut out = Vec::new();
    for r in &rows {
        let b = BindingRow {
            identity: r.try_get(0)?,
            project: r.try_get(1)?,
            grant: r.try_get(2)?,
            created_ms: r.try_get(3)?,
            created_by: r.try_get(4)?,
        };
        // Of identities it manages, and where it may look (its own identity's bindings
        // elsewhere are not a key's business).
        if ids.iter().any(|i| i.name == b.identity)
            && (actor.who.allows(Perm::IamDelegate, &b.project)
                || (b.identity == actor.who.identity && sees(&actor, &b.project)))
        {
            out.push(b);
        }
    }
    Ok(out)
}

/// What a new key is to be.
#[derive(Debug, Clone)]
pub struct NewKey<'a> {
    /// Its name (for lists).
    pub name: &'a str,
    /// The identity it acts as (default: the actor's).
    pub identity: Option<&'a str>,
    /// The subtree it acts in.
    pub project: &'a str,
    /// Its role or permission.
    pub role: &'a str,
    /// When it expires, ms since the epoch.
    pub expires_ms: Option<i64>,
    /// Its secret in E2B's form (`e2b_` + 40 hex digits) rather than Warren's.
    pub e2b_form: bool,
}

/// A secret in E2B's key form.
fn e2b_secret() -> String {
    let bytes: [u8; 20] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("e2b_{hex}")
}

/// Makes a key; returns it and its secret (shown once). The actor needs `iam.delegate` on the
/// key's project, must hold every permission of the key's role there, and must manage its
/// identity.
pub async fn create_key(db: &Db, actor: Actor<'_>, new: NewKey<'_>) -> Result<(KeyRow, String)> {
    if new.name.is_empty()
        || new.name.chars().count() > 63
        || new.name.chars().any(char::is_control)
    {
        return Err(IamError::Invalid(
            "a key's name must be 1 to 63 characters without control characters".into(),
        ));
    }
    check_path(new.project).map_err(IamError::Invalid)?;
    let perms = grant_perms(new.role).map_err(IamError::Invalid)?;
    let now = now_ms();
    if new.expires_ms.is_some_and(|e| e <= now) {
        return Err(IamError::Invalid(
            "the key would expire before it is made".into(),
        ));
    }
    need(&actor, Perm::IamDelegate, new.project)?;
    let held = actor.who.perms_at(new.project);
    if !held.contains(perms) {
        return Err(IamError::Forbidden(format!(
            "a {} key on {} needs {}, and identity {} holds only {} there: a key can hold only \
             what its maker holds",
            new.role,
            new.project,
            perms.names().join(", "),
            actor.who.identity,
            held.names().join(", ")
        )));
    }
    let identity_name = new.identity.unwrap_or(&actor.who.identity);
    check_identity(identity_name).map_err(IamError::Invalid)?;
    let mut tx = crate::db::begin_write(db).await?;
    let Some(i) = identity(&mut tx, identity_name)
        .await?
        .filter(|i| manages(&actor, i))
    else {
        return Err(IamError::NotFound(format!("no identity {identity_name}")));
    };
    if !project_exists(&mut tx, new.project).await? {
        return Err(IamError::NotFound(format!("no project {}", new.project)));
    }
    let secret = if new.e2b_form {
        e2b_secret()
    } else {
        crate::auth::new_key()
    };
    let hash = crate::auth::hash(&secret);
    let row = KeyRow {
        id: format!("key_{}", &hash[..12]),
        name: new.name.into(),
        identity: i.name,
        project: new.project.into(),
        role: new.role.into(),
        created_ms: now,
        created_by: actor.who.identity.clone(),
        expires_ms: new.expires_ms,
        revoked_ms: None,
        last_used_ms: None,
    };
    sqlx::query(
        "INSERT INTO api_keys (id, name, key_hash, role, created_ms, identity, project, \
         created_by, expires_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(&row.id)
    .bind(&row.name)
    .bind(&hash)
    .bind(&row.role)
    .bind(row.created_ms)
    .bind(&row.identity)
    .bind(&row.project)
    .bind(&row.created_by)
    .bind(row.expires_ms)
    .execute(&mut *tx)
    .await?;
    let detail = format!("identity={} role={}", row.identity, row.role);
    audit(
        &mut tx,
        &actor,
        "key.create",
        &row.id,
        Some(new.project),
        Some(&detail),
    )
    .await?;
    bump(&mut tx).await?;
    tx.commit().await?;
    Ok((row, secret))
}

fn key_row(r: &sqlx::any::AnyRow) -> Result<KeyRow> {
    Ok(KeyRow {
        id: r.try_get(0)?,
        name: r.try_get(1)?,
        identity: r.try_get(2)?,
        project: r.try_get(3)?,
        role: r.try_get(4)?,
        created_ms: r.try_get(5)?,
        created_by: r.try_get(6)?,
        expires_ms: r.try_get(7)?,
        revoked_ms: r.try_get(8)?,
        last_used_ms: r.try_get(9)?,
    })
}

/// The columns of [`key_row`], in its order.
macro_rules! key_columns {
    () => {
        "id, name, identity, project, role, created_ms, created_by, expires_ms, revoked_ms, \
         last_used_ms"
    };
}

/// Whether the actor manages key `k`: one acting where the actor holds `iam.delegate`, or the
/// actor's own key. (Other keys of the same identity are not: a job's key must not revoke or
/// list the keys of whoever made it.)
fn manages_key(actor: &Actor, k: &KeyRow) -> bool {
    k.id == actor.who.key_id || actor.who.allows(Perm::IamDelegate, &k.project)
}

/// The keys the actor manages.
pub async fn list_keys(db: &Db, actor: Actor<'_>) -> Result<Vec<KeyRow>> {
    let rows = sqlx::query(concat!(
        "SELECT ",
        key_columns!(),
        " FROM api_keys ORDER BY created_ms, id"
    ))
    .fetch_all(db)
    .await?;
    let mut out = Vec::new();
    for r in &rows {
        let k = key_row(r)?;
        if manages_key(&actor, &k) {
            out.push(k);
        }
    }
    Ok(out)
}

/// Revokes key `id` (it stops working on every replica within a second or two).
pub async fn revoke_key(db: &Db, actor: Actor<'_>, id: &str) -> Result<KeyRow> {
    // A key does not revoke itself: a mistake that leaves the caller without a key (another
    // key of the identity, or its creator, revokes it).
    if id == actor.who.key_id {
        return Err(IamError::Conflict(format!(
            "key {id} is the key making this request: revoke it with another key"
        )));
    }
    let mut tx = crate::db::begin_write(db).await?;
    let r = sqlx::query(concat!(
        "SELECT ",
        key_columns!(),
        " FROM api_keys WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(mut k) = r
        .as_ref()
        .map(key_row)
        .transpose()?
        .filter(|k| manages_key(&actor, k))
    else {
        return Err(IamError::NotFound(format!("no key {id}")));
    };
    if k.revoked_ms.is_none() {
        let now = now_ms();
        sqlx::query("UPDATE api_keys SET revoked_ms = $1 WHERE id = $2")
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        k.revoked_ms = Some(now);
        audit(&mut tx, &actor, "key.revoke", id, Some(&k.project), None).await?;
        bump(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(k)
}

/// The principal of the key whose hash is `hash`, if it is a key that works now.
pub async fn principal(db: &Db, hash: &str) -> Result<Option<Principal>> {
    let r = sqlx::query(
        "SELECT id, identity, project, role, expires_ms, revoked_ms FROM api_keys \
         WHERE key_hash = $1",
    )
    .bind(hash)
    .fetch_optional(db)
    .await?;
    principal_of(db, r).await
}

/// The principal of the key with id `id`, if it works now (not revoked, not expired): what a
/// request made on its behalf holds (see `api::access`).
pub async fn principal_by_id(db: &Db, id: &str) -> Result<Option<Principal>> {
    let r = sqlx::query(
        "SELECT id, identity, project, role, expires_ms, revoked_ms FROM api_keys \
         WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    principal_of(db, r).await
}

/// The principal of a key's row (id, identity, project, role, expires_ms, revoked_ms).
async fn principal_of(db: &Db, r: Option<sqlx::any::AnyRow>) -> Result<Option<Principal>> {
    let Some(r) = r else {
        return Ok(None);
    };
    let id: String = r.try_get(0)?;
    let identity: String = r.try_get(1)?;
    let project: String = r.try_get(2)?;
    let role: String = r.try_get(3)?;
    let expires_ms: Option<i64> = r.try_get(4)?;
    let revoked_ms: Option<i64> = r.try_get(5)?;
    if revoked_ms.is_some() || expires_ms.is_some_and(|e| e <= now_ms()) {
        return Ok(None);
    }
    let key_role = grant_perms(&role).unwrap_or(Perms::NONE);
    let rows = sqlx::query("SELECT project, grant_name FROM bindings WHERE identity = $1")
        .bind(&identity)
        .fetch_all(db)
        .await?;
    let mut bindings = Vec::new();
    for r in &rows {
        let p: String = r.try_get(0)?;
        let g: String = r.try_get(1)?;
        if let Ok(perms) = grant_perms(&g) {
            bindings.push((p, perms));
        }
    }
    Ok(Some(Principal::from_parts(
        identity, id, project, key_role, &bindings, expires_ms,
    )))
}

/// Records that keys were used (a minute's worth at once).
pub async fn touch_keys(db: &Db, used: &[(String, i64)]) -> Result<()> {
    for (id, at) in used {
        sqlx::query("UPDATE api_keys SET last_used_ms = $1 WHERE id = $2")
            .bind(at)
            .bind(id)
            .execute(db)
            .await?;
    }
    Ok(())
}

/// The audit log, newest first: records of projects where the actor holds `audit.read`
/// (records of no project need it on root).
pub async fn audit_log(
    db: &Db,
    actor: Actor<'_>,
    since_ms: i64,
    limit: i64,
) -> Result<Vec<AuditRow>> {
    let scope = actor.who.scope(Perm::AuditRead);
    if scope.is_empty() {
        return Err(IamError::Forbidden(format!(
            "identity {} does not hold audit.read anywhere",
            actor.who.identity
        )));
    }
    let rows = sqlx::query(
        "SELECT id, at_ms, actor, key_id, action, target, project, source, detail FROM audit \
         WHERE at_ms >= $1 ORDER BY id DESC LIMIT 100000",
    )
    .bind(since_ms)
    .fetch_all(db)
    .await?;
    let mut out = Vec::new();
    for r in &rows {
        let a = AuditRow {
            id: r.try_get(0)?,
            at_ms: r.try_get(1)?,
            actor: r.try_get(2)?,
            key_id: r.try_get(3)?,
            action: r.try_get(4)?,
            target: r.try_get(5)?,
            project: r.try_get(6)?,
            source: r.try_get(7)?,
            detail: r.try_get(8)?,
        };
        let p = a.project.as_deref().unwrap_or(ROOT);
        if Principal::in_scope(&scope, p) {
            out.push(a);
            if out.len() as i64 >= limit {
                break;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// The admin's principal on `db` (the migration made the identity and its binding).
    async fn admin(db: &Db) -> Principal {
        let key = "wrn_test-admin";
        sqlx::query(
            "INSERT INTO api_keys (id, name, key_hash, role, created_ms) \
             VALUES ('key_admin', 'admin', $1, 'admin', 0)",
        )
        .bind(crate::auth::hash(key))
        .execute(db)
        .await
        .unwrap();
        principal(db, &crate::auth::hash(key))
            .await
            .unwrap()
            .unwrap()
    }

    fn act(p: &Principal) -> Actor<'_> {
        Actor {
            who: p,
            source: Some("test"),
        }
    }

    #[tokio::test]
    async fn projects_identities_grants_and_keys_on_each_database() {
        for t in crate::db::testing::each().await {
            let db = &t.db;
            let root = admin(db).await;
            let v0 = version(db).await.unwrap();
            create_project(db, act(&root), "root/rl").await.unwrap();
            create_project(db, act(&root), "root/rl/job-1")
                .await
                .unwrap();
            create_project(db, act(&root), "root/other").await.unwrap();
            assert!(version(db).await.unwrap() > v0, "changes bump the version");
            // Missing ancestors are made with it.
            create_project(db, act(&root), "root/deep/er/still")
                .await
                .unwrap();
            let listed: Vec<String> = list_projects(db, act(&root))
                .await
                .unwrap()
                .into_iter()
                .map(|p| p.path)
                .collect();
            for p in ["root/deep", "root/deep/er", "root/deep/er/still"] {
                assert!(listed.contains(&p.to_string()), "{p} in {listed:?}");
            }
            // No lock-out: the admin's grant on root stays, and a key does not revoke itself.
            let e = revoke_grant(db, act(&root), "admin", "root", "admin")
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::Conflict(_)), "{e}");
            let e = revoke_key(db, act(&root), &root.key_id).await.unwrap_err();
            assert!(matches!(e, IamError::Conflict(_)), "{e}");
            assert!(
                principal(db, &crate::auth::hash("wrn_test-admin"))
                    .await
                    .unwrap()
                    .is_some(),
                "the admin key still works"
            );
            // Bad input: clear errors, nothing written.
            for (path, want) in [
                ("root/rl", "exists"),
                ("root/Bad", "lowercase"),
                ("root/x'; DROP TABLE projects; --", "lowercase"),
                ("root", "always exists"),
            ] {
                let e = create_project(db, act(&root), path).await.unwrap_err();
                assert!(e.to_string().contains(want), "{path}: {e}");
            }
            // A lead of root/rl, and a key of hers scoped to it.
            create_identity(db, act(&root), "lead", "user", "root/rl")
                .await
                .unwrap();
            grant(db, act(&root), "lead", "root/rl", "project-admin")
                .await
                .unwrap();
            let (k, secret) = create_key(
                db,
                act(&root),
                NewKey {
                    name: "lead",
                    identity: Some("lead"),
                    project: "root/rl",
                    role: "project-admin",
                    expires_ms: None,
                    e2b_form: false,
                },
            )
            .await
            .unwrap();
            let lead = principal(db, &crate::auth::hash(&secret))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(lead.key_id, k.id);
            assert!(lead.allows(Perm::SandboxExec, "root/rl/job-1"));
            assert!(!lead.allows(Perm::SandboxRead, "root/other"));
            assert!(!lead.allows(Perm::ClusterAdmin, "root/rl"));
            // She delegates below herself only, and only what she holds.
            create_project(db, act(&lead), "root/rl/job-2")
                .await
                .unwrap();
            let e = create_project(db, act(&lead), "root/other/x")
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::Forbidden(_)), "{e}");
            create_identity(db, act(&lead), "job-2-bot", "service", "root/rl/job-2")
                .await
                .unwrap();
            let e = grant(db, act(&lead), "job-2-bot", "root/rl/job-2", "admin")
                .await
                .unwrap_err();
            assert!(e.to_string().contains("only what one holds"), "{e}");
            let e = grant(db, act(&lead), "job-2-bot", "root/other", "runner")
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::Forbidden(_)), "{e}");
            let e = grant(db, act(&lead), "job-2-bot", "root/rl", "superuser")
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::Invalid(_)), "{e}");
            grant(db, act(&lead), "job-2-bot", "root/rl/job-2", "runner")
                .await
                .unwrap();
            // An identity she does not manage is not found (the admin's).
            let e = grant(db, act(&lead), "admin", "root/rl", "viewer")
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::NotFound(_)), "{e}");
            // Keys: of what she holds; expired keys do not work; revoked keys neither.
            let (bot_key, bot_secret) = create_key(
                db,
                act(&lead),
                NewKey {
                    name: "bot",
                    identity: Some("job-2-bot"),
                    project: "root/rl/job-2",
                    role: "runner",
                    expires_ms: Some(now_ms() + 60_000),
                    e2b_form: true,
                },
            )
            .await
            .unwrap();
            let bot = principal(db, &crate::auth::hash(&bot_secret))
                .await
                .unwrap()
                .unwrap();
            assert!(bot.allows(Perm::SandboxCreate, "root/rl/job-2"));
            assert!(!bot.allows(Perm::SandboxCreate, "root/rl/job-1"));
            assert!(!bot.allows(Perm::IamDelegate, "root/rl/job-2"));
            let e = create_key(
                db,
                act(&bot),
                NewKey {
                    name: "more",
                    identity: None,
                    project: "root/rl/job-2",
                    role: "runner",
                    expires_ms: None,
                    e2b_form: false,
                },
            )
            .await
            .unwrap_err();
            assert!(
                matches!(e, IamError::Forbidden(_)),
                "a runner cannot make keys: {e}"
            );
            revoke_key(db, act(&lead), &bot_key.id).await.unwrap();
            assert!(
                principal(db, &crate::auth::hash(&bot_secret))
                    .await
                    .unwrap()
                    .is_none()
            );
            let e = create_key(
                db,
                act(&lead),
                NewKey {
                    name: "old",
                    identity: None,
                    project: "root/rl",
                    role: "viewer",
                    expires_ms: Some(1),
                    e2b_form: false,
                },
            )
            .await
            .unwrap_err();
            assert!(matches!(e, IamError::Invalid(_)), "{e}");
            // Lists show what the actor manages.
            let ids: Vec<String> = list_identities(db, act(&lead))
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.name)
                .collect();
            assert_eq!(ids, vec!["job-2-bot".to_string(), "lead".to_string()]);
            let keys = list_keys(db, act(&lead)).await.unwrap();
            assert!(
                keys.iter().all(|k| k.project.starts_with("root/rl")),
                "{keys:?}"
            );
            let projects: Vec<String> = list_projects(db, act(&lead))
                .await
                .unwrap()
                .into_iter()
                .map(|p| p.path)
                .collect();
            assert!(projects.contains(&"root/rl/job-2".to_string()));
            assert!(
                !projects.contains(&"root/other".to_string()),
                "{projects:?}"
            );
            // Deleting: not with children, not with identities, not with sandboxes.
            let e = delete_project(db, act(&root), "root/rl", 0)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("child projects"), "{e}");
            let e = delete_project(db, act(&lead), "root/rl/job-2", 0)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("job-2-bot"), "{e}");
            let e = delete_project(db, act(&lead), "root/rl/job-1", 3)
                .await
                .unwrap_err();
            assert!(e.to_string().contains("3 sandboxes"), "{e}");
            delete_project(db, act(&lead), "root/rl/job-1", 0)
                .await
                .unwrap();
            // Quotas: set by the parent's admin.
            set_quota(
                db,
                act(&lead),
                "root/rl/job-2",
                Quota {
                    max_sandboxes: Some(4),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            let e = set_quota(db, act(&lead), "root/rl", Quota::default())
                .await
                .unwrap_err();
            assert!(matches!(e, IamError::Forbidden(_)), "{e}");
            assert_eq!(quotas(db).await.unwrap().len(), 1);
            // The audit log: every change, who and from where.
            let log = audit_log(db, act(&root), 0, 1000).await.unwrap();
            let actions: Vec<&str> = log.iter().map(|a| a.action.as_str()).collect();
            for a in [
                "project.create",
                "identity.create",
                "binding.create",
                "key.create",
                "key.revoke",
                "project.delete",
                "project.quota",
            ] {
                assert!(actions.contains(&a), "{a} in {actions:?}");
            }
            assert!(log.iter().all(|a| a.source.as_deref() == Some("test")));
            let lead_log = audit_log(db, act(&lead), 0, 1000).await.unwrap();
            assert!(
                lead_log.iter().all(|a| a
                    .project
                    .as_deref()
                    .is_some_and(|p| p.starts_with("root/rl"))),
                "{lead_log:?}"
            );
        }
    }

    /// No sequence of operations, by any key, makes a key or a binding holding a permission
    /// its maker did not hold there when making it.
    #[tokio::test]
    async fn delegation_never_grants_more_than_its_maker_holds() {
        for t in crate::db::testing::each().await {
            let db = &t.db;
            let root = admin(db).await;
            let mut rng = StdRng::seed_from_u64(42);
            let mut projects = vec!["root".to_string()];
            for i in 0..12 {
                let parent = projects[rng.random_range(0..projects.len())].clone();
                let p = format!("{parent}/p{i}");
                create_project(db, act(&root), &p).await.unwrap();
                projects.push(p);
            }
            let grants = [
                "viewer",
                "runner",
                "builder",
                "project-admin",
                "sandbox.exec",
                "iam.delegate",
                "project.admin",
                "image.build",
            ];
            let mut identities = vec!["admin".to_string()];
            // Keys to act with: (secret, what its maker held on its project at the time).
            let mut keys: Vec<(String, String, Perms)> = Vec::new();
            for i in 0..6 {
                let name = format!("id{i}");
                let home = projects[rng.random_range(0..projects.len())].clone();
                create_identity(db, act(&root), &name, "service", &home)
                    .await
                    .unwrap();
                let g = grants[rng.random_range(0..grants.len())];
                grant(db, act(&root), &name, &home, g).await.unwrap();
                grant(db, act(&root), &name, &home, "iam.delegate")
                    .await
                    .unwrap();
                let (_, secret) = create_key(
                    db,
                    act(&root),
                    NewKey {
                        name: "k",
                        identity: Some(&name),
                        project: &home,
                        role: "admin",
                        expires_ms: None,
                        e2b_form: false,
                    },
                )
                .await
                .unwrap();
                keys.push((secret, home, Perms::all()));
                identities.push(name);
            }
            let mut made_bindings: Vec<(String, String, String, Perms)> = Vec::new();
            let mut ok = 0;
            for step in 0..400 {
                let (secret, _, _) = keys[rng.random_range(0..keys.len())].clone();
                let Some(p) = principal(db, &crate::auth::hash(&secret)).await.unwrap() else {
                    continue;
                };
                // Mostly inside the key's subtree (where operations can succeed), sometimes
                // anywhere (where they must not).
                let inside: Vec<&String> =
                    projects.iter().filter(|x| within(x, &p.project)).collect();
                let project = if rng.random_range(0..10) < 7 {
                    inside[rng.random_range(0..inside.len())].clone()
                } else {
                    projects[rng.random_range(0..projects.len())].clone()
                };
                let g = grants[rng.random_range(0..grants.len())];
                let who = identities[rng.random_range(0..identities.len())].clone();
                let held = p.perms_at(&project);
                match rng.random_range(0..4) {
                    0 => {
                        if grant(db, act(&p), &who, &project, g).await.is_ok() {
                            made_bindings.push((who, project, g.to_string(), held));
                            ok += 1;
                        }
                    }
                    1 => {
                        let r = create_key(
                            db,
                            act(&p),
                            NewKey {
                                name: "k",
                                identity: Some(&who),
                                project: &project,
                                role: g,
                                expires_ms: None,
                                e2b_form: false,
                            },
                        )
                        .await;
                        if let Ok((_, s)) = r {
                            keys.push((s, project, held));
                            ok += 1;
                        }
                    }
                    2 => {
                        let name = format!("x{step}");
                        if create_identity(db, act(&p), &name, "service", &project)
                            .await
                            .is_ok()
                        {
                            identities.push(name);
                            ok += 1;
                        }
                    }
                    _ => {
                        let _ = revoke_grant(db, act(&p), &who, &project, g).await;
                    }
                }
            }
            assert!(
                ok > 20,
                "only {ok} operations succeeded: the walk proves little"
            );
            // Every key: nowhere more than its maker held on its project, nothing outside it.
            for (secret, kp, maker) in &keys {
                let Some(p) = principal(db, &crate::auth::hash(secret)).await.unwrap() else {
                    continue;
                };
                for x in &projects {
                    let has = p.perms_at(x);
                    if within(x, kp) {
                        assert!(
                            maker.contains(has),
                            "key on {kp} holds {:?} on {x}; its maker held {:?}",
                            has.names(),
                            maker.names()
                        );
                    } else {
                        assert!(has.is_empty(), "key on {kp} holds {:?} on {x}", has.names());
                    }
                }
            }
            // Every binding made: of what its maker held there, and in the database.
            let rows = sqlx::query_as::<_, (String, String, String)>(
                "SELECT identity, project, grant_name FROM bindings",
            )
            .fetch_all(db)
            .await
            .unwrap();
            for (who, project, g, held) in &made_bindings {
                assert!(
                    held.contains(grant_perms(g).unwrap()),
                    "{g} granted on {project} by a key holding {:?}",
                    held.names()
                );
                let _ = (rows.len(), who);
            }
        }
    }
}
