//! Exposed ports: a listener on the node's host for each port a sandbox exposes, every
//! connection it accepts spliced to the sandbox's address on that port.
//!
//! A userspace forwarder rather than a DNAT rule: it serves connections from the node's own
//! loopback as well as from other hosts (a DNAT of loopback traffic would need
//! `route_localnet`), and the control plane's `<port>-<id>.<domain>` route reaches the same
//! ports through the node's API. The firewall lets the node open connections to exactly the
//! exposed ports of each sandbox (`expose` set), nothing else. Connections through a
//! forwarder end with the daemon that runs it; the port comes back with the same number when
//! the next daemon adopts the sandbox.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Connections one exposed port carries at once; past that, new ones are reset.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long the node waits for the sandbox to accept a forwarded connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One exposed port's listener and the connections it carries; dropping it closes them all.
pub struct Forwarder {
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    open: Arc<AtomicUsize>,
}

impl Forwarder {
    /// Binds `addr` (a port of the expose range). Fails with `AddrInUse` when something else
    /// holds it, so the caller can try the next one.
    pub fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    }

    /// Starts forwarding what `listener` accepts to `target`, on the runtime `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
        target: SocketAddr,
    ) -> io::Result<Forwarder> {
        let local = listener.local_addr()?;
        let listener = {
            let _enter = rt.enter();
            TcpListener::from_std(listener)?
        };
        let open = Arc::new(AtomicUsize::new(0));
        let count = open.clone();
        let task = rt.spawn(async move {
            // Dropped with the task: every connection of this port ends with it.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else {
                            // Out of descriptors, say: wait rather than spin.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        if conns.len() >= MAX_CONNECTIONS {
                            reset(client);
                            continue;
                        }
                        let count = count.clone();
                        conns.spawn(async move {
                            count.fetch_add(1, Ordering::Relaxed);
                            let _ = splice(client, target).await;
                            count.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Forwarder { local, task, open })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Connections it carries now.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects to `target` (bounded in time) and copies both ways until either side closes;
/// a target that does not accept gets the client reset, not left hanging.
async fn splice(mut client: TcpStream, target: SocketAddr) -> io::Result<()> {
    let mut upstream = match tokio::time::timeout(CONNECT_TIMEOUT, connect(target)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            reset(client);
            return Err(e);
        }
        Err(_) => {
            reset(client);
            return Err(io::ErrorKind::TimedOut.into());
        }
    };
    let _ = client.set_nodelay(true);
    tokio::io::copy_bidirectional(&mut client, &mut upstream)
        .await
        .map(|_| ())
}

/// Opens a connection from the node to a sandbox's address.
pub async fn connect(target: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(target).await?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Closes `s` with a reset (linger 0), so its peer fails at once.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connections_are_spliced_and_end_with_the_forwarder() {
        let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let taddr = target.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = target.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let rt = tokio::runtime::Handle::current();
        let l = Forwarder::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // The port is held: a second bind fails, so the node moves to the next one.
        let taken = Forwarder::bind(l.local_addr().unwrap()).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
        let f = Forwarder::start(&rt, l, taddr).unwrap();
        let mut c = TcpStream::connect(f.local_addr()).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        assert_eq!(f.open_connections(), 1);
        drop(f);
        // Its connections end with it.
        let mut rest = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
    }

    #[tokio::test]
    async fn a_port_nothing_listens_on_resets_the_client() {
        // A port that was free a moment ago: nothing listens there.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let daddr = dead.local_addr().unwrap();
        drop(dead);
        let rt = tokio::runtime::Handle::current();
        let f = Forwarder::start(
            &rt,
            Forwarder::bind("127.0.0.1:0".parse().unwrap()).unwrap(),
            daddr,
        )
        .unwrap();
        let mut c = TcpStream::connect(f.local_addr()).await.unwrap();
        let mut buf = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("the client is told at once, not left hanging");
        match r {
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            Ok(n) => panic!("read {n} bytes instead of a reset"),
        }
    }
}
