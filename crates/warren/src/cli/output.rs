//! How results are printed: borderless tables for people, pretty JSON for `--json`.

use std::collections::BTreeMap;

use comfy_table::{Cell, Table, presets};
use serde::Serialize;

/// Prints a value as pretty JSON on stdout.
pub fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// One warning line on stderr per node that did not answer, saying what that means for what
/// was printed (`so`: "its sandboxes are missing").
pub fn warn_unreachable(unreachable: &[warren_sdk::NodeFailure], so: &str) {
    for line in unreachable_lines(unreachable, so) {
        eprintln!("{line}");
    }
}

fn unreachable_lines(unreachable: &[warren_sdk::NodeFailure], so: &str) -> Vec<String> {
    unreachable
        .iter()
        .map(|f| {
            format!(
                "warning: node {} did not answer, so {so}: {}",
                f.node, f.error.message
            )
        })
        .collect()
}

/// A table with these column headers, drawn without borders (like `docker ps`).
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.iter().map(Cell::new));
    for col in t.column_iter_mut() {
        col.set_padding((0, 3));
    }
    t
}

/// Two columns, name and value, without a header (for one object).
pub fn fields(rows: &[(&str, String)]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    for (name, value) in rows {
        t.add_row([Cell::new(name), Cell::new(value)]);
    }
    for col in t.column_iter_mut() {
        col.set_padding((0, 3));
    }
    t
}

/// Prints a table without trailing spaces.
pub fn print(table: &Table) {
    for line in table.lines() {
        println!("{}", line.trim_end());
    }
}

/// `k=v,k2=v2`, or `-` when there are none.
pub fn labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A value or `-`.
pub fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_string()
}

/// Millicores as people read them: `1000m` is `1`, `500m` is `0.5`.
pub fn cpu(millicores: u32) -> String {
    if millicores.is_multiple_of(1000) {
        format!("{}", millicores / 1000)
    } else {
        format!("{}", f64::from(millicores) / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_have_no_borders_and_no_trailing_space() {
        let mut t = table(&["ID", "STATE"]);
        t.add_row(["abc", "running"]);
        let lines: Vec<String> = t.lines().map(|l| l.trim_end().to_string()).collect();
        assert_eq!(lines, vec!["ID    STATE", "abc   running"]);
    }

    #[test]
    fn each_node_that_did_not_answer_gets_a_warning_naming_it() {
        let f = |node: &str| warren_sdk::NodeFailure {
            node: node.parse().unwrap(),
            error: warren_sdk::ApiError::new(warren_sdk::ErrorCode::Unavailable, "timed out"),
        };
        assert_eq!(
            unreachable_lines(&[f("nodebb"), f("nodecc")], "its sandboxes are missing"),
            vec![
                "warning: node nodebb did not answer, so its sandboxes are missing: timed out",
                "warning: node nodecc did not answer, so its sandboxes are missing: timed out",
            ]
        );
        assert!(unreachable_lines(&[], "its sandboxes are missing").is_empty());
    }

    #[test]
    fn small_values_read_naturally() {
        assert_eq!(cpu(1000), "1");
        assert_eq!(cpu(2500), "2.5");
        assert_eq!(cpu(250), "0.25");
        assert_eq!(labels(&BTreeMap::new()), "-");
        let m = BTreeMap::from([("b".to_string(), "2".to_string()), ("a".into(), "1".into())]);
        assert_eq!(labels(&m), "a=1,b=2");
    }
}
