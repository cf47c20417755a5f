//! What the node's netlink conversations (nf_tables batches, conntrack, sock_diag) share:
//! reading one answer with the socket's receive timeout, and the error code of an
//! `NLMSG_ERROR` message.

use std::io;

use netlink_sys::Socket;

/// Reads one datagram into `buf`; `what` names the conversation in the error when the
/// kernel does not answer within the socket's receive timeout (`within_s` seconds).
pub(crate) fn recv(
    socket: &Socket,
    buf: &mut [u8],
    what: &str,
    within_s: u64,
) -> io::Result<usize> {
    loop {
        match socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => return Ok(n.min(buf.len())),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no answer from the kernel within {within_s} s"),
                ));
            }
            Err(e) => return Err(e),
        }
    }
}

/// The (negative) error code an `NLMSG_ERROR` message's payload starts with; 0 is an ack.
pub(crate) fn error_code(payload: &[u8]) -> i32 {
    i32::from_ne_bytes(
        payload
            .get(..4)
            .and_then(|c| c.try_into().ok())
            .unwrap_or([0; 4]),
    )
}
