//! Task-level operations, the idle timeout, and timers that survive a daemon restart.

mod common;

use std::time::Duration;

use common::Platform;
use warren_sdk::{
    ByteSize, CreateSandbox, ErrorCode, IdleAction, ListFilter, SandboxState, TaskAction, argv,
};

fn in_task(task: &str) -> CreateSandbox {
    CreateSandbox {
        image: "host".into(),
        task: Some(task.into()),
        memory: Some(ByteSize(64 << 20)),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_pause_resume_stop() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let req = in_task("train-a");
    let creates = (0..40).map(|_| c.create(&req));
    let sbs: Vec<_> = futures_util::future::join_all(creates)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let other = c.create(&in_task("train-b")).await.unwrap();

    let r = c.task_action("train-a", TaskAction::Pause).await.unwrap();
    assert_eq!((r.succeeded, r.failed.len()), (40, 0), "{r:?}");
    let tasks = c.tasks().await.unwrap();
    let a = tasks.iter().find(|t| t.name == "train-a").unwrap();
    assert_eq!((a.sandboxes, a.paused, a.running), (40, 40, 0));
    // Frozen for real: the freezer says so, and the other task is untouched.
    let frozen = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/freezer/{}/{}/freezer.state",
        p.cgroup_parent,
        sbs[0].id()
    ))
    .unwrap();
    assert_eq!(frozen.trim(), "FROZEN");
    assert_eq!(other.info().await.unwrap().state, SandboxState::Running);
    // Pausing again is a no-op that still counts them.
    assert_eq!(
        c.task_action("train-a", TaskAction::Pause)
            .await
            .unwrap()
            .succeeded,
        40
    );

    let r = c.task_action("train-a", TaskAction::Resume).await.unwrap();
    assert_eq!(r.succeeded, 40);
    let running = c
        .list(
            &ListFilter::default()
                .task("train-a")
                .state(SandboxState::Running),
        )
        .await
        .unwrap();
    assert_eq!(running.len(), 40);
    assert_eq!(
        sbs[7].exec(&argv(["echo", "ok"])).await.unwrap().stdout,
        "ok\n"
    );

    let r = c.task_action("train-a", TaskAction::Stop).await.unwrap();
    assert_eq!(r.succeeded, 40);
    assert!(
        c.list(&ListFilter::default().task("train-a"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(c.list(&ListFilter::default()).await.unwrap().len(), 1);
    // An unknown task is an empty success, an unknown action a 404.
    let r = c.task_action("nobody", TaskAction::Pause).await.unwrap();
    assert_eq!((r.succeeded, r.failed.len()), (0, 0));
    other.kill().await.unwrap();
    p.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_pauses_and_the_next_operation_resumes() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            idle_timeout: Some(1),
            on_idle: Some(IdleAction::Pause),
            ..in_task("idle")
        })
        .await
        .unwrap();
    // A command that runs longer than the idle timeout keeps it busy, not idle.
    let r = sb.exec(&argv(["sleep", "2"])).await.unwrap();
    assert_eq!(r.status.exit_code, 0);
    assert_eq!(sb.info().await.unwrap().state, SandboxState::Running);
    // Paused about a second later (polled: a loaded machine takes longer to pause).
    common::poll_until(
        Duration::from_secs(20),
        "not paused 20 s after going idle with idle_timeout 1",
        async || match sb.info().await.unwrap().state {
            SandboxState::Paused => Ok(()),
            state => Err(format!("{state:?}")),
        },
    )
    .await;
    // Transparent resume.
    assert_eq!(
        sb.exec(&argv(["echo", "back"])).await.unwrap().stdout,
        "back\n"
    );
    assert_eq!(sb.info().await.unwrap().state, SandboxState::Running);

    let stopper = c
        .create(&CreateSandbox {
            idle_timeout: Some(1),
            on_idle: Some(IdleAction::Stop),
            ..in_task("idle")
        })
        .await
        .unwrap();
    common::poll_until(
        Duration::from_secs(20),
        "not stopped 20 s after going idle with idle_timeout 1",
        async || match stopper.info().await {
            Err(e) if e.code() == Some(ErrorCode::SandboxNotFound) => Ok(()),
            r => Err(format!("{r:?}")),
        },
    )
    .await;
    let bad = c
        .create(&CreateSandbox {
            on_idle: Some(IdleAction::Stop),
            ..in_task("idle")
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some(ErrorCode::InvalidArgument), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_move_and_survive_a_restart() {
    require_root!();
    let mut p = Platform::start();
    let c = p.client();
    let short = c
        .create(&CreateSandbox {
            timeout: Some(3),
            ..in_task("t")
        })
        .await
        .unwrap();
    let extended = c
        .create(&CreateSandbox {
            timeout: Some(3),
            ..in_task("t")
        })
        .await
        .unwrap();
    let before = extended.info().await.unwrap().expires_at;
    let after = extended.set_timeout(3600).await.unwrap().expires_at;
    assert!(after > before, "{before} -> {after}");
    assert_eq!(
        extended.set_timeout(0).await.unwrap_err().code(),
        Some(ErrorCode::InvalidArgument)
    );
    // Across a crash of the daemon: the short one still dies on time, the extended one lives.
    p.kill9();
    p.start_again();
    let c = p.client();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        c.get(short.id().as_str()).await.unwrap_err().code(),
        Some(ErrorCode::SandboxNotFound)
    );
    assert_eq!(
        c.get(extended.id().as_str()).await.unwrap().expires_at,
        after
    );
}
