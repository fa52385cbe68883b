//! What the store's integration tests share: a raw client connection and frame reader.

use flowstate_proto::{self as proto, Frame, Limits};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A client connection to `addr`, reads timing out after 10 s.
pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads one frame; `None` if the server closed the connection.
pub(crate) fn read(s: &mut TcpStream) -> Option<Frame> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((f, _))) = proto::decode(&buf, &Limits::default()) {
            return Some(f);
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
