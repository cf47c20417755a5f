//! Value parsers that several commands share: `key=value` pairs and durations in seconds.

use std::collections::BTreeMap;

/// Parses `KEY=VALUE` (`--label`, `--env`); the value may itself contain `=`.
pub fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        Some(_) => Err(format!("{s:?} has no key before '=': write KEY=VALUE")),
        None => Err(format!(
            "{s:?} is not KEY=VALUE: add '=' and a value, e.g. {s}=1"
        )),
    }
}

/// Collects repeated `KEY=VALUE` flags; a key given twice keeps its last value.
pub fn to_map(pairs: Vec<(String, String)>) -> BTreeMap<String, String> {
    pairs.into_iter().collect()
}

/// Parses a number of seconds such as `30` or `1.5` (`exec --timeout`).
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds: write e.g. 30 or 1.5 (0 means no limit)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_split_at_the_first_equals_sign() {
        assert_eq!(key_value("a=1").unwrap(), ("a".into(), "1".into()));
        assert_eq!(key_value("URL=x=y").unwrap(), ("URL".into(), "x=y".into()));
        assert_eq!(key_value("empty=").unwrap(), ("empty".into(), "".into()));
        assert!(key_value("novalue").unwrap_err().contains("not KEY=VALUE"));
        assert!(key_value("=v").unwrap_err().contains("no key"));
    }

    #[test]
    fn later_keys_win() {
        let m = to_map(vec![("a".into(), "1".into()), ("a".into(), "2".into())]);
        assert_eq!(m.get("a").map(String::as_str), Some("2"));
    }

    #[test]
    fn seconds_are_non_negative_numbers() {
        assert_eq!(seconds("30").unwrap(), 30.0);
        assert_eq!(seconds("0.5").unwrap(), 0.5);
        for bad in ["-1", "inf", "NaN", "10s", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
