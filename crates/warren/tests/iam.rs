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

/// A tar archive of a root file system with a static busybox as /bin/sh.
fn busybox_tar() -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("busybox is missing: install busybox-static (make test does)");
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    for tool in ["sh", "head", "yes", "true"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
    }
    let out = std::process::Command::new("tar")
        .arg("-C")
        .arg(root)
        .args(["-cf", "-", "."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

fn image_names(images: Vec<warren_sdk::Image>) -> Vec<String> {
    images.into_iter().map(|i| i.name).collect()
}

/// Images and events belong to projects: an image is built into a project (the key needs
/// `image.build` there), read by keys of that subtree and its descendants, used by sandboxes
/// of that project and below (root's by all); a sibling's is a 404 to read, use or delete,
/// and its name a conflict. Events keep their sandbox's project, so a job's key still sees
/// its events after the sandbox is gone and a sibling never does. Image and network-policy
/// changes are in the audit log with where they came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_and_events_belong_to_projects() {
    require_root!();
    let p = Platform::start();
    let admin = p.client();
    for path in ["root/rl", "root/rl/job", "root/rl/job/run", "root/rl/other"] {
        admin.create_project(path).await.unwrap();
    }
    let tar = busybox_tar();
    let import = |c: &Client, name: &str, project: Option<&str>| {
        let (c, name, project, body) = (
            c.clone(),
            name.to_string(),
            project.map(str::to_string),
            tar.clone(),
        );
        async move {
            let opts = warren_sdk::ImportOptions {
                project: project.as_deref(),
                ..Default::default()
            };
            c.import_image_with(&name, body.into(), &opts)
                .await
                .map(|d| d.image)
        }
    };
    let base = import(&admin, "t/base:1", None).await.unwrap();
    assert_eq!(base.project, "root");
    let job = key_for(&admin, &p.url, "job", "root/rl/job", "project-admin").await;
    let other = key_for(&admin, &p.url, "other", "root/rl/other", "project-admin").await;
    let runner = key_for(&admin, &p.url, "jobrun", "root/rl/job", "runner").await;

    // Built into the key's project unless it names one where it holds image.build.
    let img = import(&job, "t/job:1", None).await.unwrap();
    assert_eq!(
        (img.project.as_str(), img.creator.as_str()),
        ("root/rl/job", "job")
    );
    assert_eq!(
        code(import(&runner, "t/run:1", None).await),
        Some(ErrorCode::PermissionDenied),
        "a runner builds nothing"
    );
    assert_eq!(
        code(import(&job, "t/x:1", Some("root/rl/other")).await),
        Some(ErrorCode::PermissionDenied),
        "nor does a job key in its sibling"
    );

    // Read: its subtree's and its ancestors'.
    let mine = image_names(job.images().await.unwrap());
    assert!(
        mine.contains(&"t/base:1".into()) && mine.contains(&"t/job:1".into()),
        "{mine:?}"
    );
    let theirs = image_names(other.images().await.unwrap());
    assert!(theirs.contains(&"t/base:1".into()), "{theirs:?}");
    assert!(!theirs.contains(&"t/job:1".into()), "{theirs:?}");
    assert_eq!(
        code(other.image("t/job:1").await),
        Some(ErrorCode::ImageNotFound)
    );
    assert_eq!(
        code(other.remove_image("t/job:1").await),
        Some(ErrorCode::ImageNotFound)
    );
    assert_eq!(
        code(import(&other, "t/job:1", None).await),
        Some(ErrorCode::Conflict),
        "a name another project holds is taken, and not replaced"
    );
    assert_eq!(
        job.image("t/job:1").await.unwrap().image.project,
        "root/rl/job"
    );

    // Use: by sandboxes of its project and below, not by a sibling's nor by the root's.
    let with = |image: &str, project: &str| CreateSandbox {
        image: image.into(),
        project: Some(project.into()),
        ..Default::default()
    };
    assert_eq!(
        code(
            other
                .create(&with("t/job:1", "root/rl/other"))
                .await
                .map(|_| ())
        ),
        Some(ErrorCode::ImageNotFound)
    );
    assert_eq!(
        code(admin.create(&with("t/job:1", "root")).await.map(|_| ())),
        Some(ErrorCode::ImageNotFound)
    );
    let sb = runner
        .create(&with("t/base:1,t/job:1", "root/rl/job/run"))
        .await
        .unwrap();

    // An event of the job's sandbox (output cut at its limit), and a policy change.
    let mut req = shell("yes | head -c 100000");
    req.max_output = Some(warren_sdk::ByteSize(1000));
    sb.exec(&req).await.unwrap();
    sb.set_network(&NetworkPolicy::none()).await.unwrap();
    let id = sb.id().to_string();
    // The job's image built from it belongs to the sandbox's project.
    let built = sb.commit("t/job:2").await;
    assert_eq!(
        code(built.map(|_| ())),
        Some(ErrorCode::PermissionDenied),
        "a runner commits nothing"
    );
    let committed = job.sandbox(&id).unwrap().commit("t/job:2").await.unwrap();
    assert_eq!(committed.project, "root/rl/job/run");
    sb.kill().await.unwrap();
    let events = |c: &Client| {
        let (c, id) = (c.clone(), id.clone());
        async move {
            c.events(&warren_sdk::EventFilter {
                sandbox: Some(id),
                ..Default::default()
            })
            .await
            .unwrap()
            .items
        }
    };
    let seen = events(&runner).await;
    assert!(
        seen.iter()
            .any(|e| e.project.as_deref() == Some("root/rl/job/run")),
        "the job's key sees its gone sandbox's events: {seen:?}"
    );
    assert!(events(&other).await.is_empty(), "a sibling sees none");
    assert!(!events(&admin).await.is_empty());

    // Delete: the image's project's to do; a layer, the root's.
    assert_eq!(
        code(runner.remove_image("t/job:1").await),
        Some(ErrorCode::PermissionDenied)
    );
    assert_eq!(
        code(job.remove_image("t/base:1").await),
        Some(ErrorCode::PermissionDenied),
        "root's image is everyone's to use and root's to delete"
    );
    assert_eq!(
        code(job.remove_image(&img.layers[0]).await),
        Some(ErrorCode::PermissionDenied)
    );
    job.remove_image("t/job:2").await.unwrap();
    job.remove_image("t/job:1").await.unwrap();

    // The audit log has each, who, and from where.
    let log = admin.audit(None, Some(1000)).await.unwrap().entries;
    for (action, target, by) in [
        ("image.import", "t/job:1", "job"),
        ("image.commit", "t/job:2", "job"),
        ("image.delete", "t/job:1", "job"),
        ("network.set", format!("sandbox {id}").as_str(), "jobrun"),
    ] {
        let e = log
            .iter()
            .find(|e| e.action == action && e.target == target)
            .unwrap_or_else(|| panic!("no {action} of {target} in {log:?}"));
        assert_eq!(e.actor, by, "{e:?}");
        assert!(
            e.source
                .as_deref()
                .is_some_and(|s| s.starts_with("127.0.0.1:")),
            "{e:?}"
        );
    }
}

/// A request the admin key makes on behalf of another key (what the E2B gateway does for an
/// envd access token) holds that key's grants, not the admin's; it is refused once that key
/// is revoked, and runs nothing then; what it runs is audited under that key, naming the key
/// that asked. Only a key holding everything on root may ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_behalf_of_a_key_hold_its_grants_end_with_it_and_are_audited_under_it() {
    require_root!();
    let p = Platform::start();
    let admin = p.client();
    admin.create_project("root/ob").await.unwrap();
    let mine = admin.create(&in_project("root/ob")).await.unwrap();
    let other = admin.create(&in_project("root")).await.unwrap();
    let runner = key_for(&admin, &p.url, "ob", "root/ob", "runner").await;
    let kid = runner.whoami().await.unwrap().key_id;
    let admin_kid = admin.whoami().await.unwrap().key_id;
    let acting = admin.on_behalf_of(&kid);
    assert_eq!(acting.whoami().await.unwrap().key_id, kid);
    // Its grants: its project's sandbox runs commands; one outside it is not even seen.
    let sb = acting.sandbox(mine.id().as_str()).unwrap();
    assert_eq!(sb.exec(&shell("echo hi")).await.unwrap().stdout, "hi\n");
    let out = acting.sandbox(other.id().as_str()).unwrap();
    assert_eq!(
        code(out.exec(&shell("true")).await),
        Some(ErrorCode::SandboxNotFound)
    );
    // Audited under the key it acted for, naming the admin key that asked.
    let log = admin.audit(None, Some(1000)).await.unwrap().entries;
    let rec = log
        .iter()
        .find(|e| {
            e.key_id.as_deref() == Some(kid.as_str()) && e.target.contains(mine.id().as_str())
        })
        .unwrap_or_else(|| panic!("no record of the exec under {kid}: {log:?}"));
    assert_eq!(rec.action, "sandbox.exec");
    assert_eq!(rec.actor, "ob");
    assert_eq!(rec.project.as_deref(), Some("root/ob"));
    assert!(
        rec.detail.as_deref().unwrap_or("").contains(&admin_kid),
        "{rec:?}"
    );
    // A key short of everything on root cannot act for another (nor for itself).
    let e = runner.on_behalf_of(&kid).whoami().await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PermissionDenied), "{e}");
    // Its grant removed (the key itself still valid): refused on that sandbox, nothing runs.
    let granted = key_for(&admin, &p.url, "ob2", "root/ob", "runner").await;
    let kid2 = granted.whoami().await.unwrap().key_id;
    let sb2 = admin
        .on_behalf_of(&kid2)
        .sandbox(mine.id().as_str())
        .unwrap();
    assert_eq!(sb2.exec(&shell("echo hi")).await.unwrap().stdout, "hi\n");
    admin
        .revoke_grant("ob2", "root/ob", "runner")
        .await
        .unwrap();
    let e = sb2
        .exec(&shell("touch /tmp/after-ungrant"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.code(),
            Some(ErrorCode::SandboxNotFound | ErrorCode::PermissionDenied)
        ),
        "{e}"
    );
    // Unknown, and revoked: refused, and nothing runs.
    let e = admin
        .on_behalf_of("key_000000000000")
        .whoami()
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthenticated), "{e}");
    admin.revoke_key(&kid).await.unwrap();
    let e = sb
        .exec(&shell("touch /tmp/after-revoke"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unauthenticated), "{e}");
    assert!(e.to_string().contains("revoked"), "{e}");
    let check = admin
        .sandbox(mine.id().as_str())
        .unwrap()
        .exec(&shell(
            "test -e /tmp/after-revoke -o -e /tmp/after-ungrant && echo ran || echo not",
        ))
        .await
        .unwrap();
    assert_eq!(check.stdout, "not\n");
}
