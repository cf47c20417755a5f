//! What IAM is made of, without the database: permissions and roles, project paths, and a
//! principal (what one key may do where).
//!
//! A **project** is a node of a tree addressed by its path from `root` (`root/rl/job-42`). A
//! grant on a project holds in its whole subtree. An **identity** (a person or a service
//! account) holds **bindings**: a role, or one permission, on a project. A **key** acts as one
//! identity within one project's subtree, with a role of its own: what it may do on a project
//! is what its role allows *and* what its identity's bindings allow there. A key can never do
//! more than its identity, nor than the role its creator gave it — which the creator had to
//! hold (see `store.rs`).

use std::fmt;

/// One permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Perm {
    /// Create sandboxes.
    SandboxCreate = 1 << 0,
    /// See sandboxes: get, list, metrics, trajectory, processes.
    SandboxRead = 1 << 1,
    /// Run commands in sandboxes: exec, processes, stdin, signals.
    SandboxExec = 1 << 2,
    /// Read and write sandboxes' files, watch directories.
    SandboxFiles = 1 << 3,
    /// Pause, resume, set timeouts.
    SandboxLifecycle = 1 << 4,
    /// Kill sandboxes.
    SandboxDelete = 1 << 5,
    /// Read and change sandboxes' network policy; exposed ports.
    SandboxNetwork = 1 << 6,
    /// Pause, resume, stop a task's sandboxes; its network policy.
    TaskManage = 1 << 7,
    /// List and inspect images; create sandboxes from them.
    ImageRead = 1 << 8,
    /// Import, pull, commit images.
    ImageBuild = 1 << 9,
    /// Remove images, prune layers.
    ImageDelete = 1 << 10,
    /// Read incident events.
    EventsRead = 1 << 11,
    /// Create and delete child projects, set quotas.
    ProjectAdmin = 1 << 12,
    /// Create identities, keys and bindings (of permissions it holds itself).
    IamDelegate = 1 << 13,
    /// Read the audit log.
    AuditRead = 1 << 14,
    /// Cordon, drain and remove nodes.
    ClusterAdmin = 1 << 15,
    /// Run function calls (a program run once on a warm worker).
    FnCallRun = 1 << 16,
}

/// Every permission, in the order they are documented.
pub const ALL_PERMS: [Perm; 17] = [
    Perm::SandboxCreate,
    Perm::SandboxRead,
    Perm::SandboxExec,
    Perm::SandboxFiles,
    Perm::SandboxLifecycle,
    Perm::SandboxDelete,
    Perm::SandboxNetwork,
    Perm::TaskManage,
    Perm::ImageRead,
    Perm::ImageBuild,
    Perm::ImageDelete,
    Perm::EventsRead,
    Perm::ProjectAdmin,
    Perm::IamDelegate,
    Perm::AuditRead,
    Perm::ClusterAdmin,
    Perm::FnCallRun,
];

impl Perm {
    /// Its name: `sandbox.create`, ...
    pub fn name(self) -> &'static str {
        match self {
            Perm::SandboxCreate => "sandbox.create",
            Perm::SandboxRead => "sandbox.read",
            Perm::SandboxExec => "sandbox.exec",
            Perm::SandboxFiles => "sandbox.files",
            Perm::SandboxLifecycle => "sandbox.lifecycle",
            Perm::SandboxDelete => "sandbox.delete",
            Perm::SandboxNetwork => "sandbox.network",
            Perm::TaskManage => "task.manage",
            Perm::ImageRead => "image.read",
            Perm::ImageBuild => "image.build",
            Perm::ImageDelete => "image.delete",
            Perm::EventsRead => "events.read",
            Perm::ProjectAdmin => "project.admin",
            Perm::IamDelegate => "iam.delegate",
            Perm::AuditRead => "audit.read",
            Perm::ClusterAdmin => "cluster.admin",
            Perm::FnCallRun => "fncall.run",
        }
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Perms(pub u32);

impl Perms {
    /// No permission.
    pub const NONE: Perms = Perms(0);

    /// Every permission.
    pub fn all() -> Perms {
        Perms(ALL_PERMS.iter().fold(0, |a, p| a | *p as u32))
    }

    /// The set of these.
    pub fn of(perms: &[Perm]) -> Perms {
        Perms(perms.iter().fold(0, |a, p| a | *p as u32))
    }

    /// Whether it holds `p`.
    pub fn has(self, p: Perm) -> bool {
        self.0 & p as u32 != 0
    }

