//! The little HTTP/1.1 this crate speaks (RFC 9112): a request head is read up to a bound,
//! its request line parsed; the answer always closes the connection.
//!
//! Only what a scraper, `curl` and a browser send is needed: `GET` (and `HEAD`) of a path,
//! no body; of the headers only `Authorization` is read. Anything else is answered with an error status; nothing a peer
//! sends can make the parser panic (property-tested below).

/// The longest request head read (request line and headers, up to the blank line).
pub const MAX_HEAD: usize = 8 * 1024;

/// A parsed request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method (`GET`, `HEAD`, ...), as sent.
    pub method: String,
    /// The path, without the query string (`/metrics`).
    pub path: String,
    /// The query string after `?`, if any (not decoded).
    pub query: Option<String>,
    /// The `Authorization` header's value, if it has one that is visible ASCII.
    pub authorization: Option<String>,
}

impl Request {
    /// The token of an `Authorization: Bearer TOKEN` header (RFC 6750 §2.1; the scheme's case
    /// does not matter, RFC 9110 §11.1).
    pub fn bearer(&self) -> Option<&str> {
        let (scheme, token) = self.authorization.as_deref()?.split_once(' ')?;
        scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim_start_matches(' '))
    }
}

/// Why a request head cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// The head is not complete yet (no blank line): read more.
    Incomplete,
    /// The head is longer than [`MAX_HEAD`] (431).
    TooLarge,
    /// The request line is not `METHOD SP target SP HTTP/1.x` (400).
    Malformed,
    /// An HTTP version other than 1.0 or 1.1 (505).
    Version,
}

impl ParseError {
    /// The status line's code and reason for this error.
    pub fn status(self) -> (u16, &'static str) {
        match self {
            ParseError::Incomplete | ParseError::Malformed => (400, "Bad Request"),
            ParseError::TooLarge => (431, "Request Header Fields Too Large"),
            ParseError::Version => (505, "HTTP Version Not Supported"),
        }
    }
}

/// Where the head ends (just after `\r\n\r\n`, or `\n\n` from a lenient client), if it does.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Parses the request head at the start of `buf` (the bytes read so far).
pub fn parse(buf: &[u8]) -> Result<Request, ParseError> {
    let Some(end) = head_end(buf) else {
        return Err(if buf.len() >= MAX_HEAD {
            ParseError::TooLarge
        } else {
            ParseError::Incomplete
        });
    };
    if end > MAX_HEAD {
        return Err(ParseError::TooLarge);
    }
    let head = &buf[..end];
    let line_end = head
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(ParseError::Malformed)?;
    let line = head[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&head[..line_end]);
    let line = std::str::from_utf8(line).map_err(|_| ParseError::Malformed)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::Malformed);
    };
    // RFC 9110 §9.1: a method is a token.
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(ParseError::Malformed);
    }
    if !version.starts_with("HTTP/") {
        return Err(ParseError::Malformed);
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(ParseError::Version);
    }
    // Origin form only (RFC 9112 §3.2.1): a scraper never sends an absolute URI to us.
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(ParseError::Malformed);
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (target, None),
    };
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        authorization: header(&head[line_end + 1..], b"authorization")?,
    })
}

