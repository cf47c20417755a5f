//! Project paths: `root`, then `/`-separated segments (`root/rl/job-42`). Shared by the
//! control plane (IAM) and the nodes (which keep each sandbox's project and filter by scope).

/// The root project's path.
pub const ROOT: &str = "root";
/// Deepest a project may be (segments, root included).
pub const MAX_DEPTH: usize = 16;

/// Checks a project path: `root`, then `/`-separated segments of 1 to 63 lowercase letters,
/// digits, `-`, `_` and `.` (not first), at most [`MAX_DEPTH`] segments: [`PATH_PATTERN`].
pub fn check_path(path: &str) -> Result<(), String> {
    let segs: Vec<&str> = path.split('/').collect();
    if segs.first() != Some(&ROOT) {
        return Err(format!(
            "project path {path:?} must start with {ROOT:?} (e.g. root/rl/job-42)"
        ));
    }
    if segs.len() > MAX_DEPTH {
        return Err(format!(
            "project path {path:?} is {} deep; at most {MAX_DEPTH} segments",
            segs.len()
        ));
    }
    for s in &segs[1..] {
        let ok = !s.is_empty()
            && s.len() <= 63
            && !s.starts_with('.')
            && s.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
            });
        if !ok {
            return Err(format!(
                "project path {path:?}: segment {s:?} must be 1 to 63 lowercase letters, digits, \
                 - _ . (not starting with .)"
            ));
        }
    }
    Ok(())
}

/// The pattern of a project path (what [`check_path`] accepts), for schemas.
pub const PATH_PATTERN: &str = "^root(/[a-z0-9_-][a-z0-9._-]{0,62}){0,15}$";

/// The root project's path, as a value (a serde default).
pub fn root() -> String {
    ROOT.to_string()
}

/// The parent of a project path (`None` for root).
pub fn parent(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(p, _)| p)
}

/// Whether `path` is `ancestor` or below it.
pub fn within(path: &str, ancestor: &str) -> bool {
    path == ancestor
        || (path.len() > ancestor.len()
            && path.starts_with(ancestor)
            && path.as_bytes()[ancestor.len()] == b'/')
}

/// Whether `project` is inside one of the subtrees of `scope` (a comma-separated list of
/// project paths, as the control plane sends it to nodes).
pub fn in_scope_list(scope: &str, project: &str) -> bool {
    scope
        .split(',')
        .any(|s| !s.is_empty() && within(project, s))
}

/// Whether a key whose `image.read` reaches the subtrees `scope` may read an image of
/// `project`: one in those subtrees, or one of an ancestor of them (images flow down the tree:
/// root's are everyone's).
pub fn image_readable(scope: &[String], project: &str) -> bool {
    scope
        .iter()
        .any(|s| within(project, s) || within(s, project))
}

/// The header in which the control plane tells a node the subtrees a request may act on.
pub const SCOPE_HEADER: &str = "x-warren-scope";
/// The header in which it tells the subtrees whose sandboxes the caller may see.
pub const VISIBLE_HEADER: &str = "x-warren-visible";
/// The header in which a caller holding every permission on `root` (the E2B gateway, acting
/// with the admin key) names the key id a request is made for: the request then holds that
/// key's grants, is refused once it is revoked or expired, and is audited under it.
pub const ON_BEHALF_HEADER: &str = "x-warren-on-behalf-of";
