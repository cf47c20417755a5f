//! Following a sandbox's incident records: the guest agent keeps them (denied system calls,
//! attempts on the agent itself) and streams them to the node, which stores each as an event.

use std::sync::Arc;
use std::time::Duration;

use crate::guest_client::GuestConn;
use crate::node::{Node, Phase, Sandbox};

impl Node {
    /// Follows a sandbox's incident records for its whole life (reconnecting when the
    /// connection breaks), storing each as an event.
    pub(crate) fn watch_incidents(self: &Arc<Self>, sb: &Arc<Sandbox>) -> tokio::task::AbortHandle {
        use std::sync::atomic::Ordering;
        use warren_types::guest::{Op, Reply};
        let node = Arc::downgrade(self);
        let weak = Arc::downgrade(sb);
        let socket = sb.socket().to_path_buf();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                let Some(after) = weak
                    .upgrade()
                    .filter(|sb| sb.phase() != Phase::Stopping)
                    .map(|sb| sb.incident_seq.load(Ordering::Relaxed))
                else {
                    return;
                };
                if let Ok(mut conn) = GuestConn::open(&socket, Op::Incidents { after }).await {
                    loop {
                        match conn.reply().await {
                            Ok(Reply::Incidents { incidents, seq }) => {
                                backoff = Duration::from_millis(200);
                                let (Some(node), Some(sb)) = (node.upgrade(), weak.upgrade())
                                else {
                                    return;
                                };
                                for i in &incidents {
                                    node.events.from_guest(
                                        &sb.record.id,
                                        sb.record.task.as_deref(),
                                        i,
                                    );
                                }
                                sb.incident_seq.store(seq, Ordering::Relaxed);
                            }
                            // A guest too old to report incidents: nothing to follow.
                            Ok(Reply::Error { .. }) => return,
                            Ok(_) | Err(_) => break,
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        })
        .abort_handle()
    }

    /// Reads what the guest has not reported yet, before the sandbox dies (a burst is
    /// reported a few times a second; its last quarter second would be lost otherwise).
    pub(crate) async fn last_incidents(&self, sb: &Sandbox) {
        use std::sync::atomic::Ordering;
        use warren_types::guest::{Op, Reply};
        let after = sb.incident_seq.load(Ordering::Relaxed);
        if after == 0 {
            return; // nothing was ever reported: nothing to catch up on
        }
        let read = async {
            let mut conn = GuestConn::open(sb.socket(), Op::Incidents { after })
                .await
                .ok()?;
            match conn.reply().await.ok()? {
                Reply::Incidents { incidents, .. } => Some(incidents),
                _ => None,
            }
        };
        if let Ok(Some(incidents)) = tokio::time::timeout(Duration::from_millis(200), read).await {
            for i in &incidents {
                self.events
                    .from_guest(&sb.record.id, sb.record.task.as_deref(), i);
            }
        }
    }
}
