//! Output pipes that outlive their command.
//!
//! A command's stdout and stderr are pipes whose write ends every child inherits: after
//! `sh -c 'server &'` returns, the server still holds them. Closing the read ends then would
//! make the server's next write fail (`EPIPE`, or death by `SIGPIPE`), so a server started in
//! one exec would stop answering once it logs a request. Once a command's status is final, its
//! pipes still open are handed here: each is read until end of file (when the last holder of
//! its write end exits) and what is read is discarded — the command's result is already
//! delivered, and nobody reads it later.
//!
//! Bounded: at most [`MAX_LINGERING`] pipes per sandbox are drained so; past that, the oldest is
//! closed (its remaining writers get `EPIPE`, as any writer to a closed pipe), so a sandbox that
//! starts background writers in a loop costs a fixed number of descriptors. A drain holds no
//! buffer between reads (reads go to a scratch buffer on the stack), so each costs a descriptor
//! and a small task.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// Pipes drained at once per sandbox; the oldest is closed past this.
pub const MAX_LINGERING: usize = 256;

/// Bytes read per call while draining.
const SCRATCH: usize = 16 * 1024;

/// Reads per wake-up before the drain yields (a writer that never pauses cannot hold the
/// guest's one thread).
const READS_PER_TURN: usize = 16;

/// The pipes of one sandbox being drained.
pub struct Lingering {
    max: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Oldest first: an id, and what closes that drain when dropped.
    open: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl Default for Lingering {
    fn default() -> Lingering {
        Lingering::new(MAX_LINGERING)
    }
}

impl Lingering {
    pub fn new(max: usize) -> Lingering {
        Lingering {
            max: max.max(1),
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many pipes are being drained.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner().open.len()
    }

    /// Takes a new drain's place, closing the oldest drain if the table is full.
    fn register(&self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner();
        inner.next += 1;
        let id = inner.next;
        while inner.open.len() >= self.max {
            // Dropping its sender ends the oldest drain, which closes its pipe.
            inner.open.pop_front();
        }
        inner.open.push_back((id, tx));
        (id, rx)
    }

    fn unregister(&self, id: u64) {
        let mut inner = self.inner();
        if let Some(i) = inner.open.iter().position(|(d, _)| *d == id) {
            inner.open.remove(i);
        }
    }

    /// Reads `rx` until end of file (or until a newer drain takes its place), discarding what
    /// it reads.
    pub async fn drain(&self, rx: pipe::Receiver) {
        let (id, mut closed) = self.register();
        loop {
            tokio::select! {
                biased;
                _ = &mut closed => break,
                ready = rx.readable() => if ready.is_err() { break },
            }
            if !discard_available(&rx) {
                break;
            }
            tokio::task::yield_now().await;
        }
        self.unregister(id);
    }
}

/// Reads what `rx` holds now into a scratch buffer and drops it; false at end of file or on
/// an error (the pipe is done).
fn discard_available(rx: &pipe::Receiver) -> bool {
    let mut scratch = [0u8; SCRATCH];
    for _ in 0..READS_PER_TURN {
        match rx.try_read(&mut scratch) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;
    use std::time::Duration;

    fn pipe_pair() -> (pipe::Receiver, std::fs::File) {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        (
            pipe::Receiver::from_owned_fd(r).unwrap(),
            std::fs::File::from(w),
        )
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn drains_a_writer_until_it_closes() {
        let l = Arc::new(Lingering::default());
        let (rx, mut w) = pipe_pair();
        let task = tokio::spawn({
            let l = l.clone();
            async move { l.drain(rx).await }
        });
        until("the drain to start", || l.len() == 1).await;
        // Far more than a pipe holds: the writer would block (or fail) unless it is read.
        let writer = std::thread::spawn(move || {
            let chunk = vec![7u8; 64 * 1024];
            for _ in 0..256 {
                w.write_all(&chunk)?;
            }
            Ok::<_, std::io::Error>(())
        });
        until("the writer to finish", || writer.is_finished()).await;
        writer
            .join()
            .unwrap()
            .expect("the writer saw its pipe closed");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the drain ends at end of file")
            .unwrap();
        assert_eq!(l.len(), 0);
    }

    #[tokio::test]
    async fn past_the_bound_the_oldest_is_closed() {
        let l = Arc::new(Lingering::new(2));
        let mut writers = Vec::new();
        let mut tasks = Vec::new();
        for n in 1..=3 {
            let (rx, w) = pipe_pair();
            writers.push(w);
            let l2 = l.clone();
            tasks.push(tokio::spawn(async move { l2.drain(rx).await }));
            until("the drain to start", || l.len() == n.min(2)).await;
        }
        tokio::time::timeout(Duration::from_secs(5), tasks.remove(0))
            .await
            .expect("the oldest drain ends when a third takes its place")
            .unwrap();
        let e = writers[0].write_all(b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        // The two newer ones still read.
        writers[1].write_all(b"still read").unwrap();
        writers[2].write_all(b"still read").unwrap();
        assert_eq!(l.len(), 2);
        writers.clear();
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(5), t)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(l.len(), 0);
    }
}
