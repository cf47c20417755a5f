//! Node and sandbox identifiers.
//!
//! A sandbox id is a valid DNS label made of lower-case letters and digits only, so that
//! E2B-style host routing (`<port>-<id>.<domain>`) can carry it, and it encodes the node that
//! runs the sandbox, so routing a request needs no lookup:
//!
//! ```text
//!  n7k2q9 x0c4m1z7p4w6ab
//!  └node┘ └──random───┘      20 characters, [a-z][a-z0-9]{19}
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Length of a node id.
pub const NODE_ID_LEN: usize = 6;
/// Length of the random part of a sandbox id.
pub const SANDBOX_RANDOM_LEN: usize = 14;
/// Length of a whole sandbox id.
pub const SANDBOX_ID_LEN: usize = NODE_ID_LEN + SANDBOX_RANDOM_LEN;

const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidId {
    kind: &'static str,
    value: String,
    expected: String,
}

impl fmt::Display for InvalidId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.value.chars().take(64).collect();
        write!(
            f,
            "{:?} is not a valid {} id: {}",
            shown, self.kind, self.expected
        )
    }
}

impl std::error::Error for InvalidId {}

fn check(kind: &'static str, s: &str, len: usize) -> Result<(), InvalidId> {
    let bad = |why: &str| InvalidId {
        kind,
        value: s.to_string(),
        expected: why.to_string(),
    };
    if s.len() != len {
        return Err(bad(&format!(
            "expected {len} characters, got {}",
            s.chars().count()
        )));
    }
    let b = s.as_bytes();
    if !b[0].is_ascii_lowercase() {
        return Err(bad("it must start with a lower-case letter"));
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Err(bad("only lower-case letters and digits are allowed"));
    }
    Ok(())
}

/// Maps random bytes onto `[a-z0-9]`, the first character always a letter.
fn encode(random: &[u8], out: &mut String) {
    for (i, byte) in random.iter().enumerate() {
        let c = if i == 0 && out.is_empty() {
            ALPHABET[(*byte as usize) % 26]
        } else {
            ALPHABET[(*byte as usize) % 36]
        };
        out.push(c as char);
    }
}

/// The identity of a node: six lower-case letters and digits, starting with a letter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(String);

impl NodeId {
    /// A node id from six random bytes.
    pub fn from_random(random: [u8; NODE_ID_LEN]) -> Self {
        let mut s = String::with_capacity(NODE_ID_LEN);
        encode(&random, &mut s);
        NodeId(s)
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for NodeId {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, InvalidId> {
        check("node", s, NODE_ID_LEN)?;
        Ok(NodeId(s.to_string()))
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The identity of a sandbox; its first six characters are its node's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

impl SandboxId {
    /// A new sandbox id on `node`, from fourteen random bytes.
    pub fn new(node: &NodeId, random: [u8; SANDBOX_RANDOM_LEN]) -> Self {
        let mut s = String::with_capacity(SANDBOX_ID_LEN);
        s.push_str(node.as_str());
        encode(&random, &mut s);
        SandboxId(s)
    }

    /// The node this sandbox runs on.
    pub fn node(&self) -> NodeId {
        NodeId(self.0[..NODE_ID_LEN].to_string())
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SandboxId {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, InvalidId> {
        check("sandbox", s, SANDBOX_ID_LEN)?;
        Ok(SandboxId(s.to_string()))
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! serde_as_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_as_string!(NodeId);
serde_as_string!(SandboxId);

#[cfg(feature = "openapi")]
mod schema {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{RefOr, Schema};
    use utoipa::{PartialSchema, ToSchema};

    impl PartialSchema for super::SandboxId {
        fn schema() -> RefOr<Schema> {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[a-z][a-z0-9]{19}$"))
                .description(Some(
                    "Sandbox id: 20 lower-case letters and digits; the first six name its node.",
                ))
                .into()
        }
    }
    impl ToSchema for super::SandboxId {}

    impl PartialSchema for super::NodeId {
        fn schema() -> RefOr<Schema> {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[a-z][a-z0-9]{5}$"))
                .description(Some("Node id: 6 lower-case letters and digits."))
                .into()
        }
    }
    impl ToSchema for super::NodeId {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_id_encodes_its_node_and_is_a_dns_label() {
        let node = NodeId::from_random([200, 1, 2, 3, 4, 5]);
        let id = SandboxId::new(&node, [255; SANDBOX_RANDOM_LEN]);
        assert_eq!(id.as_str().len(), SANDBOX_ID_LEN);
        assert_eq!(id.node(), node);
        assert!(
            id.as_str()
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_eq!(id.as_str().parse::<SandboxId>().unwrap(), id);
    }

    #[test]
    fn malformed_ids_are_rejected_with_the_reason() {
        for (bad, why) in [
            ("", "expected 20 characters"),
            ("ABCDEFGHIJKLMNOPQRST", "start with a lower-case letter"),
            ("abcdefghij-lmnopqrst", "only lower-case letters and digits"),
            ("1bcdefghijklmnopqrst", "start with a lower-case letter"),
            ("abc", "expected 20 characters"),
            ("abcdefghijklmnopqrsté", "expected 20 characters"),
        ] {
            let err = bad.parse::<SandboxId>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn ids_round_trip_through_json() {
        let id: SandboxId = "abcdef0123456789wxyz".parse().unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"abcdef0123456789wxyz\"");
        assert_eq!(serde_json::from_str::<SandboxId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<SandboxId>("\"../etc/passwd\"").is_err());
    }
}
