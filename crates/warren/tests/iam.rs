//! IAM through the real API: an authorisation matrix (each permission against sandboxes of the
//! key's own project, a child, the parent, a sibling and an unrelated project), roles that do
//! not cross (runner / builder / viewer), bounded delegation, and revocation.

mod common;

use common::Platform;
use warren_sdk::{Client, CreateKey, CreateSandbox, ErrorCode, NetworkPolicy, TaskAction, shell};

fn in_project(project: &str) -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        task: Some("shared-task".into()),
        project: Some(project.into()),
        ..Default::default()
    }
}

/// A key of a new identity `name` holding `role` on `project` (bound there), made by `admin`.
async fn key_for(admin: &Client, url: &str, name: &str, project: &str, role: &str) -> Client {
    admin
        .create_identity(&warren_sdk::CreateIdentity {
            name: name.into(),
            kind: None,
            project: Some(project.into()),
        })
        .await
        .unwrap();
    admin.grant(name, project, role).await.unwrap();
    let k = admin
        .create_key(&CreateKey {
            name: name.into(),
            identity: Some(name.into()),
            project: Some(project.into()),
            role: Some(role.into()),
            expires_in: None,
            form: None,
        })
        .await
        .unwrap();
    assert!(k.secret.starts_with("wrn_"));
    Client::new(url, Some(&k.secret)).unwrap()
}

