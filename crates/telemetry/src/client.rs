//! A small blocking HTTP/1.1 `GET` for this crate's own listener: what `flowstate top` and the
//! tests use to read `/api/v1/...` and `/metrics` without an HTTP library.
//!
//! Promises:
//! * Every call ends within its timeout (connecting, writing and reading each get what is left
//!   of it) and reads at most [`MAX_BODY`] bytes.
//! * It speaks to servers that answer with a `Content-Length` or close the connection after
//!   the body, as [`crate::Server`] always does; a chunked answer is an error, never a
//!   misread body.
//! * Nothing a server sends makes it panic: a malformed answer is an
//!   [`std::io::ErrorKind::InvalidData`] error.

use crate::Token;
use std::io::{Error, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The largest answer read (head and body).
pub const MAX_BODY: usize = 64 << 20;

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The body, as sent.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `GET path` from `addr`; any status is a [`Reply`], a failure to connect, send or read (or
/// the timeout passing) an error.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<Reply> {
    get_with(addr, path, timeout, None)
}

/// [`get`], presenting `token` (`Authorization: Bearer`) when there is one.
pub fn get_with(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> std::io::Result<Reply> {
    call(addr, "GET", path, timeout, token)
}

/// `POST path` (no body) to `addr`, presenting `token` when there is one: an action such as a
/// live box's `/api/v1/reload`; any status is a [`Reply`].
pub fn post_with(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> std::io::Result<Reply> {
    call(addr, "POST", path, timeout, token)
}

fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> std::io::Result<Reply> {
    let deadline = Instant::now() + timeout;
    let left = || {
        let d = deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err(Error::new(ErrorKind::TimedOut, "timed out"))
        } else {
            Ok(d)
        }
    };
    let mut conn = TcpStream::connect_timeout(&addr, left()?)?;
    conn.set_write_timeout(Some(left()?))?;
    request(&mut conn, addr, method, path, "*/*", token)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        conn.set_read_timeout(Some(left()?))?;
        match conn.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.len() > MAX_BODY {
                    return Err(invalid("the answer is too large"));
                }
                if let Some(whole) = complete(&buf)? {
                    buf.truncate(whole);
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                return Err(Error::new(ErrorKind::TimedOut, "timed out"))
            }
            Err(e) => return Err(e),
        }
    }
    parse(&buf)
}

/// The longest line [`stream`] reads.
pub const MAX_LINE: usize = 64 * 1024;

/// `GET path` of a live stream from `addr` (connecting and reading the head within
/// `timeout`): its lines as they come, for as long as the server sends them. An answer other
/// than `200` is an error saying the status and body.
pub fn stream(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    token: Option<&Token>,
) -> std::io::Result<Lines> {
    let mut conn = TcpStream::connect_timeout(&addr, timeout)?;
    conn.set_write_timeout(Some(timeout))?;
    conn.set_read_timeout(Some(timeout))?;
    request(&mut conn, addr, "GET", path, "application/x-ndjson", token)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while crate::http::head_end(&head).is_none() {
        if conn.read(&mut byte)? == 0 || head.len() > crate::http::MAX_HEAD {
            return Err(invalid("no answer head"));
        }
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head);
    if status.split_whitespace().nth(1) != Some("200") {
        let mut rest = Vec::new();
        let _ = conn.take(MAX_LINE as u64).read_to_end(&mut rest);
        let line = status.lines().next().unwrap_or_default().to_owned();
        return Err(Error::other(format!(
            "{line}: {}",
            String::from_utf8_lossy(&rest).trim()
        )));
    }
    conn.set_read_timeout(None)?;
    Ok(Lines(std::io::BufReader::new(conn)))
}

/// The lines of a stream ([`stream`]); ends when the server closes.
#[derive(Debug)]
pub struct Lines(std::io::BufReader<TcpStream>);

impl Iterator for Lines {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::io::BufRead;
        let mut line = String::new();
        match (&mut self.0).take(MAX_LINE as u64).read_line(&mut line) {
            Ok(0) => None,
            Ok(_) if !line.ends_with('\n') && line.len() >= MAX_LINE => {
                Some(Err(invalid("a line longer than 64 KiB")))
            }
            Ok(_) => Some(Ok(line.trim_end().to_owned())),
            Err(e) => Some(Err(e)),
        }
    }
}

