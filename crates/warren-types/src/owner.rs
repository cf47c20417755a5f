//! Who owns the files of an imported layer or a build's copy: `user`, `root` or `UID:GID`.

use crate::guest::{GraderSpec, SPAWNER_UID};

/// An owner: a uid and a gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The user id.
    pub uid: u32,
    /// The group id.
    pub gid: u32,
}

impl Owner {
    /// Parses `user` (1000:1000, the sandbox's default user), `root` (0:0) or numeric
    /// `UID:GID`; the ids the sandbox reserves for its spawner and grader are refused. The
    /// error says what to give instead.
    pub fn parse(s: &str) -> Result<Owner, String> {
        match s {
            "user" => {
                return Ok(Owner {
                    uid: 1000,
                    gid: 1000,
                });
            }
            "root" => return Ok(Owner { uid: 0, gid: 0 }),
            _ => {}
        }
        let parsed = s
            .split_once(':')
            .and_then(|(u, g)| Some((u.parse::<u32>().ok()?, g.parse::<u32>().ok()?)));
        let grader = GraderSpec::default().uid;
        let reserved = |id: u32| id == SPAWNER_UID || id == grader;
        match parsed {
            Some((uid, gid)) if reserved(uid) || reserved(gid) => Err(format!(
                "owner {s:?} names an id the sandbox reserves for its own processes (the \
                 spawner's {SPAWNER_UID}, the grader's {grader}): choose another"
            )),
            Some((uid, gid)) if uid < u32::MAX && gid < u32::MAX => Ok(Owner { uid, gid }),
            _ => Err(format!(
                "owner {s:?} is not valid: use `user` (uid 1000, the sandbox's default user), \
                 `root`, or numeric `UID:GID` such as `1000:1000`"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_parse_or_say_what_to_give() {
        assert_eq!(
            Owner::parse("user"),
            Ok(Owner {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!(Owner::parse("root"), Ok(Owner { uid: 0, gid: 0 }));
        assert_eq!(Owner::parse("4242:77"), Ok(Owner { uid: 4242, gid: 77 }));
        for bad in ["", "nobody", "1000", "1000:", "a:b", "-1:0", "4294967295:0"] {
            assert!(Owner::parse(bad).unwrap_err().contains("UID:GID"), "{bad}");
        }
        for reserved in ["61001:61001", "1000:61000"] {
            assert!(
                Owner::parse(reserved).unwrap_err().contains("reserves"),
                "{reserved}"
            );
        }
    }
}
