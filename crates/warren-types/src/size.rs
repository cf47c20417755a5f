//! Byte sizes as people write them: `1048576`, `512Mi`, `1G`, `64MiB`, `2gb`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes. Parses integers and strings with a binary (`Ki`, `Mi`, `Gi`, `Ti`, also
/// `K`, `M`, `G`, `T`, optionally followed by `B`/`iB`) suffix; serialises as an integer.
///
/// Suffixes are powers of 1024 whether or not the `i` is written: nobody sizes sandbox memory
/// in powers of ten, and one meaning per letter is easier to remember.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// One mebibyte.
    pub const MIB: u64 = 1 << 20;
    /// One gibibyte.
    pub const GIB: u64 = 1 << 30;

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            ("Ti", 1u64 << 40),
            ("Gi", 1 << 30),
            ("Mi", 1 << 20),
            ("Ki", 1 << 10),
        ];
        for (name, unit) in units {
            if self.0 >= unit && self.0.is_multiple_of(unit) {
                return write!(f, "{}{}", self.0 / unit, name);
            }
        }
        for (name, unit) in units {
            if self.0 >= unit {
                return write!(f, "{:.1}{}", self.0 as f64 / unit as f64, name);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || {
            format!(
                "{s:?} is not a size: write bytes as an integer or with a suffix, e.g. 512Mi or 2G"
            )
        };
        if num.is_empty() {
            return Err(bad());
        }
        let n: u64 = num.parse().map_err(|_| bad())?;
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "ki" | "kb" | "kib" => 10,
            "m" | "mi" | "mb" | "mib" => 20,
            "g" | "gi" | "gb" | "gib" => 30,
            "t" | "ti" | "tb" | "tib" => 40,
            _ => return Err(bad()),
        };
        n.checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n >= 0 => Ok(ByteSize(n as u64)),
            Raw::Int(n) => Err(serde::de::Error::custom(format!(
                "{n} is negative: a size must be zero or more bytes"
            ))),
            Raw::Str(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(feature = "openapi")]
mod schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    use utoipa::openapi::{RefOr, Schema};
    use utoipa::{PartialSchema, ToSchema};

    impl PartialSchema for super::ByteSize {
        fn schema() -> RefOr<Schema> {
            OneOfBuilder::new()
                .item(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)))
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some("^[0-9]+ *([KkMmGgTt]i?[Bb]?|[Bb])?$")),
                )
                .description(Some(
                    "Bytes: an integer, or a string with a binary suffix such as \"512Mi\" or \"2G\".",
                ))
                .into()
        }
    }
    impl ToSchema for super::ByteSize {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_write() {
        assert_eq!("1048576".parse::<ByteSize>().unwrap().0, 1 << 20);
        assert_eq!("512Mi".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("512M".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("2G".parse::<ByteSize>().unwrap().0, 2 << 30);
        assert_eq!("64MiB".parse::<ByteSize>().unwrap().0, 64 << 20);
        assert_eq!("1 gb".parse::<ByteSize>().unwrap().0, 1 << 30);
        for bad in ["", "-1", "1.5G", "12X", "G", "99999999999999999999T"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn json_accepts_integers_and_strings_but_not_negatives() {
        assert_eq!(serde_json::from_str::<ByteSize>("1024").unwrap().0, 1024);
        assert_eq!(serde_json::from_str::<ByteSize>("\"1Ki\"").unwrap().0, 1024);
        let err = serde_json::from_str::<ByteSize>("-5")
            .unwrap_err()
            .to_string();
        assert!(err.contains("negative"), "{err}");
    }

    #[test]
    fn displays_compactly() {
        assert_eq!(ByteSize(512 << 20).to_string(), "512Mi");
        assert_eq!(ByteSize(1536 << 20).to_string(), "1536Mi");
        assert_eq!(ByteSize((3 << 29) + 7).to_string(), "1.5Gi");
        assert_eq!(ByteSize(100).to_string(), "100");
    }
}
