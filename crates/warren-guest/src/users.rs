//! Who a command or file operation acts as, from the sandbox's own `/etc/passwd`.

use std::sync::OnceLock;

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

/// Ids of the platform's own (the grader's, the spawner's): no agent command or file
/// operation runs as one, whatever the sandbox's `/etc/passwd` says (the sandbox writes it).
static RESERVED: OnceLock<Vec<u32>> = OnceLock::new();

/// Sets the reserved ids beside the spawner's (once, at start).
pub fn reserve(ids: &[u32]) {
    let mut all = vec![crate::spawner::SPAWNER_UID, warren_types::guest::KILLER_UID];
    all.extend_from_slice(ids);
    let _ = RESERVED.set(all);
}

fn reserved(id: u32) -> bool {
    id == crate::spawner::SPAWNER_UID
        || id == warren_types::guest::KILLER_UID
        || RESERVED.get().is_some_and(|r| r.contains(&id))
}

/// Looks `who` (a name or a numeric uid) up in `/etc/passwd`. The sandbox owns that file: a
/// FIFO or device planted there is refused without a read, and at most 4 MiB is read.
///
/// The name `user` (the default) resolves to the entry of that name, else to the image's
/// uid 1000 whatever it is called ([`crate::default_user`] makes sure there is one).
pub fn lookup(who: &str) -> Result<User, OpError> {
    let (passwd, unreadable) = match crate::files::read_small("/etc/passwd", MAX_PASSWD) {
        Ok(text) => (text, None),
        Err(e) => (String::new(), Some(e.message)),
    };
    let user = find(&passwd, who).ok_or_else(|| not_found(who, unreadable.as_deref()))?;
    check_not_reserved(&user)?;
    Ok(user)
}

/// What a user who is not there is told: what was looked up, where, and what to run as instead.
fn not_found(who: &str, unreadable: Option<&str>) -> OpError {
    let looked = match unreadable {
        Some(why) => format!(
            "the sandbox's /etc/passwd cannot be read ({why}), so no account {who:?} is known"
        ),
        None if who == crate::default_user::NAME => format!(
            "the sandbox's /etc/passwd has no account {who:?} and none with uid {} (the \
             runtime adds one at start unless the file is unusable; something removed it)",
            crate::default_user::UID
        ),
        None => {
            format!("the image defines no account {who:?}: it is not in the sandbox's /etc/passwd")
        }
    };
    OpError::new(
        ErrorCode::InvalidArgument,
        format!(
            "{looked}; run as \"root\" or as a numeric uid (such as \"1000\"), or add the account to the image"
        ),
    )
}

fn check_not_reserved(user: &User) -> Result<(), OpError> {
    for (what, id) in [("uid", user.uid), ("gid", user.gid)] {
        if reserved(id) {
            return Err(OpError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "user {:?} has {what} {id}, which the platform reserves for its own processes \
                     (the grader role and the command spawner); run as another user",
                    user.name
                ),
            ));
        }
    }
    Ok(())
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
    if who == crate::default_user::NAME {
        return crate::default_user::find_default(passwd).map(|(name, uid, gid, home, shell)| {
            User {
                name,
                uid,
                gid,
                home,
                shell,
            }
        });
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

    #[test]
    fn the_default_name_resolves_to_uid_1000_whatever_it_is_called() {
        let passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        let u = find(passwd, "user").unwrap();
        assert_eq!(
            (u.name.as_str(), u.uid, u.home.as_str()),
            ("alice", 1000, "/home/alice")
        );
        assert_eq!(find(passwd, "alice").unwrap().uid, 1000);
        assert!(find("root:x:0:0::/root:/bin/sh\n", "user").is_none());
    }

    #[test]
    fn a_missing_account_is_named_with_what_to_do() {
        let e = not_found("bob", None);
        assert!(e.message.contains("no account \"bob\""), "{}", e.message);
        assert!(e.message.contains("\"root\"") && e.message.contains("numeric uid"));
        // The default user's message does not suggest the default user.
        let e = not_found("user", None);
        assert!(e.message.contains("uid 1000"), "{}", e.message);
        assert!(!e.message.contains("use \"user\""), "{}", e.message);
        let e = not_found("user", Some("/etc/passwd is a FIFO, not a regular file"));
        assert!(e.message.contains("cannot be read"), "{}", e.message);
    }

    #[test]
    fn platform_ids_are_refused_by_number_and_by_a_planted_name() {
        reserve(&[61000]);
        let planted = "evil:x:61000:100::/:/bin/sh\nsneaky:x:100:61001::/:/bin/sh\n";
        for who in ["evil", "sneaky", "61000", "61001"] {
            let u = find(planted, who).unwrap();
            let e = check_not_reserved(&u).unwrap_err();
            assert!(e.message.contains("reserves"), "{who}: {}", e.message);
        }
        assert!(check_not_reserved(&find(PASSWD, "user").unwrap()).is_ok());
    }
}
