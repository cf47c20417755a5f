//! Following a sandbox's incident records: the guest agent keeps them (denied system calls,
//! attempts on the agent itself) and streams them to the node, which stores each as an event.

use std::sync::Arc;
use std::time::Duration;

use crate::guest_client::GuestConn;
use crate::node::{Node, Phase, Sandbox};

/// API inactivity after which a sandbox's incident connection is let go.
const IDLE_AFTER: Duration = Duration::from_secs(30);
/// How often a held connection checks whether its sandbox went idle.
const IDLE_CHECK: Duration = Duration::from_secs(30);
/// How long a poll waits for the guest's first answer (it answers at once with what it has;
/// a guest at idle CPU priority on a busy host may take a while).
const POLL_READ: Duration = Duration::from_secs(2);
/// How often an idle watcher looks whether its sandbox is in use again (or paused).
const LOOK: Duration = Duration::from_secs(5);
/// The least time between two polls of an idle sandbox.
const MIN_POLL: Duration = Duration::from_secs(10);
/// How long the node waits for a guest's last records before it freezes or kills it.
const LAST_READ: Duration = Duration::from_millis(200);

/// Whether the sandbox has had no API call in flight or ended for [`IDLE_AFTER`].
fn idle_for(sb: &Sandbox) -> bool {
    let a = *sb.activity.lock().unwrap_or_else(|p| p.into_inner());
    a.busy == 0 && crate::state::now_ms().saturating_sub(a.last_ms) >= IDLE_AFTER.as_millis() as u64
}

/// Time between polls of an idle sandbox: 10 s, or longer on a node of many sandboxes, so the
/// polls of all of them stay near 100 a second.
fn poll_interval(node: &Node) -> Duration {
    let n = node
        .sandboxes
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .len() as u64;
    MIN_POLL
        .max(Duration::from_secs(n / 100))
        .min(Duration::from_secs(300))
}

impl Node {
    /// Follows a sandbox's incident records for its whole life, storing each as an event.
    ///
    /// While the sandbox is in use (API activity in the last [`IDLE_AFTER`]) the watcher
    /// holds a connection the guest streams records on, reconnecting when it breaks. Once it
    /// is idle the connection is let go — an idle node of 20,000 sandboxes would otherwise
    /// hold 20,000 descriptors for it — and the records are fetched by a short poll every
    /// [`poll_interval`] (longer as the node holds more sandboxes), or at once when the
    /// sandbox is used again. The guest keeps what was not fetched, so nothing is lost; an
    /// idle sandbox's incidents are only reported later.
    pub(crate) fn watch_incidents(self: &Arc<Self>, sb: &Arc<Sandbox>) -> tokio::task::AbortHandle {
        use std::sync::atomic::Ordering;
        use warren_types::guest::{Op, Reply};
        let node = Arc::downgrade(self);
        let weak = Arc::downgrade(sb);
        let socket = sb.socket().to_path_buf();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                let Some((after, idle, paused)) = weak
                    .upgrade()
                    .filter(|sb| sb.phase() != Phase::Stopping)
                    .map(|sb| {
                        (
                            sb.incident_seq.load(Ordering::Relaxed),
                            idle_for(&sb),
                            sb.phase() == Phase::Paused,
                        )
                    })
                else {
                    return;
                };
                // A frozen guest records nothing and answers nothing: wait for the thaw (its
                // pause fetched what it had; see `Node::last_incidents`).
                if paused {
                    tokio::time::sleep(LOOK).await;
                    continue;
                }
                // Stores a batch; false when the watcher should end.
                let store = |incidents: &[warren_types::guest::Incident], seq: u64| {
                    let (Some(node), Some(sb)) = (node.upgrade(), weak.upgrade()) else {
                        return false;
                    };
                    for i in incidents {
                        node.events.from_guest(
                            &sb.record.id,
                            crate::events::Owner::of(&sb.record),
                            i,
                        );
                    }
                    sb.incident_seq.store(seq, Ordering::Relaxed);
                    true
                };
                let Ok(mut conn) = GuestConn::open(&socket, Op::Incidents { after }).await else {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                };
                if idle {
                    // A short poll: the guest answers at once with what it has.
                    match tokio::time::timeout(POLL_READ, conn.reply()).await {
                        Ok(Ok(Reply::Incidents { incidents, seq })) => {
                            backoff = Duration::from_millis(200);
                            if !store(&incidents, seq) {
                                return;
                            }
                        }
                        Ok(Ok(Reply::Error { .. })) => return,
                        _ => {}
                    }
                    drop(conn);
                    // Until the next poll, or until the sandbox is used again.
                    // Spread out, so sandboxes that went idle together do not poll together.
                    let wait = node
                        .upgrade()
                        .map_or(MIN_POLL, |n| poll_interval(&n))
                        .mul_f64(0.5 + rand::random::<f64>());
                    let until = tokio::time::Instant::now() + wait;
                    while tokio::time::Instant::now() < until {
                        tokio::time::sleep(LOOK).await;
                        match weak.upgrade() {
                            Some(sb) if sb.phase() != Phase::Stopping => {
                                if !idle_for(&sb) {
                                    break;
                                }
                            }
                            _ => return,
                        }
                    }
                    continue;
                }
                loop {
                    match tokio::time::timeout(IDLE_CHECK, conn.reply()).await {
                        Ok(Ok(Reply::Incidents { incidents, seq })) => {
                            // The backoff starts again only once the guest has answered.
                            backoff = Duration::from_millis(200);
                            if !store(&incidents, seq) {
                                return;
                            }
                        }
                        // A guest too old to report incidents: nothing to follow.
                        Ok(Ok(Reply::Error { .. })) => return,
                        // The stream broke: again after a pause.
                        Ok(_) => {
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(30));
                            break;
                        }
                        // Quiet for a while: the connection goes (a reply cut off mid-frame
                        // cannot be read on), and the next round decides between streaming
                        // and polling.
                        Err(_) => break,
                    }
                }
            }
        })
        .abort_handle()
    }

    /// [`Node::last_incidents`] of many sandboxes at once (a task's pause), all within one
    /// [`LAST_READ`]: a thousand cost the node no more time than one. A guest that has not
    /// answered by then keeps its records, and its watcher fetches them after the thaw.
    pub(crate) async fn last_incidents_of(&self, sandboxes: &[Arc<Sandbox>]) {
        let all =
            futures_util::future::join_all(sandboxes.iter().map(|sb| self.last_incidents(sb)));
        let _ = tokio::time::timeout(LAST_READ, all).await;
    }

    /// Reads what the guest has not reported yet, before the sandbox dies or is frozen (a
    /// burst is reported a few times a second; its last quarter second would be lost
    /// otherwise, and an idle sandbox's records are polled only now and then).
    pub(crate) async fn last_incidents(&self, sb: &Sandbox) {
        use std::sync::atomic::Ordering;
        use warren_types::guest::{Op, Reply};
        // Also when nothing was reported yet: an idle sandbox's records are fetched only now
        // and then.
        let after = sb.incident_seq.load(Ordering::Relaxed);
        let read = async {
            let mut conn = GuestConn::open(sb.socket(), Op::Incidents { after })
                .await
                .ok()?;
            match conn.reply().await.ok()? {
                Reply::Incidents { incidents, .. } => Some(incidents),
                _ => None,
            }
        };
        if let Ok(Some(incidents)) = tokio::time::timeout(LAST_READ, read).await {
            for i in &incidents {
                self.events
                    .from_guest(&sb.record.id, crate::events::Owner::of(&sb.record), i);
            }
        }
    }
}
