//! The default user: an unprivileged account, uid 1000, that every sandbox has.
//!
//! Commands and file operations run as `user` unless asked otherwise, but a real
//! distribution's root file system (a debootstrap, most container images) defines only root
//! and system accounts. So when a sandbox starts (as root, before the lock-down), if its
//! `/etc/passwd` has neither an entry named `user` nor one with uid 1000, the guest appends
//!
//! ```text
//! user:x:1000:1000:Warren sandbox user:/home/user:/bin/sh     (/bin/bash where the image has it)
//! ```
//!
//! and `user:x:1000:` to `/etc/group` unless the image has a group 1000 already (whatever its
//! name) or a group named `user`; a missing `/etc/passwd` or `/etc/group` is created with root
//! and `user`. The default account's home is made (mode 0755, owned by it) when missing. An
//! image that has uid 1000 under another name keeps it: the name `user` then resolves to that
//! account ([`crate::users`]), so the default user is uid 1000 whatever it is called.
//!
//! The files are the sandbox's (its writable layer; a copy-up of the image's), and the image
//! may carry anything there: `/etc` is opened from the root's descriptor without following a
//! link, the files with `O_NOFOLLOW`, and anything but a regular file is left alone with a
//! warning in the guest's log. A failure here never stops the sandbox: its commands then get
//! the lookup's error, which says what to do.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// The default user's name, uid and gid.
pub const NAME: &str = "user";
pub const UID: u32 = 1000;
const HOME: &str = "/home/user";
const GECOS: &str = "Warren sandbox user";

/// Largest `/etc/passwd` or `/etc/group` read here; a larger one is left alone.
const MAX_FILE: u64 = 4 << 20;

/// What to change in the account files.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Text to append to `/etc/passwd` (or to make it with, when it is missing).
    pub passwd: Option<String>,
    /// Text to append to `/etc/group` (or to make it with).
    pub group: Option<String>,
    /// The default account's home, uid and gid: made when missing.
    pub home: Option<(String, u32, u32)>,
}

/// Fields of the account lines in `text` (lines with at least `min` fields).
fn entries(text: &str, min: usize) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(move |f| f.len() >= min)
}

/// The default account in `passwd`: the entry named `user`, else the one with uid 1000.
/// Returns its name, uid, gid, home and shell.
pub fn find_default(passwd: &str) -> Option<(String, u32, u32, String, String)> {
    let parse = |f: &Vec<&str>| {
        let uid = f[2].parse::<u32>().ok()?;
        let gid = f[3].parse::<u32>().ok()?;
        Some((
            f[0].to_string(),
            uid,
            gid,
            f[5].to_string(),
            f[6].to_string(),
        ))
    };
    entries(passwd, 7)
        .filter(|f| f[0] == NAME)
        .find_map(|f| parse(&f))
        .or_else(|| {
            entries(passwd, 7)
                .filter(|f| f[2].parse::<u32>() == Ok(UID))
                .find_map(|f| parse(&f))
        })
}

/// `addition` appended to `existing`, on a line of its own.
fn appended(existing: &str, addition: String) -> String {
    if existing.is_empty() || existing.ends_with('\n') {
        addition
    } else {
        format!("\n{addition}")
    }
}

/// What to change, given the current files (`None`: missing) and the shell to give `user`.
pub fn plan(passwd: Option<&str>, group: Option<&str>, shell: &str) -> Plan {
    let entry = format!("{NAME}:x:{UID}:{UID}:{GECOS}:{HOME}:{shell}\n");
    let mut plan = Plan::default();
    match passwd.map(find_default) {
        Some(Some((_, uid, gid, home, _))) => {
            // The image's own account: its home is made if missing, nothing else changes.
            plan.home = Some((home, uid, gid));
            return plan;
        }
        Some(None) => plan.passwd = Some(appended(passwd.unwrap_or(""), entry)),
        None => plan.passwd = Some(format!("root:x:0:0:root:/root:{shell}\n{entry}")),
    }
    plan.home = Some((HOME.to_string(), UID, UID));
    plan.group = match group {
        None => Some(format!("root:x:0:\n{NAME}:x:{UID}:\n")),
        Some(g) => {
            let taken = entries(g, 3).any(|f| f[0] == NAME || f[2].parse::<u32>() == Ok(UID));
            (!taken).then(|| appended(g, format!("{NAME}:x:{UID}:\n")))
        }
    };
    plan
}

/// Makes sure the sandbox rooted at `root` (the guest's `/`, before the lock-down) has the
/// default user; every problem is logged, none is fatal.
pub fn provide(root: &Path) {
    if let Err(e) = try_provide(root) {
        eprintln!(
            "warren-guest: warning: the default user {NAME:?} could not be provided: {e}; \
             commands of the default user will fail (run them as root or a numeric uid)"
        );
    }
}

