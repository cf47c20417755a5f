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
    // Frozen for real: the freezer says so (a process the pause did not see stop yet, waiting
    // for a CPU on a loaded host, stops as soon as it runs), and the other task is untouched.
    let state = format!(
        "/sys/fs/cgroup/freezer/{}/{}/freezer.state",
        p.cgroup_parent,
        sbs[0].id()
    );
    common::poll_until(
        Duration::from_secs(10),
        "the freezer says FROZEN",
        async || match std::fs::read_to_string(&state).unwrap().trim() {
            "FROZEN" => Ok(()),
            other => Err(other.to_string()),
        },
    )
    .await;
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

/// A node that starts one sandbox at a time, so that creates of a task queue for its start
/// slot while the task is paused or stopped.
const ONE_SLOT: &str = "[node]\nmax_concurrent_creates = 1\nwarm_pool = 0\n";

/// Starts `n` creates of `task` at once, and waits until the first has landed.
async fn creates_in_flight(
    c: &warren_sdk::Client,
    task: &str,
    n: usize,
) -> tokio::task::JoinSet<warren_sdk::Result<warren_sdk::Sandbox>> {
    let mut creates = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (c, req) = (c.clone(), in_task(task));
        creates.spawn(async move { c.create(&req).await });
    }
    let f = ListFilter::default().task(task);
    common::poll_until(
        Duration::from_secs(60),
        "a first create lands",
        async || match c.list(&f).await {
            Ok(l) if !l.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    creates
}

/// Creates of a task still in flight when the task is paused land paused (the pause counts
/// them), and the node shows them waiting for its start slot; a resume lets them all run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_flight_at_a_task_pause_land_paused() {
    require_root!();
    let p = Platform::start_with(Some(ONE_SLOT));
    let c = p.client();
    let mut creates = creates_in_flight(&c, "landing", 24).await;
    let nodes = c.nodes().await.unwrap();
    let n = &nodes.items[0];
    assert_eq!(n.create_slots, 1, "{n:?}");
    assert!(
        n.creates_starting + n.creates_waiting > 0,
        "the queue is visible: {n:?}"
    );
    let r = c.task_action("landing", TaskAction::Pause).await.unwrap();
    assert!(r.creates_in_flight > 0, "{r:?}");
    assert!(r.failed.is_empty(), "{r:?}");
    while let Some(made) = creates.join_next().await {
        made.unwrap().unwrap();
    }
    let all = c
        .list(&ListFilter::default().task("landing"))
        .await
        .unwrap();
    assert_eq!(all.len(), 24);
    let running: Vec<_> = all
        .iter()
        .filter(|s| s.state != SandboxState::Paused)
        .map(|s| &s.id)
        .collect();
    assert!(running.is_empty(), "landed running: {running:?}");
    assert!(c.nodes().await.unwrap().items[0].create_wait_ms > 0);

    let r = c.task_action("landing", TaskAction::Resume).await.unwrap();
    assert_eq!((r.succeeded, r.failed.len()), (24, 0), "{r:?}");
    let r = c.task_action("landing", TaskAction::Stop).await.unwrap();
    assert_eq!(r.succeeded, 24, "{r:?}");
    p.assert_clean();
}

/// Creates of a task still in flight when the task is stopped are killed as they land, or not
/// started: each is answered 410 saying why, and nothing of them is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_flight_at_a_task_stop_are_killed() {
    require_root!();
    let p = Platform::start_with(Some(ONE_SLOT));
    let c = p.client();
    let mut creates = creates_in_flight(&c, "stopping", 24).await;
    let r = c.task_action("stopping", TaskAction::Stop).await.unwrap();
    assert!(r.creates_in_flight > 0, "{r:?}");
    let mut refused = 0;
    while let Some(made) = creates.join_next().await {
        if let Err(e) = made.unwrap() {
            assert_eq!(e.code(), Some(ErrorCode::SandboxGone), "{e}");
            assert!(
                e.to_string().contains("was stopped while this create"),
                "{e}"
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "no create in flight was refused");
    // Those that landed before the stop were stopped with the rest.
    let left = c
        .list(&ListFilter::default().task("stopping"))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    p.assert_clean();
}

/// Awaits `op`, which must answer within a generous bound while the node is flooded.
async fn within<T>(what: &str, op: impl Future<Output = T>) -> T {
    let t = std::time::Instant::now();
    let out = op.await;
    let took = t.elapsed();
    eprintln!("{what}: {took:?} under the flood");
    assert!(
        took < Duration::from_secs(5),
        "{what} took {took:?} under the flood"
    );
    out
}

/// A task pause, resume and stop, and one sandbox's pause, resume and kill, are answered
/// while hundreds of creates, file writes and execs of the task and another are in flight: they
/// do not queue behind them. The bound is generous (a loaded debug build); `warren-bench rl`
/// gives the figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_operations_answer_under_a_create_and_exec_flood() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let lone = c.create(&in_task("flood-lone")).await.unwrap();
    let victim = c.create(&in_task("flood-lone")).await.unwrap();
    let mut flood = tokio::task::JoinSet::<warren_sdk::Result<()>>::new();
    for i in 0..200 {
        let c = c.clone();
        let task = if i % 2 == 0 { "flood-a" } else { "flood-b" };
        flood.spawn(async move {
            let sb = c.create(&in_task(task)).await?;
            sb.write_file("/home/user/task.txt", format!("{i}\n"))
                .await?;
            let r = sb.exec(&argv(["cat", "/home/user/task.txt"])).await?;
            assert_eq!(r.stdout, format!("{i}\n"));
            Ok(())
        });
    }
    let f = ListFilter::default().task("flood-a");
    common::poll_until(
        Duration::from_secs(120),
        "the flood is under way",
        async || match c.list(&f).await {
            Ok(l) if l.len() >= 10 => Ok(()),
            other => Err(format!("{:?}", other.map(|l| l.len()))),
        },
    )
    .await;
    let r = within("task pause", c.task_action("flood-a", TaskAction::Pause)).await;
    assert!(r.unwrap().failed.is_empty());
    let r = within("task resume", c.task_action("flood-a", TaskAction::Resume)).await;
    assert!(r.unwrap().failed.is_empty());
    within("sandbox pause", lone.pause()).await.unwrap();
    within("sandbox resume", lone.resume()).await.unwrap();
    within("sandbox kill", victim.kill()).await.unwrap();
    let r = within("task stop", c.task_action("flood-lone", TaskAction::Stop)).await;
    assert!(r.unwrap().failed.is_empty());
    // Every episode ran, whatever was paused under it (an operation resumes its sandbox).
    while let Some(episode) = flood.join_next().await {
        episode.unwrap().unwrap();
    }
    // A create that waited long for a start slot left an event saying so.
    if c.nodes().await.unwrap().items[0].create_wait_ms >= 5000 {
        let ev = c
            .events(&warren_sdk::EventFilter {
                kind: Some(warren_sdk::EventKind::CreateQueued),
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(!ev.is_empty(), "no create_queued event");
        assert!(ev[0].detail.contains("start slots"), "{:?}", ev[0]);
    }
    for task in ["flood-a", "flood-b"] {
        c.task_action(task, TaskAction::Stop).await.unwrap();
    }
    p.assert_clean();
}
