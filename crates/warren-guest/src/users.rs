//! Who a command or file operation acts as, from the sandbox's own `/etc/passwd`.

use warren_types::error::ErrorCode;

use crate::wire::OpError;

/// A user account inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// Largest `/etc/passwd` read.
const MAX_PASSWD: u64 = 4 << 20;

/// Looks `who` (a name or a numeric uid) up in `/etc/passwd`. The sandbox owns that file: a
/// FIFO or device planted there is refused without a read, and at most 4 MiB is read.
pub fn lookup(who: &str) -> Result<User, OpError> {
    let passwd = crate::files::read_small("/etc/passwd", MAX_PASSWD).unwrap_or_default();
    find(&passwd, who).ok_or_else(|| {
        OpError::new(
            ErrorCode::InvalidArgument,
            format!("user {who:?} does not exist in the sandbox's /etc/passwd; use \"user\" (uid 1000), \"root\", or a numeric uid"),
        )
    })
}

fn find(passwd: &str, who: &str) -> Option<User> {
    let by_uid: Option<u32> = who.parse().ok();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
            continue;
        };
        if f[0] == who || by_uid == Some(uid) {
            return Some(User {
                name: f[0].to_string(),
                uid,
                gid,
                home: f[5].to_string(),
                shell: f[6].to_string(),
            });
        }
    }
    // A numeric uid without an entry still works, as in any container runtime.
    by_uid.map(|uid| User {
        name: uid.to_string(),
        uid,
        gid: uid,
        home: "/".to_string(),
        shell: "/bin/sh".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\nbroken line\n";

    #[test]
    fn finds_by_name_and_uid() {
        assert_eq!(find(PASSWD, "user").unwrap().uid, 1000);
        assert_eq!(find(PASSWD, "0").unwrap().name, "root");
        assert_eq!(find(PASSWD, "1000").unwrap().home, "/home/user");
        assert_eq!(find(PASSWD, "4242").unwrap().gid, 4242);
        assert!(find(PASSWD, "nobody").is_none());
    }
}