fn try_provide(root: &Path) -> io::Result<()> {
    let mut tree = warren_fs::Beneath::open(root)?;
    let shell = if warren_fs::open_file(
        tree.root(),
        Path::new("bin/bash"),
        warren_fs::Links::InsideRoot,
    )
    .is_ok()
    {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let etc = tree.dir(Path::new("etc"), Some(0o755))?;
    let passwd = match read(etc, "passwd")? {
        Current::Text(t) => Some(t),
        Current::Missing => None,
        Current::Unusable(why) => {
            eprintln!(
                "warren-guest: warning: /etc/passwd {why}: left alone, no default user added"
            );
            return Ok(());
        }
    };
    let group = match read(etc, "group")? {
        Current::Text(t) => Some(t),
        Current::Missing => None,
        Current::Unusable(why) => {
            eprintln!("warren-guest: warning: /etc/group {why}: left alone");
            // Planned as if it had a group 1000: nothing is added to it.
            Some(format!("{NAME}:x:{UID}:\n"))
        }
    };
    let plan = plan(passwd.as_deref(), group.as_deref(), shell);
    if let Some(text) = &plan.passwd {
        append(etc, "passwd", text, passwd.is_none())?;
        eprintln!("warren-guest: the image has no uid {UID}: added {NAME:?} to /etc/passwd");
    }
    if let Some(text) = &plan.group {
        append(etc, "group", text, group.is_none())?;
    }
    if let Some((home, uid, gid)) = &plan.home
        && let Err(e) = make_home(&mut tree, home, *uid, *gid, plan.passwd.is_some())
    {
        eprintln!("warren-guest: warning: home {home:?} of uid {uid} not made: {e}");
    }
    Ok(())
}

enum Current {
    Text(String),
    Missing,
    /// Why it is left alone (a link, not a regular file, too large).
    Unusable(String),
}

const NOFOLLOW: OFlags = OFlags::NOFOLLOW
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Opens `name` in `etc` without following a link, if it is a regular file.
fn open_regular(etc: BorrowedFd<'_>, name: &str, flags: OFlags) -> Result<OwnedFd, Current> {
    let fd = match rustix::fs::openat(etc, name, flags | NOFOLLOW, Mode::from_raw_mode(0o644)) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(Current::Missing),
        Err(Errno::LOOP) => return Err(Current::Unusable("is a symbolic link".into())),
        Err(e) => return Err(Current::Unusable(format!("cannot be opened ({e})"))),
    };
    match rustix::fs::fstat(&fd) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::RegularFile =>
        {
            Ok(fd)
        }
        Ok(_) => Err(Current::Unusable("is not a regular file".into())),
        Err(e) => Err(Current::Unusable(format!("cannot be examined ({e})"))),
    }
}

fn read(etc: BorrowedFd<'_>, name: &str) -> io::Result<Current> {
    let fd = match open_regular(etc, name, OFlags::RDONLY) {
        Ok(fd) => fd,
        Err(c) => return Ok(c),
    };
    let mut text = String::new();
    let n = std::fs::File::from(fd)
        .take(MAX_FILE + 1)
        .read_to_string(&mut text);
    match n {
        Ok(n) if n as u64 > MAX_FILE => Ok(Current::Unusable(format!(
            "is larger than {} MiB",
            MAX_FILE >> 20
        ))),
        Ok(_) => Ok(Current::Text(text)),
        Err(e) => Ok(Current::Unusable(format!("cannot be read as text ({e})"))),
    }
}

/// Appends `text` to `name` in `etc`, or makes it (mode 0644) when `create`.
fn append(etc: BorrowedFd<'_>, name: &str, text: &str, create: bool) -> io::Result<()> {
    let flags = if create {
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL
    } else {
        OFlags::WRONLY | OFlags::APPEND
    };
    let fd = open_regular(etc, name, flags).map_err(|c| {
        let why = match c {
            Current::Unusable(why) => why,
            _ => "vanished".into(),
        };
        io::Error::other(format!("/etc/{name} {why}"))
    })?;
    if create {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644))?;
    }
    std::fs::File::from(fd)
        .write_all(text.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("writing /etc/{name}: {e}")))
}

