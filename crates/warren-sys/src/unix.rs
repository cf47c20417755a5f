//! Messages with descriptors (`SCM_RIGHTS`) on unix sockets, and a fork for a process that is
//! known to have one thread.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Sends `data` with `fds` attached.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS
        || (!fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)))
    {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(data)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != data.len() {
        return Err(io::Error::other("a message was cut short"));
    }
    Ok(())
}

/// Receives one message into `buf` with the descriptors it carries. `Ok((0, []))` when the
/// peer is gone. A message longer than `buf`, or with more descriptors than [`MAX_FDS`], is
/// an error (what was cut is lost; the descriptors that did arrive are closed).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = msg {
            fds.extend(rights);
        }
    }
    if r.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(io::Error::other(format!(
            "a message longer than {} bytes was cut",
            buf.len()
        )));
    }
    if r.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(io::Error::other(format!(
            "a message with more than {MAX_FDS} descriptors was cut"
        )));
    }
    Ok((r.bytes, fds))
}

/// Forks. Only for a process that has one thread (checked: a fork of a multi-threaded process
/// could inherit a lock another thread held); the child then runs ordinary Rust. Returns the
/// child's pid in the parent and `None` in the child.
pub fn fork_single_threaded() -> io::Result<Option<i32>> {
    fork(&OneThread::check()?)
}

/// Proof that this process has one thread, from a check of `/proc/self/status`: a process
/// that holds one (and starts no thread) may fork as often as it likes with [`fork`] without
/// reading that file each time. Not `Send`: it stays on the thread that made it.
pub struct OneThread(std::marker::PhantomData<*const ()>);

impl OneThread {
    /// Checks that this process has one thread.
    pub fn check() -> io::Result<OneThread> {
        let threads = std::fs::read_to_string("/proc/self/status")?
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0);
        if threads != 1 {
            return Err(io::Error::other(format!(
                "fork refused: the process has {threads} threads"
            )));
        }
        Ok(OneThread(std::marker::PhantomData))
    }
}

/// Forks a process that has one thread (`_one`: checked when it was made; the caller starts no
/// thread while it holds it). The child runs ordinary Rust. Returns the child's pid in the
/// parent and `None` in the child.
pub fn fork(_one: &OneThread) -> io::Result<Option<i32>> {
    // SAFETY: the process has one thread (the token's contract), so the child is a consistent
    // copy: no lock can be held by a thread that does not exist in it.
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        p => Ok(Some(p)),
    }
}

/// Ends this process at once with `code` (`_exit`): no atexit handler, no flush of Rust's
/// buffered stdout. For the forked copies of a process, which must not run their parent's
/// exit work.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

/// A process that sends `SIGKILL` to every process of one uid when asked: forked once, it
/// takes real and saved uid `own` (which no other process has) and effective uid `target`, so
/// its `kill(-1)` reaches exactly `target`'s processes (all at once, forks racing it included)
/// while none of them may signal, stop or trace it. It never forks again, so a step that
/// filled the pids limit cannot keep it from working.
pub struct Killer {
    ask: OwnedFd,
    done: OwnedFd,
    pid: i32,
}

