//! Pseudo-terminals, opened by descriptor.
//!
//! The multiplexer is opened beneath a directory descriptor of a devpts instance taken before
//! any untrusted process ran (`openat(pts, "ptmx")`), never by the path `/dev/ptmx`, which a
//! sandbox's root can replace; the terminal's other end comes from the multiplexer itself
//! (`TIOCGPTPEER`), never from a `/dev/pts/N` path.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// A new terminal's two ends.
pub struct Pair {
    /// The multiplexer side (what the terminal's user writes input to and reads output from),
    /// non-blocking and close-on-exec.
    pub master: OwnedFd,
    /// The terminal itself, for the program's stdin, stdout and stderr (close-on-exec: moved
    /// into place by the spawn).
    pub slave: OwnedFd,
}

/// Opens a new terminal of `cols` × `rows` on the devpts instance `pts` (a directory
/// descriptor, `O_PATH` is enough).
pub fn open(pts: impl AsFd, cols: u16, rows: u16) -> io::Result<Pair> {
    let master = rustix::fs::openat(
        pts,
        "ptmx",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    // A character device is all the name may be (devpts allows nothing else there).
    let st = rustix::fs::fstat(&master)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::CharacterDevice {
        return Err(io::Error::other("ptmx is not a character device"));
    }
    rustix::pty::unlockpt(&master)?;
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )?;
    resize(&master, cols, rows)?;
    Ok(Pair { master, slave })
}

/// Sets a terminal's size (on either end); its foreground process group gets `SIGWINCH`.
pub fn resize(fd: impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    rustix::termios::tcsetwinsize(
        fd,
        Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    Ok(())
}

/// A terminal's multiplexer side on the tokio reactor: output is read from it, input written
/// to it.
pub struct Master(crate::unix::NonBlocking);

impl Master {
    /// Registers `fd` (a non-blocking multiplexer, as [`open`] makes) with the reactor.
    pub fn new(fd: OwnedFd) -> io::Result<Master> {
        crate::unix::NonBlocking::new(fd).map(Master)
    }

    /// Reads what the terminal's programs wrote; `Ok(0)` once it hung up (every holder of
    /// the other end closed it: the kernel answers EIO then, reported here as the end).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.read(buf).await {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            r => r,
        }
    }

    /// Writes all of `data` as the terminal's input (waiting while its buffer is full).
    pub async fn write_all(&self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data).await
    }

    /// Sets the terminal's size.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        resize(self.0.fd(), cols, rows)
    }
}

/// Makes `cmd`'s child take descriptor 0, a terminal, as its controlling terminal, in a
/// session of its own (`setsid`, `TIOCSCTTY`) just before its exec. Do not also ask for a
/// process group: a session's leader cannot be moved into one.
pub fn controlling_terminal_on_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid and ioctl are async-signal-safe system calls; descriptor 0 is in place
    // when pre_exec closures run.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(std::io::stdin())?;
            Ok(())
        });
    }
}

/// A terminal's size: `(cols, rows)`.
pub fn size(fd: impl AsFd) -> io::Result<(u16, u16)> {
    let w = rustix::termios::tcgetwinsize(fd)?;
    Ok((w.ws_col, w.ws_row))
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::path::Path;

    use super::*;
    use crate::spawn::{SpawnSpec, spawn};

    fn pts() -> OwnedFd {
        rustix::fs::open(
            "/dev/pts",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    /// Reads the master until the terminal hangs up (EIO once every slave is closed).
    fn read_all(master: OwnedFd) -> String {
        rustix::fs::fcntl_setfl(&master, OFlags::RDWR).unwrap();
        let mut f = std::fs::File::from(master);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.raw_os_error() == Some(libc::EIO) => break,
                Err(e) => panic!("reading the terminal: {e}"),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// What `sh -c script` writes on a new terminal of `cols` × `rows`, until it hangs up;
    /// `controlling`: the terminal is its session's.
    fn on_terminal(script: &str, cols: u16, rows: u16, controlling: bool) -> String {
        let Pair { master, slave } = open(pts(), cols, rows).unwrap();
        assert_eq!(size(&master).unwrap(), (cols, rows));
        let fds = [(slave.as_fd(), 0), (slave.as_fd(), 1), (slave.as_fd(), 2)];
        let args = ["sh", "-c", script];
        let spec = SpawnSpec {
            fds: &fds,
            controlling_tty: controlling,
            ..SpawnSpec::new(Path::new("/bin/sh"), &args, &[("PATH", "/usr/bin:/bin")])
        };
        let child = spawn(&spec).unwrap();
        drop(slave);
        let out = read_all(master);
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(child.pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
        out
    }

    #[test]
    fn a_spawned_session_owns_its_terminal_and_sees_its_size() {
        // /dev/tty opens only for a process with a controlling terminal.
        let out = on_terminal("stty size; echo via-tty > /dev/tty", 91, 17, true);
        assert!(out.contains("17 91"), "{out:?}");
        assert!(out.contains("via-tty"), "{out:?}");
    }

    #[test]
    fn without_the_flag_there_is_no_controlling_terminal() {
        let out = on_terminal("echo x > /dev/tty || echo no-tty", 80, 24, false);
        assert!(out.contains("no-tty"), "{out:?}");
    }

    #[test]
    fn a_name_that_is_not_a_multiplexer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ptmx"), b"planted").unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        assert!(open(&fd, 80, 24).is_err());
        std::os::unix::fs::symlink("/dev/ptmx", dir.path().join("link")).unwrap();
        std::fs::remove_file(dir.path().join("ptmx")).unwrap();
        std::fs::rename(dir.path().join("link"), dir.path().join("ptmx")).unwrap();
        // A symlink to the real one is not followed either.
        assert!(open(&fd, 80, 24).is_err());
    }
}