/// Makes `home` (its last component; the parents too when `parents`, as for `/home/user`)
/// owned by `uid`:`gid` with mode 0755 when it is missing. An existing one is left as it is.
fn make_home(
    tree: &mut warren_fs::Beneath,
    home: &str,
    uid: u32,
    gid: u32,
    parents: bool,
) -> io::Result<()> {
    let rel = match warren_fs::check_relative(Path::new(home.trim_start_matches('/'))) {
        Ok(rel) if !rel.as_os_str().is_empty() && home.starts_with('/') => rel,
        // `/`, a relative or climbing path: nothing to make.
        _ => return Ok(()),
    };
    let (parent, name) = tree.parent(&rel, parents.then_some(0o755))?;
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
        Ok(()) => {}
        Err(Errno::EXIST) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let dir = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchown(
        dir.as_fd(),
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    rustix::fs::fchmod(dir.as_fd(), Mode::from_raw_mode(0o755))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_ONLY: &str = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/false\n";

    #[test]
    fn an_image_without_uid_1000_gets_user() {
        let p = plan(Some(ROOT_ONLY), Some("root:x:0:\n"), "/bin/bash");
        assert_eq!(
            p.passwd.as_deref(),
            Some("user:x:1000:1000:Warren sandbox user:/home/user:/bin/bash\n")
        );
        assert_eq!(p.group.as_deref(), Some("user:x:1000:\n"));
        assert_eq!(p.home, Some(("/home/user".into(), 1000, 1000)));
        // What the lookup then finds.
        let after = format!("{ROOT_ONLY}{}", p.passwd.unwrap());
        assert_eq!(
            find_default(&after),
            Some((
                "user".into(),
                1000,
                1000,
                "/home/user".into(),
                "/bin/bash".into()
            ))
        );
    }

    #[test]
    fn a_file_without_a_final_newline_gets_a_line_of_its_own() {
        let p = plan(
            Some("root:x:0:0::/root:/bin/sh"),
            Some("root:x:0:"),
            "/bin/sh",
        );
        assert!(p.passwd.unwrap().starts_with("\nuser:x:1000:"));
        assert_eq!(p.group.as_deref(), Some("\nuser:x:1000:\n"));
    }

    #[test]
    fn uid_1000_under_another_name_is_kept() {
        let passwd = format!("{ROOT_ONLY}alice:x:1000:1000::/home/alice:/bin/sh\n");
        let p = plan(Some(&passwd), Some("root:x:0:\n"), "/bin/sh");
        assert_eq!(p.passwd, None);
        assert_eq!(p.group, None, "the image's accounts are its own affair");
        assert_eq!(p.home, Some(("/home/alice".into(), 1000, 1000)));
        assert_eq!(find_default(&passwd).unwrap().0, "alice");
    }

    #[test]
    fn an_entry_named_user_is_kept_whatever_its_uid() {
        let passwd = format!("{ROOT_ONLY}user:x:1500:1500::/srv/u:/bin/sh\n");
        let p = plan(Some(&passwd), None, "/bin/sh");
        assert_eq!((p.passwd, p.group), (None, None));
        assert_eq!(p.home, Some(("/srv/u".into(), 1500, 1500)));
        // Named `user` wins over uid 1000.
        let both = format!("{passwd}bob:x:1000:1000::/home/bob:/bin/sh\n");
        assert_eq!(find_default(&both).unwrap().1, 1500);
    }

    #[test]
    fn a_taken_group_1000_or_name_is_not_added_again() {
        for group in ["root:x:0:\nstaff:x:1000:\n", "root:x:0:\nuser:x:1234:\n"] {
            let p = plan(Some(ROOT_ONLY), Some(group), "/bin/sh");
            assert!(p.passwd.is_some());
            assert_eq!(p.group, None, "{group}");
        }
    }

    #[test]
    fn missing_files_are_made_with_root_and_user() {
        let p = plan(None, None, "/bin/sh");
        assert_eq!(
            p.passwd.as_deref(),
            Some(
                "root:x:0:0:root:/root:/bin/sh\n\
                 user:x:1000:1000:Warren sandbox user:/home/user:/bin/sh\n"
            )
        );
        assert_eq!(p.group.as_deref(), Some("root:x:0:\nuser:x:1000:\n"));
    }

    #[test]
    fn malformed_lines_do_not_count() {
        // Too few fields, or a uid that is no number: not an account.
        let passwd = "root:x:0:0::/root:/bin/sh\nuser:x\nx:x:1000:oops::/:/bin/sh\n";
        assert!(find_default(passwd).is_none());
        assert!(plan(Some(passwd), Some(""), "/bin/sh").passwd.is_some());
    }

    #[test]
    fn provides_by_descriptor_and_leaves_links_alone() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/passwd"), ROOT_ONLY).unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\n").unwrap();
        try_provide(root).unwrap();
        let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.ends_with("user:x:1000:1000:Warren sandbox user:/home/user:/bin/sh\n"));
        assert!(
            std::fs::read_to_string(root.join("etc/group"))
                .unwrap()
                .ends_with("user:x:1000:\n")
        );
        assert!(root.join("home/user").is_dir());
        // Again: nothing changes.
        try_provide(root).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("etc/passwd")).unwrap(),
            passwd
        );

        // A passwd that is a link out of the tree is neither read nor written through.
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("passwd");
        std::fs::write(&target, ROOT_ONLY).unwrap();
        let linked = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(linked.path().join("etc")).unwrap();
        std::os::unix::fs::symlink(&target, linked.path().join("etc/passwd")).unwrap();
        try_provide(linked.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), ROOT_ONLY);
        // An /etc that is a link is refused.
        let etc_link = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), etc_link.path().join("etc")).unwrap();
        assert!(try_provide(etc_link.path()).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), ROOT_ONLY);
    }
}