/// Writes the request `METHOD path` accepting `accept`, presenting `token` when there is one.
fn request(
    conn: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    accept: &str,
    token: Option<&Token>,
) -> std::io::Result<()> {
    let authorization = token
        .map(|t| format!("Authorization: {}\r\n", t.authorization()))
        .unwrap_or_default();
    let length = if method == "POST" {
        "Content-Length: 0\r\n"
    } else {
        ""
    };
    conn.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: flowstate\r\nAccept: {accept}\r\n{authorization}{length}Connection: close\r\n\r\n")
            .as_bytes(),
    )
}

fn invalid(what: &str) -> Error {
    Error::new(ErrorKind::InvalidData, what.to_owned())
}

/// Where the answer in `buf` ends, once its head has been read and it has a `Content-Length`
/// whose bytes have all arrived.
fn complete(buf: &[u8]) -> std::io::Result<Option<usize>> {
    let Some(end) = crate::http::head_end(buf) else {
        return Ok(None);
    };
    Ok(content_length(&buf[..end])?
        .map(|n| end.saturating_add(n))
        .filter(|&whole| buf.len() >= whole))
}

/// The `Content-Length` of a head, if it has one; a chunked answer is refused.
fn content_length(head: &[u8]) -> std::io::Result<Option<usize>> {
    let head = String::from_utf8_lossy(head);
    let mut length = None;
    for line in head.lines().skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("a chunked answer (not spoken here)"));
        }
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse().map_err(|_| invalid("a bad Content-Length"))?);
        }
    }
    Ok(length)
}

/// Parses a whole answer: `HTTP/1.x CODE ...`, headers, body.
fn parse(buf: &[u8]) -> std::io::Result<Reply> {
    let end = crate::http::head_end(buf).ok_or_else(|| invalid("the answer has no head"))?;
    let line = buf[..end].split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|c| c.parse::<u16>().ok());
    let (true, Some(status)) = (version.starts_with("HTTP/1."), status) else {
        return Err(invalid("not an HTTP/1.x status line"));
    };
    let body = &buf[end..];
    if let Some(n) = content_length(&buf[..end])? {
        if body.len() < n {
            return Err(invalid("the answer is shorter than its Content-Length"));
        }
        return Ok(Reply {
            status,
            body: body[..n].to_vec(),
        });
    }
    Ok(Reply {
        status,
        body: body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::TcpListener;

    /// A server that reads one request and sends `answer`.
    fn serve_once(answer: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut b = [0u8; 1024];
            let _ = c.read(&mut b);
            let _ = c.write_all(answer);
        });
        addr
    }

    #[test]
    fn reads_answers_with_and_without_a_length() {
        let t = Duration::from_secs(5);
        let a = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
        assert_eq!(
            get(a, "/x", t).unwrap(),
            Reply {
                status: 200,
                body: b"{}".to_vec()
            }
        );
        let a = serve_once(b"HTTP/1.0 404 Not Found\r\n\r\nno");
        let r = get(a, "/x", t).unwrap();
        assert_eq!((r.status, r.text().as_str()), (404, "no"));
        for bad in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
        ] {
            let a = serve_once(bad);
            let e = get(a, "/x", t).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        }
    }

    #[test]
    fn a_silent_server_is_a_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = get(l.local_addr().unwrap(), "/", Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    }

    #[test]
    fn talks_to_the_server() {
        struct P;
        impl crate::Provider for P {
            fn metrics(&self, _: &mut crate::Metrics) {}
            fn api(&self, _: &str) -> Option<String> {
                None
            }
        }
        let server =
            crate::Server::start("127.0.0.1:0".parse().unwrap(), std::sync::Arc::new(P)).unwrap();
        let r = get(server.local_addr(), "/healthz", Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "ok\n"));
        server.stop();
        let token = crate::Token::new("t0ken").unwrap();
        let options = crate::Options {
            token: Some(token.clone()),
            ..crate::Options::default()
        };
        let server = crate::Server::start_with(
            "127.0.0.1:0".parse().unwrap(),
            std::sync::Arc::new(P),
            options,
        )
        .unwrap();
        let (a, t) = (server.local_addr(), Duration::from_secs(5));
        assert_eq!(get(a, "/metrics", t).unwrap().status, 401);
        assert_eq!(
            get_with(a, "/metrics", t, Some(&token)).unwrap().status,
            200
        );
        server.stop();
    }

    proptest! {
        #[test]
        fn never_panics_on_any_answer(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&buf);
            let _ = complete(&buf);
        }
    }
}