/// The value of header `name` (lowercase) among the header lines `fields`; the same header
/// twice is malformed (which credentials would count?). A value that is not visible ASCII
/// counts as absent.
fn header(fields: &[u8], name: &[u8]) -> Result<Option<String>, ParseError> {
    let mut found = None;
    for line in fields.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(name) {
            continue;
        }
        if found.is_some() {
            return Err(ParseError::Malformed);
        }
        let value = line[colon + 1..].trim_ascii();
        found = Some(
            std::str::from_utf8(value)
                .ok()
                .filter(|v| v.bytes().all(|b| (b' '..=b'~').contains(&b)))
                .map(str::to_owned),
        );
    }
    Ok(found.flatten())
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// An answer: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Its reason phrase.
    pub reason: &'static str,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
    /// Headers besides those every answer has (`Allow` of a 405, `WWW-Authenticate` of a
    /// 401).
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Response {
    /// A `200 OK`.
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status: 200,
            reason: "OK",
            content_type,
            body: body.into(),
            headers: Vec::new(),
        }
    }

    /// An error status with a one-line plain-text body.
    pub fn error(status: u16, reason: &'static str) -> Self {
        Response {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: format!("{status} {reason}\n").into_bytes(),
            headers: Vec::new(),
        }
    }

    /// An error status whose plain-text body says why (`400 Bad Request: limit: ...`).
    pub fn error_saying(status: u16, reason: &'static str, why: &str) -> Self {
        let mut r = Response::error(status, reason);
        r.body = format!("{status} {reason}: {why}\n").into_bytes();
        r
    }

    /// This answer with header `name: value` added.
    pub fn with_header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The bytes on the wire; `head_only` leaves the body out (a `HEAD` request).
    pub fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        )
        .into_bytes();
        for (name, value) in &self.headers {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_what_curl_and_scrapers_send() {
        let r = parse(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n").unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.path, "/metrics");
        assert_eq!(r.query, None);
        let r = parse(b"HEAD /api/v1/summary?pretty=1 HTTP/1.0\n\n").unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("HEAD", "/api/v1/summary")
        );
        assert_eq!(r.query.as_deref(), Some("pretty=1"));
    }

    #[test]
    fn refuses_what_it_does_not_speak() {
        assert_eq!(
            parse(b"GET /metrics HTTP/1.1\r\n"),
            Err(ParseError::Incomplete)
        );
        assert_eq!(
            parse(b"GET /metrics HTTP/2.0\r\n\r\n"),
            Err(ParseError::Version)
        );
        assert_eq!(parse(b"GET /metrics\r\n\r\n"), Err(ParseError::Malformed));
        assert_eq!(
            parse(b"GET  /metrics HTTP/1.1\r\n\r\n"),
            Err(ParseError::Malformed)
        );
        assert_eq!(
            parse(b"GET http://x/metrics HTTP/1.1\r\n\r\n"),
            Err(ParseError::Malformed)
        );
        assert_eq!(parse(b"G(T / HTTP/1.1\r\n\r\n"), Err(ParseError::Malformed));
        assert_eq!(
            parse(b"\xff / HTTP/1.1\r\n\r\n"),
            Err(ParseError::Malformed)
        );
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD + 10, b'a');
        assert_eq!(parse(&big), Err(ParseError::TooLarge));
        big.extend_from_slice(b"\r\n\r\n");
        assert_eq!(parse(&big), Err(ParseError::TooLarge));
    }

    #[test]
    fn responses_close_and_carry_their_length() {
        let r = Response::ok("application/json", "{}");
        let b = String::from_utf8(r.to_bytes(false)).unwrap();
        assert!(b.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(b.contains("Content-Length: 2\r\n"));
        assert!(b.contains("Connection: close\r\n"));
        assert!(b.ends_with("\r\n\r\n{}"));
        let h = String::from_utf8(r.to_bytes(true)).unwrap();
        assert!(h.ends_with("\r\n\r\n"));
    }

    proptest! {
        #[test]
        fn never_panics_on_any_bytes(buf in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse(&buf);
            let _ = head_end(&buf);
        }

        #[test]
        fn never_panics_on_near_requests(
            method in "[A-Z]{0,8}|[ -~]{0,8}",
            target in "/[ -~]{0,40}|[ -~]{0,20}",
            version in "HTTP/1\\.[01]|HTTP/[0-9]\\.[0-9]|[ -~]{0,9}",
            headers in proptest::collection::vec("[ -~]{0,30}", 0..5),
            crlf in any::<bool>(),
        ) {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut s = format!("{method} {target} {version}{eol}");
            for h in &headers {
                s.push_str(h);
                s.push_str(eol);
            }
            s.push_str(eol);
            let _ = parse(s.as_bytes());
        }

        #[test]
        fn well_formed_requests_round_trip(
            method in "GET|HEAD|POST|DELETE",
            path in "(/[a-z0-9_.-]{1,12}){1,4}",
            query in proptest::option::of("[a-z0-9=&]{1,16}"),
        ) {
            let target = match &query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let s = format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n");
            let r = parse(s.as_bytes()).unwrap();
            prop_assert_eq!(r.method, method);
            prop_assert_eq!(r.path, path);
            prop_assert_eq!(r.query, query);
        }
    }
}
