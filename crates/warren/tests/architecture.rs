//! The dependency rules of ARCHITECTURE.md, checked against `cargo metadata`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every crate each workspace crate depends on, directly or not (normal dependencies only).
fn closure(meta: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let name_of: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut direct: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| d["pkg"].as_str().unwrap().to_string())
            .collect();
        direct.insert(node["id"].as_str().unwrap().to_string(), deps);
    }
    let mut out = BTreeMap::new();
    for member in meta["workspace_members"].as_array().unwrap() {
        let mut seen = BTreeSet::new();
        let mut stack = vec![member.as_str().unwrap().to_string()];
        while let Some(id) = stack.pop() {
            for d in direct.get(&id).into_iter().flatten() {
                if seen.insert(name_of[d].clone()) {
                    stack.push(d.clone());
                }
            }
        }
        out.insert(name_of[member.as_str().unwrap()].clone(), seen);
    }
    out
}

#[test]
fn dependencies_point_one_way() {
    let deps = closure(&metadata());
    let has = |krate: &str, dep: &str| deps[krate].contains(dep);

    // Types at the bottom: no I/O, no async runtime, no other Warren crate.
    for d in ["tokio", "warren-sys", "axum", "reqwest"] {
        assert!(
            !has("warren-types", d),
            "warren-types must not depend on {d}"
        );
    }
    // The control plane runs on any host: never the syscall layer or a backend.
    for d in ["warren-sys", "warren-node", "warren-guest"] {
        assert!(
            !has("warren-control", d),
            "warren-control must not depend on {d}"
        );
    }
    // The guest agent ships into every sandbox: types, the syscall layer and the descriptor-based
    // file operations only, no HTTP, no database.
    let warren_deps: Vec<&String> = deps["warren-guest"]
        .iter()
        .filter(|d| d.starts_with("warren-"))
        .collect();
    assert_eq!(
        warren_deps,
        ["warren-fs", "warren-sys", "warren-types"],
        "warren-guest's Warren dependencies"
    );
    for d in ["axum", "hyper", "reqwest", "sqlx"] {
        assert!(
            !has("warren-guest", d),
            "warren-guest must not depend on {d}"
        );
    }
    // The SDK speaks HTTP only.
    for d in ["warren-sys", "warren-node", "warren-control"] {
        assert!(!has("warren-sdk", d), "warren-sdk must not depend on {d}");
    }
    // File operations on trees others control: rustix only, so the control plane (imports),
    // the node and the guest can all use them.
    assert!(
        !deps["warren-fs"]
            .iter()
            .any(|d| d.starts_with("warren-") || d == "tokio"),
        "warren-fs depends on no Warren crate and no async runtime"
    );
    // The syscall layer sits below everything.
    assert!(!deps["warren-sys"].iter().any(|d| d.starts_with("warren-")));
}

#[test]
fn only_the_syscall_layer_may_use_unsafe() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "warren-sys" {
            assert!(
                text.contains("undocumented_unsafe_blocks = \"deny\""),
                "warren-sys must demand SAFETY comments"
            );
        } else {
            // The workspace lints forbid unsafe code.
            assert!(
                text.contains("[lints]\nworkspace = true"),
                "{name} must use the workspace lints (unsafe_code = forbid)"
            );
        }
    }
    let ws = std::fs::read_to_string(root.join("../Cargo.toml")).unwrap();
    assert!(ws.contains("unsafe_code = \"forbid\""));
}
