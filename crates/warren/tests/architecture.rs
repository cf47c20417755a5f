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
    for d in ["warren-sys", "warren-node", "warren-guest", "warren-net"] {
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
    // The E2B gateway is a client of the public API, nothing more.
    for d in [
        "warren-sys",
        "warren-node",
        "warren-control",
        "warren-net",
        "warren-guest",
    ] {
        assert!(!has("warren-e2b", d), "warren-e2b must not depend on {d}");
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

/// The node crate's modules, keyed like `exec` or `trajectory::log`, with the modules each one
/// names in its code (`crate::…` paths outside comments).
fn node_modules() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../warren-node/src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let key_of = |p: &std::path::Path| {
        let rel = p.strip_prefix(&src).unwrap().with_extension("");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|c| c != "mod")
            .collect();
        parts.join("::")
    };
    let keys: BTreeSet<String> = files.iter().map(|p| key_of(p)).collect();
    let mut out = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let me = key_of(f);
        let mut uses = BTreeSet::new();
        for (first, second) in crate_paths(&code) {
            let k = match second {
                Some(second) if keys.contains(&format!("{first}::{second}")) => {
                    format!("{first}::{second}")
                }
                _ => first,
            };
            if k != me && keys.contains(&k) {
                uses.insert(k);
            }
        }
        out.insert(me, (code, uses));
    }
    out
}

/// The first one or two names of each `crate::a::b` path in `code`.
fn crate_paths(code: &str) -> Vec<(String, Option<String>)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let first = ident(rest);
        if first.is_empty() {
            continue;
        }
        let after = &rest[first.len()..];
        let second = after
            .strip_prefix("::")
            .map(ident)
            .filter(|s| !s.is_empty());
        out.push((first, second));
    }
    out
}

#[test]
fn node_modules_stand_in_layers_without_loops() {
    let mods = node_modules();
    let group = |m: &str| -> u8 {
        const FOUNDATION: &[&str] = &[
            "admission",
            "capacity",
            "config",
            "disk",
            "error",
            "events",
            "guest_bin",
            "images",
            "layers",
            "pending",
            "phase",
            "state",
            "validate",
            "trajectory::log",
            "workers",
        ];
        if FOUNDATION.contains(&m) {
            0
        } else if m == "backend" {
            1
        } else if m == "container" || m.starts_with("container::") {
            2
        } else if m == "node" || m == "guest_client" {
            3
        } else {
            4
        }
    };
    for (m, (code, uses)) in &mods {
        for u in uses {
            let (gm, gu) = (group(m), group(u));
            match gm {
                // Foundations and the seam look only downwards.
                0 | 1 => assert!(gu < gm || (gm == 0 && gu == 0), "{m} must not use {u}"),
                // The container backend sees the seam and the foundations, nothing above.
                2 => assert!(gu <= 2, "{m} (a backend) must not use {u}"),
                // The node's core holds any backend through the trait alone.
                3 => assert!(gu <= 1 || gu == 3, "{m} must not use {u}"),
                // Operations above it too: only the daemon's start picks the backend.
                _ => assert!(
                    gu != 2 || m == "lib",
                    "{m} must not name the container backend"
                ),
            }
        }
        // The node's domain knows nothing of HTTP: the API module turns it into answers.
        if m != "api" {
            for word in ["warren_http", "axum"] {
                assert!(
                    !code.contains(word),
                    "{m} names {word}: only the API module may"
                );
            }
        }
        // Nothing above the seam names what a backend isolates with.
        if group(m) >= 3 && m != "lib" {
            for word in ["pidfd", "SandboxCgroup", "Cgroups", "cgroups::"] {
                assert!(!code.contains(word), "{m} names {word}: only a backend may");
            }
        }
    }
    // No loops: every module can be put below all the modules it uses.
    let mut placed: BTreeSet<String> = BTreeSet::new();
    loop {
        let ready: Vec<String> = mods
            .iter()
            .filter(|(m, (_, uses))| {
                !placed.contains(*m) && uses.iter().all(|u| placed.contains(u))
            })
            .map(|(m, _)| m.clone())
            .collect();
        if ready.is_empty() {
            break;
        }
        placed.extend(ready);
    }
    let stuck: Vec<_> = mods
        .iter()
        .filter(|(m, _)| !placed.contains(*m))
        .map(|(m, (_, uses))| format!("{m} -> {uses:?}"))
        .collect();
    assert!(
        stuck.is_empty(),
        "node modules import each other in a loop: {stuck:#?}"
    );
}