fn code<T: std::fmt::Debug>(r: warren_sdk::Result<T>) -> Option<ErrorCode> {
    match r {
        Ok(_) => None,
        Err(e) => Some(e.code().unwrap_or_else(|| panic!("no API error: {e}"))),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authorisation_matrix_holds_through_the_api() {
    require_root!();
    let p = Platform::start();
    let admin = p.client();
    for path in ["root/a", "root/a/child", "root/b", "root/u", "root/u/x"] {
        admin.create_project(path).await.unwrap();
    }
    // One sandbox in each place, relative to a key on root/a.
    let places = [
        ("own", "root/a", true),
        ("child", "root/a/child", true),
        ("parent", "root", false),
        ("sibling", "root/b", false),
        ("unrelated", "root/u/x", false),
    ];
    let mut sandboxes = Vec::new();
    for (what, project, _) in places {
        let sb = admin.create(&in_project(project)).await.unwrap();
        assert_eq!(sb.snapshot().unwrap().project, project, "{what}");
        sandboxes.push(sb.id().to_string());
    }
    let runner = key_for(&admin, &p.url, "ka", "root/a", "runner").await;
    let who = runner.whoami().await.unwrap();
    assert_eq!(
        (who.identity.as_str(), who.project.as_str()),
        ("ka", "root/a")
    );

    for ((what, project, allowed), id) in places.iter().zip(&sandboxes) {
        let sb = runner.sandbox(id).unwrap();
        // Allowed: every operation works. Denied: every one is a 404, as if it did not exist.
        let want = if *allowed {
            None
        } else {
            Some(ErrorCode::SandboxNotFound)
        };
        assert_eq!(code(sb.info().await), want, "{what}: get");
        assert_eq!(code(sb.exec(&shell("true")).await), want, "{what}: exec");
        assert_eq!(
            code(sb.write_file("/tmp/x", b"x".to_vec()).await),
            want,
            "{what}: files"
        );
        assert_eq!(code(sb.network().await), want, "{what}: network");
        assert_eq!(
            code(sb.set_network(&NetworkPolicy::none()).await),
            want,
            "{what}: set network"
        );
        assert_eq!(code(sb.metrics().await), want, "{what}: metrics");
        assert_eq!(code(sb.pause().await), want, "{what}: pause");
        assert_eq!(code(sb.resume().await), want, "{what}: resume");
        // Creating there.
        let want_create = if *allowed {
            None
        } else {
            Some(ErrorCode::PermissionDenied)
        };
        match runner.create(&in_project(project)).await {
            Ok(s) => {
                assert_eq!(want_create, None, "{what}: create");
                s.kill().await.unwrap();
            }
            Err(e) => assert_eq!(e.code(), want_create, "{what}: create: {e}"),
        }
    }
    // Lists show only its subtree's, and task operations touch only those.
    let listed: Vec<String> = runner
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    let mut mine = sandboxes[..2].to_vec();
    mine.sort();
    let mut got = listed.clone();
    got.sort();
    assert_eq!(got, mine);
    let t = runner
        .task_action("shared-task", TaskAction::Pause)
        .await
        .unwrap();
    assert_eq!(t.answer.succeeded, 2, "{t:?}");
    let all = admin.list(&Default::default()).await.unwrap().items;
    for s in &all {
        let paused = s.state == warren_sdk::SandboxState::Paused;
        assert_eq!(paused, s.project.starts_with("root/a"), "{s:?}");
    }
    runner
        .task_action("shared-task", TaskAction::Resume)
        .await
        .unwrap();
    // Kill last (a denied kill is a 404 too).
    for ((what, _, allowed), id) in places.iter().zip(&sandboxes) {
        let want = if *allowed {
            None
        } else {
            Some(ErrorCode::SandboxNotFound)
        };
        assert_eq!(
            code(runner.sandbox(id).unwrap().kill().await),
            want,
            "{what}: kill"
        );
    }
    // Nothing of the others' was touched.
    let left: Vec<String> = admin
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    for id in &sandboxes[2..] {
        assert!(left.contains(id), "{id} survived");
    }

    // A viewer sees but may not act: 403 (it may know the sandbox exists), and 404 outside.
    let viewer = key_for(&admin, &p.url, "va", "root/a", "viewer").await;
    let own = admin.create(&in_project("root/a")).await.unwrap();
    let vs = viewer.sandbox(own.id().as_str()).unwrap();
    assert_eq!(code(vs.info().await), None);
    assert_eq!(
        code(vs.exec(&shell("true")).await),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(code(vs.kill().await), Some(ErrorCode::PermissionDenied));
    let sib = viewer.sandbox(&sandboxes[3]).unwrap();
    assert_eq!(code(sib.info().await), Some(ErrorCode::SandboxNotFound));
    assert_eq!(
        code(viewer.create(&in_project("root/a")).await.map(|_| ())),
        Some(ErrorCode::PermissionDenied)
    );

    // Builders build, runners run: neither holds the other's.
    let builder = key_for(&admin, &p.url, "ba", "root", "builder").await;
    assert_eq!(
        code(builder.create(&in_project("root")).await.map(|_| ())),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(code(builder.images().await), None);
    assert_eq!(
        code(runner.remove_image("nothing/here:1").await),
        Some(ErrorCode::PermissionDenied)
    );
    // Cluster operations are the admin's.
    assert_eq!(
        code(runner.cordon("abcdef", true).await),
        Some(ErrorCode::PermissionDenied)
    );

    // Delegation: a runner makes no keys; a project admin of root/a makes them below, of
    // what it holds, and nowhere else.
    let made = runner
        .create_key(&CreateKey {
            name: "x".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(made), Some(ErrorCode::PermissionDenied));
    let (lead, lead_secret) = {
        admin
            .create_identity(&warren_sdk::CreateIdentity {
                name: "lead".into(),
                kind: None,
                project: Some("root/a".into()),
            })
            .await
            .unwrap();
        admin
            .grant("lead", "root/a", "project-admin")
            .await
            .unwrap();
        let k = admin
            .create_key(&CreateKey {
                name: "lead".into(),
                identity: Some("lead".into()),
                project: Some("root/a".into()),
                role: Some("project-admin".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        (Client::new(&p.url, Some(&k.secret)).unwrap(), k.secret)
    };
    let job = lead
        .create_key(&CreateKey {
            name: "job".into(),
            project: Some("root/a/child".into()),
            role: Some("runner".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let e = lead
        .create_key(&CreateKey {
            name: "job".into(),
            project: Some("root/a".into()),
            role: Some("admin".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    assert_eq!(
        code(lead.grant("ka", "root/b", "runner").await),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        code(lead.create_project("root/b/x").await),
        Some(ErrorCode::PermissionDenied)
    );
    lead.create_project("root/a/child/run-1").await.unwrap();
    // The job key works in its subtree only.
    let job_client = Client::new(&p.url, Some(&job.secret)).unwrap();
    let sb = job_client
        .create(&in_project("root/a/child/run-1"))
        .await
        .unwrap();
    assert_eq!(
        code(job_client.create(&in_project("root/a")).await.map(|_| ())),
        Some(ErrorCode::PermissionDenied)
    );
    // Revoked: refused at once on this replica.
    lead.revoke_key(&job.key.id).await.unwrap();
    let e = job_client
        .sandbox(sb.id().as_str())
        .unwrap()
        .info()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthenticated), "{e}");
    // The audit log has it all, and a project admin sees its subtree's part.
    let log = admin.audit(None, Some(1000)).await.unwrap().entries;
    for a in [
        "project.create",
        "identity.create",
        "binding.create",
        "key.create",
        "key.revoke",
    ] {
        assert!(log.iter().any(|e| e.action == a), "{a}");
    }
    let lead_log = lead.audit(None, None).await.unwrap().entries;
    assert!(!lead_log.is_empty());
    assert!(lead_log.iter().all(|e| {
        e.project
            .as_deref()
            .is_some_and(|p| p.starts_with("root/a"))
    }));
    // Attacks found in review, each a test now.
    let http = p.http();
    let runner_secret = {
        let k = admin
            .create_key(&CreateKey {
                name: "ka-2".into(),
                identity: Some("ka".into()),
                project: Some("root/a".into()),
                role: Some("runner".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        k.secret
    };
    // An escaped id (which the node would decode) is not a way around the node's check.
    let sibling = &sandboxes[3];
    let escaped = format!("%{:02X}{}", sibling.as_bytes()[0], &sibling[1..]);
    for (m, path) in [
        (reqwest::Method::GET, format!("/v1/sandboxes/{escaped}")),
        (
            reqwest::Method::POST,
            format!("/v1/sandboxes/{escaped}/exec"),
        ),
        (reqwest::Method::DELETE, format!("/v1/sandboxes/{escaped}")),
    ] {
        let mut rb = http
            .request(m.clone(), format!("{}{path}", p.url))
            .bearer_auth(&runner_secret);
        if m == reqwest::Method::POST {
            rb = rb.json(&serde_json::json!({"cmd": ["true"]}));
        }
        let r = rb.send().await.unwrap();
        assert!(r.status().is_client_error(), "{m} {path}: {}", r.status());
    }
    assert!(
        admin.sandbox(sibling).unwrap().info().await.is_ok(),
        "the sibling's sandbox lives"
    );
    // A project path with a comma cannot widen a forced delete to the whole cluster.
    let r = http
        .delete(format!("{}/v1/projects/root/a/x,root?force=true", p.url))
        .bearer_auth(&lead_secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        admin.sandbox(sibling).unwrap().info().await.is_ok(),
        "nothing was killed"
    );
    // A key cannot revoke or list the keys of its identity made elsewhere.
    let job_key_id = runner.whoami().await.unwrap().key_id;
    let mine = runner.keys().await.unwrap();
    assert!(mine.iter().all(|k| k.id == job_key_id), "{mine:?}");
    let other_runner = Client::new(&p.url, Some(&runner_secret)).unwrap();
    assert_eq!(
        code(other_runner.revoke_key(&job_key_id).await),
        Some(ErrorCode::NotFound)
    );
    // The same Idempotency-Key in two projects makes two sandboxes.
    let k1 = admin
        .create_idempotent(&in_project("root/a"), "same-key")
        .await
        .unwrap();
    let k2 = admin
        .create_idempotent(&in_project("root/b"), "same-key")
        .await
        .unwrap();
    assert_ne!(k1.id(), k2.id());
    // A builder on root commits only sandboxes whose files it may read.
    let root_builder = key_for(&admin, &p.url, "rb", "root", "builder").await;
    let e = root_builder
        .sandbox(sibling)
        .unwrap()
        .commit("stolen/files:1")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(ErrorCode::SandboxNotFound | ErrorCode::PermissionDenied)
        ),
        "{e}"
    );

    // Bad input is a 4xx with a reason.
    for path in ["root/A", "root//x", "nope", "root/x;drop"] {
        let e = admin.create_project(path).await.unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::InvalidArgument), "{path}: {e}");
    }
    assert_eq!(
        code(admin.create(&in_project("root/missing")).await.map(|_| ())),
        Some(ErrorCode::NotFound)
    );
    assert_eq!(
        code(admin.grant("ka", "root/a", "superuser").await),
        Some(ErrorCode::InvalidArgument)
    );
    // A project with sandboxes is not deleted unless forced.
    let e = admin
        .delete_project("root/a/child/run-1", false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}");
    admin
        .delete_project("root/a/child/run-1", true)
        .await
        .unwrap();
    assert!(
        admin
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|s| s.project != "root/a/child/run-1")
    );
}

/// Quotas count a project and everything below it, from the nodes' live view: a create past a
/// limit of the project or of an ancestor is a 429 naming the project and the limit, and room
/// comes back when sandboxes go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_hold_at_every_level() {
    require_root!();
    let p = Platform::start();
    let admin = p.client();
    for path in ["root/q", "root/q/a", "root/q/b"] {
        admin.create_project(path).await.unwrap();
    }
    admin
        .set_quota(
            "root/q",
            &warren_sdk::ProjectQuota {
                max_sandboxes: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    admin
        .set_quota(
            "root/q/a",
            &warren_sdk::ProjectQuota {
                max_sandboxes: Some(2),
                max_memory: Some(warren_sdk::ByteSize(512 << 20)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // root/q/a: memory past its 512 MiB whatever the count; two sandboxes, then its limit.
    let a1 = admin.create(&in_project("root/q/a")).await.unwrap();
    let mut big = in_project("root/q/a");
    big.memory = Some(warren_sdk::ByteSize(1 << 30));
    let e = admin.create(&big).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    assert!(e.to_string().contains("memory"), "{e}");
    let _a2 = admin.create(&in_project("root/q/a")).await.unwrap();
    let e = admin.create(&in_project("root/q/a")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    assert!(
        e.to_string().contains("root/q/a") && e.to_string().contains("sandboxes"),
        "{e}"
    );
    // root/q/b has no limit of its own, but root/q holds 2 of 3.
    let _b1 = admin.create(&in_project("root/q/b")).await.unwrap();
    let e = admin.create(&in_project("root/q/b")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
    assert!(e.to_string().contains("project root/q'"), "{e}");
    // Elsewhere is not limited.
    admin.create(&in_project("root")).await.unwrap();
    // A sandbox gone: room again once the view shows it (within a few polls).
    a1.kill().await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        match admin.create(&in_project("root/q/b")).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
                assert!(
                    std::time::Instant::now() < deadline,
                    "no room after a kill: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    // Bad quotas are refused.
    let r = p
        .http()
        .put(format!("{}/v1/projects/root/q", p.url))
        .bearer_auth(&p.key)
        .json(&serde_json::json!({"max_sandboxes": -1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}