    /// Whether it holds every permission of `other`.
    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both.
    pub fn and(self, other: Perms) -> Perms {
        Perms(self.0 & other.0)
    }

    /// Either.
    pub fn or(self, other: Perms) -> Perms {
        Perms(self.0 | other.0)
    }

    /// Whether it is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Its permissions' names.
    pub fn names(self) -> Vec<&'static str> {
        ALL_PERMS
            .iter()
            .filter(|p| self.has(**p))
            .map(|p| p.name())
            .collect()
    }
}

/// The built-in roles: name, what it is for, its permissions.
pub fn roles() -> Vec<(&'static str, &'static str, Perms)> {
    use Perm::*;
    let viewer = Perms::of(&[SandboxRead, ImageRead, EventsRead]);
    let runner = viewer.or(Perms::of(&[
        SandboxCreate,
        SandboxExec,
        SandboxFiles,
        SandboxLifecycle,
        SandboxDelete,
        SandboxNetwork,
        TaskManage,
        FnCallRun,
    ]));
    let builder = Perms::of(&[ImageRead, ImageBuild, ImageDelete]);
    let project_admin = runner
        .or(builder)
        .or(Perms::of(&[ProjectAdmin, IamDelegate, AuditRead]));
    vec![
        ("viewer", "see sandboxes, images and events", viewer),
        (
            "runner",
            "run sandboxes: create, exec, files, lifecycle, network, tasks, function calls \
             (not images)",
            runner,
        ),
        (
            "builder",
            "build and remove images (not run sandboxes)",
            builder,
        ),
        (
            "project-admin",
            "everything in the project: runner, builder, child projects, keys and grants",
            project_admin,
        ),
        ("admin", "everything, nodes included", Perms::all()),
    ]
}

/// What a grant (a role's name, or one permission's) allows, or why it is no grant.
pub fn grant_perms(name: &str) -> Result<Perms, String> {
    if let Some((_, _, p)) = roles().into_iter().find(|(n, _, _)| *n == name) {
        return Ok(p);
    }
    if let Some(p) = ALL_PERMS.iter().find(|p| p.name() == name) {
        return Ok(Perms::of(&[*p]));
    }
    Err(format!(
        "{name:?} is neither a role ({}) nor a permission ({})",
        roles()
            .iter()
            .map(|(n, _, _)| *n)
            .collect::<Vec<_>>()
            .join(", "),
        ALL_PERMS
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

pub use warren_types::project::{MAX_DEPTH, ROOT, check_path, parent, within};

/// Checks an identity's name: 1 to 63 lowercase letters, digits, `-`, `_`, `.`, `@`.
pub fn check_identity(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.' | b'@')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "identity name {name:?} must be 1 to 63 lowercase letters, digits, - _ . @"
        ))
    }
}

/// What one key may do: its identity, its project, and where it holds what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The identity it acts as.
    pub identity: String,
    /// The key's id.
    pub key_id: String,
    /// The key's project: the subtree it acts in, and where new objects go by default.
    pub project: String,
    /// Subtrees and what it holds in each (from the identity's bindings, bounded by the
    /// key's project and role).
    pub grants: Vec<(String, Perms)>,
    /// When the key expires, ms since the epoch.
    pub expires_ms: Option<i64>,
}

impl Principal {
    /// The key's grants: each of the identity's bindings meeting the key's subtree, limited to
    /// the key's role.
    pub fn from_parts(
        identity: String,
        key_id: String,
        key_project: String,
        key_role: Perms,
        bindings: &[(String, Perms)],
        expires_ms: Option<i64>,
    ) -> Principal {
        let mut grants = Vec::new();
        for (bp, perms) in bindings {
            let perms = perms.and(key_role);
            if perms.is_empty() {
                continue;
            }
            if within(&key_project, bp) {
                // Bound above the key: holds in the key's whole subtree.
                grants.push((key_project.clone(), perms));
            } else if within(bp, &key_project) {
                // Bound inside it: holds in that part.
                grants.push((bp.clone(), perms));
            }
        }
        Principal {
            identity,
            key_id,
            project: key_project,
            grants,
            expires_ms,
        }
    }

    /// What it holds on `project` (grants on it or an ancestor).
    pub fn perms_at(&self, project: &str) -> Perms {
        self.grants
            .iter()
            .filter(|(p, _)| within(project, p))
            .fold(Perms::NONE, |a, (_, g)| a.or(*g))
    }

