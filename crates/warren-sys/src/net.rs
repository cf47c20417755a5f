//! Network interfaces: bringing up loopback in a new network namespace.

use std::io;

/// Sets the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket() call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket() and is owned here.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    // SAFETY: ifreq is a plain C struct; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    let raw = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    if unsafe { libc::ioctl(raw, libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the flags member of the union is the one SIOCGIFFLAGS filled in.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(raw, libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new network namespace with its loopback up and no TCP metrics kept, held by the returned
/// descriptor (no process needs to live in it): made by a short-lived thread that unshares its
/// own network namespace, so the caller's threads stay where they are.
pub fn new_netns() -> io::Result<std::os::fd::OwnedFd> {
    std::thread::Builder::new()
        .name("warren-netns".into())
        .spawn(|| -> io::Result<std::os::fd::OwnedFd> {
            // SAFETY: NEWNET only moves this thread (which shares nothing it unshares with any
            // other: no file table or fs flags are unshared) into a new network namespace;
            // the thread ends right after.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }?;
            let fd = rustix::fs::open(
                "/proc/thread-self/ns/net",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            loopback_up()?;
            // No per-destination TCP metrics: `ip tcp_metrics` (generic netlink, no capability
            // needed) would tell whoever runs here next where earlier connections went.
            std::fs::write("/proc/sys/net/ipv4/tcp_no_metrics_save", "1")?;
            Ok(fd)
        })?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the network namespace thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_new_namespace_is_not_the_callers_and_outlives_its_thread() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let ns = new_netns().unwrap();
        let mine = rustix::fs::stat("/proc/thread-self/ns/net").unwrap();
        let its = rustix::fs::fstat(ns.as_fd()).unwrap();
        assert_ne!(mine.st_ino, its.st_ino);
        // Still there after its thread is gone: another thread can enter it.
        let inside = std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            rustix::fs::stat("/proc/thread-self/ns/net").unwrap().st_ino
        })
        .join()
        .unwrap();
        assert_eq!(inside, its.st_ino);
    }
}