impl Killer {
    /// Forks it (the caller, which has one thread, needs `CAP_SETUID`).
    pub fn start(one: &OneThread, own: u32, target: u32) -> io::Result<Killer> {
        let (ask_r, ask_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (done_r, done_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        match fork(one)? {
            None => {
                drop((ask_w, done_r));
                let _ = close_all_except(&[2, ask_r.as_raw_fd(), done_w.as_raw_fd()]);
                // SAFETY: integer-only system calls on descriptors this process owns;
                // _exit does not return.
                unsafe {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setresgid(own, own, own) != 0
                        || libc::setresuid(own, target, own) != 0
                        || libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
                    {
                        libc::_exit(1);
                    }
                    let mut b = [0u8; 1];
                    loop {
                        let n = libc::read(ask_r.as_raw_fd(), b.as_mut_ptr().cast(), 1);
                        if n == 0 {
                            libc::_exit(0);
                        }
                        if n < 0 {
                            if *libc::__errno_location() == libc::EINTR {
                                continue;
                            }
                            libc::_exit(1);
                        }
                        libc::kill(-1, libc::SIGKILL);
                        if libc::write(done_w.as_raw_fd(), b.as_ptr().cast(), 1) != 1 {
                            libc::_exit(1);
                        }
                    }
                }
            }
            Some(pid) => Ok(Killer {
                ask: ask_w,
                done: done_r,
                pid,
            }),
        }
    }

    /// Kills every process of its target uid; waits at most `wait` for it to say so.
    pub fn kill_all(&self, wait: std::time::Duration) -> io::Result<()> {
        rustix::io::write(&self.ask, b"k")?;
        let mut fds = [rustix::event::PollFd::new(
            &self.done,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::time::Timespec {
            tv_sec: wait.as_secs() as i64,
            tv_nsec: wait.subsec_nanos() as _,
        };
        loop {
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => return Err(io::Error::other("the killer did not answer")),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let mut b = [0u8; 1];
        match rustix::io::read(&self.done, &mut b)? {
            1 => Ok(()),
            _ => Err(io::Error::other("the killer is gone")),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }
}

/// Waits for child `pid` to end (again after a signal); its exit code or the signal that
/// ended it.
pub fn wait_child(pid: i32) -> io::Result<(Option<i32>, Option<i32>)> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid writes the status into the integer it is given.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if libc::WIFEXITED(status) {
        Ok((Some(libc::WEXITSTATUS(status)), None))
    } else if libc::WIFSIGNALED(status) {
        Ok((None, Some(libc::WTERMSIG(status))))
    } else {
        Ok((None, None))
    }
}

/// Closes every descriptor of this process but `keep` (with `close_range(2)` over the gaps),
/// for a process that must hold nothing it inherited but what it uses.
pub fn close_all_except(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter(|&&f| f >= 0)
        .map(|&f| f as u32)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut lo: u32 = 0;
    for k in keep.into_iter().chain(std::iter::once(u32::MAX)) {
        if k > lo {
            let hi = k - 1;
            // SAFETY: close_range only closes descriptors; no Rust object of this process
            // refers to one outside `keep` (the caller's contract, and why it is called right
            // after a fork, before anything else is opened).
            let r = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if k == u32::MAX {
            break;
        }
        lo = k + 1;
    }
    Ok(())
}

/// A non-blocking descriptor on the tokio reactor (a terminal, an inotify instance), read
/// and written as it becomes ready.
pub struct NonBlocking(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>);

impl NonBlocking {
    /// Registers `fd`, which must be non-blocking, with the reactor.
    pub fn new(fd: std::os::fd::OwnedFd) -> io::Result<NonBlocking> {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor
        // until the AsyncFd drops it.
        unsafe { tokio::io::unix::AsyncFd::register(fd) }
            .map(NonBlocking)
            .map_err(|e| e.into_parts().1)
    }

    /// The descriptor.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.get_ref().as_fd()
    }

    /// Reads what is there, waiting until something is.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.0.readable().await?;
            match guard.try_io(|f| Ok(rustix::io::read(f.get_ref(), &mut *buf)?)) {
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data`, waiting while the other side is full.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.0.writable().await?;
            match guard.try_io(|f| Ok(rustix::io::write(f.get_ref(), data)?)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn messages_carry_descriptors_and_cut_ones_are_errors() {
        let (a, b) = pair();
        let (r, _w) = std::io::pipe().unwrap();
        send_with_fds(a.as_fd(), b"hello", &[r.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"hello"[..], 1));
        // Longer than the buffer: an error, not a short message taken for whole.
        send_with_fds(a.as_fd(), &[7u8; 100], &[]).unwrap();
        let err = recv_with_fds(b.as_fd(), &mut buf).unwrap_err();
        assert!(err.to_string().contains("cut"), "{err}");
        // More descriptors than a message may carry: refused on the way out...
        let many = [r.as_fd(); MAX_FDS + 1];
        assert!(send_with_fds(a.as_fd(), b"x", &many).is_err());
        // ...and the peer is gone: end of stream.
        drop(a);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf).unwrap().0, 0);
    }
}