    /// Whether it holds `p` on `project`.
    pub fn allows(&self, p: Perm, project: &str) -> bool {
        self.perms_at(project).has(p)
    }

    /// The subtrees where it holds `p`, none inside another.
    pub fn scope(&self, p: Perm) -> Vec<String> {
        let mut roots: Vec<&String> = self
            .grants
            .iter()
            .filter(|(_, g)| g.has(p))
            .map(|(path, _)| path)
            .collect();
        roots.sort();
        roots.dedup();
        let mut out: Vec<String> = Vec::new();
        for r in roots {
            if !out.iter().any(|o| within(r, o)) {
                out.push(r.clone());
            }
        }
        out
    }

    /// Whether `project` is in one of `scope`'s subtrees.
    pub fn in_scope(scope: &[String], project: &str) -> bool {
        scope.iter().any(|s| within(project, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked() {
        for ok in ["root", "root/rl", "root/rl/job-42", "root/a.b_c-1"] {
            check_path(ok).unwrap();
        }
        for bad in [
            "",
            "rl",
            "root/",
            "root//x",
            "root/../x",
            "root/.",
            "root/Rl",
            "root/a b",
            "root/a;drop table projects",
            "/root",
            "root/x\0",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        let deep = std::iter::once("root")
            .chain(std::iter::repeat_n("a", MAX_DEPTH))
            .collect::<Vec<_>>()
            .join("/");
        assert!(check_path(&deep).is_err());
    }

    #[test]
    fn within_is_by_segment() {
        assert!(within("root/rl/job", "root/rl"));
        assert!(within("root/rl", "root/rl"));
        assert!(!within("root/rlx", "root/rl"));
        assert!(!within("root", "root/rl"));
        assert_eq!(parent("root/rl/job"), Some("root/rl"));
        assert_eq!(parent("root"), None);
    }

    #[test]
    fn a_keys_grants_are_its_role_and_its_identitys_both() {
        let runner = grant_perms("runner").unwrap();
        let admin = grant_perms("admin").unwrap();
        // The identity is project-admin on root/rl and viewer on root.
        let bindings = vec![
            ("root/rl".to_string(), grant_perms("project-admin").unwrap()),
            ("root".to_string(), grant_perms("viewer").unwrap()),
        ];
        // A runner key on root/rl/job: runner there, nothing above.
        let k = Principal::from_parts(
            "alice".into(),
            "k".into(),
            "root/rl/job".into(),
            runner,
            &bindings,
            None,
        );
        assert!(k.allows(Perm::SandboxExec, "root/rl/job/x"));
        assert!(!k.allows(Perm::SandboxRead, "root/rl"));
        assert!(!k.allows(Perm::ImageBuild, "root/rl/job"));
        assert!(!k.allows(Perm::IamDelegate, "root/rl/job"));
        assert_eq!(k.scope(Perm::SandboxRead), vec!["root/rl/job".to_string()]);
        // An admin-role key on root: only what the identity holds, where it holds it.
        let k = Principal::from_parts(
            "alice".into(),
            "k".into(),
            "root".into(),
            admin,
            &bindings,
            None,
        );
        assert!(k.allows(Perm::SandboxRead, "root/other"));
        assert!(!k.allows(Perm::SandboxExec, "root/other"));
        assert!(k.allows(Perm::SandboxExec, "root/rl/x"));
        assert!(!k.allows(Perm::ClusterAdmin, "root"));
        assert_eq!(k.scope(Perm::SandboxRead), vec!["root".to_string()]);
        assert_eq!(k.scope(Perm::SandboxExec), vec!["root/rl".to_string()]);
    }

    #[test]
    fn grants_are_roles_or_permissions() {
        assert_eq!(
            grant_perms("sandbox.exec").unwrap(),
            Perms::of(&[Perm::SandboxExec])
        );
        assert!(grant_perms("admin").unwrap().contains(Perms::all()));
        let e = grant_perms("superuser").unwrap_err();
        assert!(e.contains("runner") && e.contains("sandbox.exec"), "{e}");
        // The builder/runner separation: neither holds the other's.
        let (runner, builder) = (
            grant_perms("runner").unwrap(),
            grant_perms("builder").unwrap(),
        );
        assert!(!runner.has(Perm::ImageBuild) && !runner.has(Perm::ImageDelete));
        assert!(!builder.has(Perm::SandboxCreate) && !builder.has(Perm::SandboxExec));
    }
}
