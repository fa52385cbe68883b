//! Fuzzes the state store protocol's decoder as a server meets it: frames back to back in one
//! buffer, under default and tight limits. Nothing may panic; every frame that decodes must
//! encode to bytes that decode to the same frame; the borrowed batch decoder must agree with
//! the owned one.
//!
//! Run with `cargo +nightly fuzz run proto` from the repository root.

#![no_main]

use flowstate_proto::{decode, decode_batch_into, encode, peek_header, Limits, Request, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fn frames(mut buf: &[u8], limits: &Limits) {
    while let Ok(Some((frame, used))) = decode(buf, limits) {
        assert!(used >= HEADER_LEN && used <= buf.len());
        let mut out = Vec::new();
        encode(&frame, &mut out);
        let (again, n) = decode(&out, &Limits::default())
            .expect("an encoded frame decodes")
            .expect("an encoded frame is whole");
        assert_eq!(n, out.len());
        assert_eq!(again, frame);
        buf = &buf[used..];
    }
    // The borrowed decoder (the server's hot path) on the first frame, whatever its kind.
    if let Ok(Some(h)) = peek_header(buf, limits) {
        if let Some(body) = buf.get(HEADER_LEN..h.total) {
            let mut ops: Vec<Request<&[u8]>> = Vec::new();
            let _ = decode_batch_into(&h, body, limits, &mut ops);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    frames(data, &Limits::default());
    frames(
        data,
        &Limits {
            max_frame: 64,
            max_ops: 2,
        },
    );
});
