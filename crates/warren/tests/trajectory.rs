//! The trajectory log and its replay: a rollout restarted after preemption sees exactly what
//! it saw before, even from non-idempotent commands.

mod common;

use common::Platform;
use warren_sdk::{CreateSandbox, ErrorCode, shell};

const STAMP: &str = "date +%s%N > f; cat f";
const COUNTER: &str = "c=$(cat n 2>/dev/null || echo 0); echo $((c+1)) > n; cat n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_gives_the_recorded_results_then_runs_live() {
    require_root!();
    let p = Platform::start();
    let c = p.client();
    let first = c
        .create(&CreateSandbox {
            image: "host".into(),
            trajectory: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let t1 = first.exec(&shell(STAMP)).await.unwrap().stdout;
    let n1 = first.exec(&shell(COUNTER)).await.unwrap().stdout;
    let n2 = first.exec(&shell(COUNTER)).await.unwrap().stdout;
    assert_eq!((n1.as_str(), n2.as_str()), ("1\n", "2\n"));
    first
        .write_file("/home/user/notes.txt", "step 3")
        .await
        .unwrap();
    let log = first.trajectory().await.unwrap();
    assert_eq!(log.len(), 4);
    first.kill().await.unwrap();

    // Preempted; the rollout restarts from its log.
    let second = c
        .create(&CreateSandbox {
            image: "host".into(),
            replay: Some(log.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    let r = second.exec(&shell(STAMP)).await.unwrap();
    assert_eq!(
        (r.stdout.as_str(), r.replayed),
        (t1.as_str(), true),
        "the recorded timestamp comes back"
    );
    let r = second.exec(&shell(COUNTER)).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.replayed), ("1\n", true));
    let r = second.exec(&shell(COUNTER)).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.replayed), ("2\n", true));
    // The state was rebuilt: the counter file holds what the log's steps left.
    second
        .write_file("/home/user/notes.txt", "step 3")
        .await
        .unwrap();
    let r = second.exec(&shell("cat n; cat notes.txt")).await.unwrap();
    assert_eq!((r.stdout.as_str(), r.replayed), ("2\nstep 3", false));
    assert!(
        r.replay_ended,
        "the first operation past the log's end says replay is over"
    );
    // The new sandbox's own log holds what its rollout saw.
    assert_eq!(second.trajectory().await.unwrap().len(), 5);

    // Divergence ends the replay: from there everything runs live.
    let third = c
        .create(&CreateSandbox {
            image: "host".into(),
            replay: Some(log),
            ..Default::default()
        })
        .await
        .unwrap();
    let r = third.exec(&shell(STAMP)).await.unwrap();
    assert!(r.replayed);
    let r = third.exec(&shell("echo something else")).await.unwrap();
    assert!(r.replay_ended && !r.replayed, "{r:?}");
    let r = third.exec(&shell(COUNTER)).await.unwrap();
    assert!(!r.replayed && !r.replay_ended);
    assert_eq!(r.stdout, "3\n", "live again, on the rebuilt state");

    // A sandbox without a log says how to get one.
    let plain = c
        .create(&CreateSandbox {
            image: "host".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        plain.trajectory().await.unwrap_err().code(),
        Some(ErrorCode::InvalidArgument)
    );
}

/// Big payloads are kept beside the log by digest (no line of the log is large, nothing is
/// held whole in the daemon), given back inline when the log is read, and replay from it;
/// past max_trajectory nothing more is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_payloads_live_beside_the_log_and_the_log_is_bounded() {
    require_root!();
    let p = Platform::start_with(Some("[node]\nmax_trajectory = \"8Mi\"\n"));
    let c = p.client();
    let sb = c
        .create(&CreateSandbox {
            image: "host".into(),
            trajectory: true,
            ..Default::default()
        })
        .await
        .unwrap();
    let big: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    sb.write_file("/home/user/big.bin", big.clone())
        .await
        .unwrap();
    let out = sb
        .exec(&shell("head -c 1000000 /dev/zero | tr '\\0' x"))
        .await
        .unwrap()
        .stdout;
    assert_eq!(out.len(), 1_000_000);
    let dir = p.state_dir().join("sandboxes").join(sb.id().as_str());
    let longest = std::fs::read_to_string(dir.join("trajectory.jsonl"))
        .unwrap()
        .lines()
        .map(str::len)
        .max()
        .unwrap();
    assert!(longest < 64 << 10, "a log line of {longest} bytes");
    assert!(
        std::fs::read_dir(dir.join("trajectory.blobs"))
            .unwrap()
            .count()
            >= 2
    );
    let log = sb.trajectory().await.unwrap();
    assert_eq!(log.len(), 2);
    match &log[0] {
        warren_sdk::TrajectoryEntry::WriteFile { content_b64, .. } => {
            use base64::Engine;
            let data = base64::engine::general_purpose::STANDARD
                .decode(content_b64)
                .unwrap();
            assert_eq!(data, big);
        }
        other => panic!("{other:?}"),
    }
    match &log[1] {
        warren_sdk::TrajectoryEntry::Exec { result, .. } => assert_eq!(result.stdout, out),
        other => panic!("{other:?}"),
    }
    // The log replays into a new sandbox.
    let again = c
        .create(&CreateSandbox {
            image: "host".into(),
            replay: Some(log.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        &again.read_file("/home/user/big.bin").await.unwrap()[..],
        &big[..]
    );
    // Past 8Mi, operations still run but are no longer recorded.
    for i in 0..8u8 {
        let mut other = big.clone();
        other[0] = i + 1;
        sb.write_file("/home/user/more.bin", other).await.unwrap();
    }
    let n = sb.trajectory().await.unwrap().len();
    assert!((2..9).contains(&n), "{n} entries recorded past the budget");
    sb.kill().await.unwrap();
    again.kill().await.unwrap();
    p.assert_clean();
}
