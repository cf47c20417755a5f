//! Paths that users pass to the file API, checked before they reach a sandbox.
//!
//! A path is either absolute (from the sandbox's root) or relative to the acting user's home
//! directory. `..` components are refused outright: a sandbox's file system is its own, and a
//! path that climbs is a mistake or an attack either way.

/// Longest path accepted, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;

/// Checks a user-supplied path; returns a message for the user when it is not acceptable.
pub fn check_user_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("path is empty: give an absolute path such as /home/user/file.txt".into());
    }
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "path is {} bytes long; the limit is {MAX_PATH_LEN}",
            path.len()
        ));
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    if path.split('/').any(|c| c == "..") {
        return Err(format!(
            "path {path:?} contains '..': give the path without climbing, e.g. an absolute path"
        ));
    }
    Ok(())
}

/// Joins a checked `path` onto `home` when it is relative; returns it as is when absolute.
pub fn resolve(home: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        let path = path.trim_start_matches("./");
        if path.is_empty() || path == "." {
            home.to_string()
        } else {
            format!("{}/{}", home.trim_end_matches('/'), path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotdot_and_nul_are_refused() {
        assert!(check_user_path("/etc/../root").is_err());
        assert!(check_user_path("..").is_err());
        assert!(check_user_path("a/../../b").is_err());
        assert!(check_user_path("/tmp/a\0b").is_err());
        assert!(check_user_path("").is_err());
        assert!(check_user_path(&"a".repeat(5000)).is_err());
        assert!(check_user_path("/tmp/..hidden").is_ok());
        assert!(check_user_path("/tmp/a..b/c").is_ok());
    }

    #[test]
    fn relative_paths_start_at_home() {
        assert_eq!(resolve("/home/user", "x/y"), "/home/user/x/y");
        assert_eq!(resolve("/home/user", "./x"), "/home/user/x");
        assert_eq!(resolve("/home/user", "."), "/home/user");
        assert_eq!(resolve("/home/user", "/etc/hosts"), "/etc/hosts");
    }
}
